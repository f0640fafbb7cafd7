"""The peak of memory a call allocates, as the device's allocator saw it: every allocation and
free, compiled code and ops' own workspaces included (on CPU the profiler's memory events, on CUDA
the caching allocator's statistics). ``inspect.measure`` offers it to users; the storage walk uses
it to measure library kernels' workspaces (``kernel_workspace``). Plain torch, no Thunder.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

__all__ = ["AllocatorPeak", "allocator_step_peak", "LiveAllocation", "allocations_live_at_peak",
           "CPU_PROFILER_METHOD", "CUDA_METHOD"]


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
