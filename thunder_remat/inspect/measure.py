"""Measuring memory in real runs.

* what a forward saves for backward (``torch.autograd.graph.saved_tensors_hooks``), in storage
  bytes;
* the peak of memory a training step allocates, at the allocator (``allocator_step_peak``): every
  allocation and free, compiled code (torch.compile/Inductor regions) and ops' own workspaces
  included; on CPU from the profiler's memory events, on CUDA from the caching allocator's
  statistics. This is the number that decides whether a step fits. On CPU
  ``allocations_live_at_peak`` also says which blocks make it, and inside which ops they were
  allocated;
* the peak of tensor memory returned by the ops of a step (``step_peak_memory``, a
  ``TorchDispatchMode`` that follows every tensor an op returns until it is freed), on any device,
  CPU included. It does not see inside compiled regions.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from thunder_remat.allocator import (CPU_PROFILER_METHOD, CUDA_METHOD, AllocatorPeak, LiveAllocation,
                                     allocations_live_at_peak, allocator_step_peak)

__all__ = ["SavedTensors", "saved_for_backward", "StepMemory", "step_peak_memory", "AllocatorPeak",
           "allocator_step_peak", "LiveAllocation", "allocations_live_at_peak", "CPU_PROFILER_METHOD", "CUDA_METHOD"]


@dataclass(frozen=True)
class SavedTensors:
    """What autograd kept for backward, in storages: a saved view holds its whole base.

    ``count`` is the number of distinct tensors saved; ``nbytes`` the bytes of the distinct
    storages they keep alive. ``activation_count``/``activation_bytes`` leave out storages shared
    with the call's arguments or the module's parameters and buffers, which are held in memory
    whether or not they are saved.
    """

    count: int
    nbytes: int
    activation_count: int = 0
    activation_bytes: int = 0


def _storages(tensors) -> set[int]:
    """Storage addresses of the tensors among ``tensors`` (views share their base's)."""
    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)}


def _held_storages(fn, args, kwargs) -> set[int]:
    tensors = [*args, *kwargs.values()]
    for source in ("parameters", "buffers"):
        get = getattr(fn, source, None)
        if callable(get):
            tensors.extend(get())
    return _storages(tensors)


def saved_for_backward(fn, *args, held=(), **kwargs) -> tuple[object, SavedTensors]:
    """Run ``fn`` and report the distinct tensors autograd kept for backward and their storages.

    The call's arguments and ``fn``'s parameters and buffers (when it has them) are held anyway;
    ``held`` adds tensors that are too (a model's parameters when ``fn`` is a wrapper such as a
    ``thunderfx`` result).
    """
    tensors: set[tuple] = set()
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor):
        if isinstance(t, FakeTensor):  # Thunder tracing an op by running it on fake tensors
            return t
        storage = t.untyped_storage()
        tensors.add((storage.data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype))
        storages.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args, **kwargs)
    held = _held_storages(fn, args, kwargs) | _storages(held)
    activations = [n for ptr, n in storages.items() if ptr not in held]
    return out, SavedTensors(len(tensors), sum(storages.values()), len(activations), sum(activations))


@dataclass(frozen=True)
class StepMemory:
    """Tensor bytes allocated by the ops of one step: the most alive at once, and still alive after."""

    peak_bytes: int
    end_bytes: int


class _LiveTensorBytes(TorchDispatchMode):
    """Counts each storage an op returns once, from the op until the last tensor on it is freed.

    Storages of ``held`` tensors (parameters, inputs, existing gradients) and views of them are
    not counted: they exist before the step and after it.
    """

    def __init__(self, held) -> None:
        super().__init__()
        self.held = _storages(held)
        self.live: dict[tuple, list] = {}
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t)
        self.peak = max(self.peak, self.now)
        return out

    def _track(self, t: torch.Tensor) -> None:
        if t.is_meta or isinstance(t, FakeTensor):  # Thunder runs some ops on meta/fake tensors: no memory
            return
        storage = t.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0 or ptr in self.held:
            return
        key = (t.device, ptr)
        entry = self.live.get(key)
        if entry is None:
            entry = self.live[key] = [nbytes, 0]
            self.now += nbytes
        entry[1] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key) -> None:
        entry = self.live.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] == 0:
                self.now -= entry[0]
                del self.live[key]


def step_peak_memory(step, held=()) -> StepMemory:
    """Run ``step()`` and report the peak of tensor bytes its ops had allocated at one time.

    Pass the tensors that outlive the step (parameters, their gradients, the batch) as ``held``
    so that views of them are not counted. Unlike a device allocator's statistics this counts
    tensor storage only (no allocator caching or fragmentation) and works on CPU. It sees what
    runs op by op through the dispatcher, and only the tensors ops return: not an op's internal
    workspace, not the scalar tensors wrapped around Python numbers. It does NOT see inside
    compiled regions: torch.compile'd code (Thunder's torch.compile executor, Inductor) allocates
    its buffers below the dispatcher, and a fused region keeps its intermediates alive as locals
    until it returns. Measure a step with a fusion executor with ``allocator_step_peak``; this
    measure suits Thunder's torch executor (``executors=[]``), where it sees every value a trace
    names.
    """
    mode = _LiveTensorBytes(held)
    with mode:
        step()
    return StepMemory(mode.peak, mode.now)
