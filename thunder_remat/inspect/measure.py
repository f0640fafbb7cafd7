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

import warnings
import weakref
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["SavedTensors", "saved_for_backward", "StepMemory", "step_peak_memory", "AllocatorPeak",
           "allocator_step_peak", "LiveAllocation", "allocations_live_at_peak"]


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


@dataclass(frozen=True)
class AllocatorPeak:
    """The memory one step allocated, as the device's allocator saw it.

    ``peak_bytes``: the most bytes allocated at once during the step above what was allocated
    when it began; ``end_bytes``: the bytes it left allocated when it returned, above the start
    (gradients it created, for example; negative if it freed more than it allocated);
    ``start_bytes``: the bytes allocated when it began, where the allocator counts them (CUDA);
    None on CPU, whose allocator only counts while the profiler records. ``device``: the device
    measured; ``method``: how.
    """

    peak_bytes: int
    end_bytes: int
    start_bytes: int | None
    device: str
    method: str


CPU_PROFILER_METHOD = "torch.profiler memory events (c10 CPU allocator running total)"
CUDA_METHOD = "torch.cuda.max_memory_allocated - memory_allocated at start"

#: size of the marker allocations that fix the CPU allocator's level at the step's start and end
_MARKER_BYTES = 1


def allocator_step_peak(step, device="cpu") -> AllocatorPeak:
    """Run ``step()`` once and return the peak of memory it allocated on ``device``, above the start.

    Sees every allocation and free on ``device`` while ``step`` runs: tensors ops return, ops'
    internal workspaces, wrapped Python scalars, and the buffers of compiled code (Inductor's
    kernels, Thunder's fusion regions). Whatever exists before the step (parameters, the batch,
    gradients from an earlier step) is the baseline and not counted; set gradients to None
    before the step (``model.zero_grad(set_to_none=True)``) to count the step's own.

    CUDA: ``torch.cuda.reset_peak_memory_stats``, then ``max_memory_allocated`` minus the
    ``memory_allocated`` at the start, synchronized before and after; bytes as the caching
    allocator counts them (blocks rounded up to 512 B), cached but free blocks not included.

    CPU: one ``torch.profiler.profile(activities=[CPU], profile_memory=True)`` around the step.
    Each allocation and free through c10's CPU allocator is a memory event carrying its size and
    ``total_allocated``, the allocator's running total of live bytes right after it, updated and
    read under one lock: the largest ``total_allocated`` over the step's events is the exact
    peak of the sum, whatever order the events' timestamps put threads' events in. The running
    total's origin is arbitrary (it only moves while a profiler records, so it drifts between
    sessions), so the step is framed by two 1-byte marker tensors, allocated on this thread just
    before and just after it and both alive until the profile ends: the first marker's
    ``total_allocated`` fixes the start level, the second's the end level, and the step's events
    are those between them in time (the calling thread is inside ``step`` then). Not seen: memory
    allocated outside c10's allocator (a compiled kernel's C++ stack or ``std::vector`` scratch,
    oneDNN's internal caches), allocations on threads that do not carry the profiler's state
    (at::parallel_for and autograd's CPU work do carry it), and frees of blocks allocated before
    any profiler recorded (the allocator does not know their size: the profiler warns "Memory
    block of unknown size ..."), which makes the count an upper bound in that case.
    """
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_step_peak(step, device)
    if device.type != "cpu":
        raise ValueError(f"allocator_step_peak measures cpu and cuda devices, got {device}")
    return _cpu_step(step)[0]


@dataclass(frozen=True)
class LiveAllocation:
    """One block of memory alive at a step's peak: its size, when it was allocated (its index
    among the step's allocator events), the profiler ranges around the allocation, outermost
    first (a Thunder backward, a compiled region's call, the aten op), and its address (a
    tensor's ``untyped_storage().data_ptr()`` when the tensor owns the block)."""

    nbytes: int
    order: int
    ranges: tuple[str, ...]
    address: int


def allocations_live_at_peak(step) -> tuple[AllocatorPeak, list[LiveAllocation]]:
    """Run ``step()`` once on CPU and return its ``AllocatorPeak`` and the blocks alive at that peak,
    in the order they were allocated. Their sizes add up to ``peak_bytes`` plus whatever the step
    had freed by then of memory allocated before it.

    What makes a peak: match these to the values of a trace or the buffers of Inductor's generated
    code (``TORCH_LOGS=output_code``); tell parameter gradients apart by their storages. CPU only
    (on CUDA, ``torch.cuda.memory._record_memory_history`` records the same)."""
    return _cpu_step(step, ranges=True)


def _cpu_step(step, ranges: bool = False) -> tuple[AllocatorPeak, list[LiveAllocation]]:
    """One profiled run of ``step`` (see ``allocator_step_peak``); with ``ranges``, the blocks
    alive at its peak too."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            first = torch.empty(_MARKER_BYTES, dtype=torch.uint8)
            step()
            last = torch.empty(_MARKER_BYTES, dtype=torch.uint8)
            markers = (first.data_ptr(), last.data_ptr())
            del first, last
    events = sorted(_cpu_allocation_events(prof), key=lambda e: e[0])
    start = _marker_index(events, markers[0], 0)
    end = _marker_index(events, markers[1], start + 1)
    base = events[start][2] - _MARKER_BYTES  # the allocator's level just before the step
    at = max(range(start, end), key=lambda i: events[i][2])
    peak = events[at][2] - _MARKER_BYTES - base
    end_bytes = events[end][2] - 2 * _MARKER_BYTES - base
    result = AllocatorPeak(peak, end_bytes, None, "cpu", CPU_PROFILER_METHOD)
    if not ranges:
        return result, []
    live: dict[int, LiveAllocation] = {}
    for i in range(start + 1, at + 1):
        _, nbytes, _, address, around = events[i]
        if nbytes > 0:
            live[address] = LiveAllocation(nbytes, i - start - 1, around, address)
        else:
            live.pop(address, None)
    return result, sorted(live.values(), key=lambda a: a.order)


def _cpu_allocation_events(prof) -> list[tuple[int, int, int, int, tuple[str, ...]]]:
    """(time ns, bytes, allocator total after, address, enclosing ranges outermost first) of every
    CPU allocation and free recorded."""
    from torch._C._profiler import _EventType

    out = []
    stack = [(node, ()) for node in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        node, around = stack.pop()
        if node.tag == _EventType.Allocation:
            fields = node.extra_fields
            if fields.device.type == "cpu":
                out.append((node.start_time_ns, fields.alloc_size, fields.total_allocated, fields.ptr, around))
        else:
            stack.extend((child, (*around, node.name)) for child in node.children)
    return out


def _marker_index(events, ptr: int, after: int) -> int:
    for i in range(after, len(events)):
        _, nbytes, _, address, _ = events[i]
        if address == ptr and nbytes == _MARKER_BYTES:
            return i
    raise RuntimeError("the profiler recorded no allocation of the step's marker tensor; is another "
                       "profiler running, or memory profiling unsupported here?")


def _cuda_step_peak(step, device) -> AllocatorPeak:
    import torch

    torch.cuda.synchronize(device)
    start = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - start
    end = torch.cuda.memory_allocated(device) - start
    return AllocatorPeak(peak, end, start, str(device), CUDA_METHOD)
