"""Measuring what a real forward saves for backward, with ``torch.autograd.graph.saved_tensors_hooks``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SavedTensors", "saved_for_backward"]


@dataclass(frozen=True)
class SavedTensors:
    """Distinct tensors autograd kept for backward.

    ``count``/``nbytes`` cover everything saved; ``activation_count``/``activation_bytes`` leave
    out tensors that share storage with the call's arguments or the module's parameters and
    buffers, which are held in memory whether or not they are saved.
    """

    count: int
    nbytes: int
    activation_count: int = 0
    activation_bytes: int = 0


def _held_storages(fn, args, kwargs) -> set[int]:
    held = set()
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    for source in ("parameters", "buffers"):
        get = getattr(fn, source, None)
        if callable(get):
            tensors.extend(get())
    for t in tensors:
        held.add(t.untyped_storage().data_ptr())
    return held


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
    held = _held_storages(fn, args, kwargs)
    activations = [n for key, n in seen.items() if key[0] not in held]
    return out, SavedTensors(len(seen), sum(seen.values()), len(activations), sum(activations))
