"""Estimate, from shapes alone, the most tensor bytes alive at once while a joint trace runs.

Used to compare rewrites of one trace (which backward checkpoints give the lowest peak), not to
predict an allocator: it walks the joint forward+backward trace in order, allocates each op's
tensor outputs, frees a tensor after the last op that reads it, and counts views as sharing their
base's storage (``thunder_remat.storage``: a reshape is a view when the input's strides allow
it, as in PyTorch), which then lives until the last read of any of its views. Forward inputs and
parameters are held anyway and not counted. The forward/backward split keeps exactly the forward
values the backward reads, which the walk keeps alive the same way.
"""

from __future__ import annotations

from thunder_remat.trace_facts import forward_storages
from thunder_remat.whole_graph.rewrite import CopySchedule
from thunder_remat.storage import StorageMap

__all__ = ["estimate_peak_bytes", "estimate_schedule_peak"]


def estimate_peak_bytes(trace) -> int:
    """The estimated peak of live tensor bytes (inputs excluded) over a joint trace."""
    return estimate_schedule_peak(CopySchedule(trace))


def estimate_schedule_peak(schedule: CopySchedule, storages: StorageMap | None = None) -> int:
    """The estimated step peak of the trace a schedule would build, without building it.

    ``storages``: those of the schedule's (unrewritten) trace, forward and backward, when already
    known (the schedules of one trace share them). A copy owns new storage like the op it copies,
    unless the op's output is a view of one of its inputs: then the copy is a view of what that
    input is read from (a copy, or the forward's value); a backward op's view of an input it now
    reads from a copy is a view of that copy.
    """
    trace = schedule.trace
    if storages is None:
        storages = forward_storages(trace, with_backward=True)
    owner, sizes, held = storages.owner, storages.owner_bytes, storages.held
    names = schedule.trace_names()
    tensor_reads, tensor_outs = names.tensor_reads, names.tensor_outs

    born: dict = {}  # storage -> step that allocates it
    last_read: dict = {}  # storage -> last step reading a tensor on it
    size: dict = {}
    step = 0
    copy_owner: dict = {}  # (copy number, output name) -> its storage
    current: dict = {}  # value -> its storage, where a view now views a copy

    def run(position: int, sources: dict, copy: int | None) -> None:
        """One step: the bound symbol at ``position`` reading ``sources`` (input name -> copy
        number) instead of the forward's values; ``copy``: the number of the copy this step
        makes, or None."""
        reads = tensor_reads[position]
        now = {}
        for name in reads:
            k = sources.get(name)
            now[name] = copy_owner[(k, name)] if k is not None else current.get(name) or owner.get(name, name)
            if now[name] not in held:
                last_read[now[name]] = step
        for name in tensor_outs[position]:
            original = owner.get(name, name)
            viewed = next((a for a in reads if owner.get(a, a) == original), None)
            if viewed is not None:
                storage = now[viewed]
            elif copy is not None:
                storage = (copy, original)
                size[storage] = sizes.get(original, 0)
            else:
                storage = original
                size[storage] = sizes.get(original, 0)
            if copy is not None:
                copy_owner[(copy, name)] = storage
            elif storage != original:
                current[name] = storage
            if storage not in held and storage not in born:
                born[storage] = step
                last_read.setdefault(storage, step)

    for position in range(len(trace.bound_symbols)):
        for k in schedule.before.get(position, ()):
            i, inputs = schedule.copies[k]
            run(i, inputs, k)
            step += 1
        run(position, schedule.reads.get(position, {}), None)
        step += 1
    change = [0] * (step + 1)
    for storage, at in born.items():
        change[at] += size.get(storage, sizes.get(storage, 0))
    frees: dict[int, int] = {}
    for storage, at in last_read.items():
        if storage in born:
            frees[at] = frees.get(at, 0) + size.get(storage, sizes.get(storage, 0))
    live = peak = 0
    for at in range(step):
        live += change[at]
        peak = max(peak, live)
        live -= frees.get(at, 0)
    return peak
