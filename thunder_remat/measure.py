"""Measuring what a real forward saves for backward, with ``torch.autograd.graph.saved_tensors_hooks``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SavedTensors", "saved_for_backward"]


@dataclass(frozen=True)
class SavedTensors:
    count: int
    nbytes: int


def saved_for_backward(fn, *args, **kwargs) -> tuple[object, SavedTensors]:
    """Run ``fn`` and report the distinct tensors autograd kept for backward.

    A tensor packed twice (same storage, offset, shape and strides) is counted once.
    """
    seen: dict[tuple, int] = {}

    def pack(t: torch.Tensor):
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        seen.setdefault(key, t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args, **kwargs)
    return out, SavedTensors(len(seen), sum(seen.values()))
