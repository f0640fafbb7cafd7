"""Estimate, from shapes alone, the most tensor bytes alive at once while a joint trace runs.

Used to compare rewrites of one trace (which backward checkpoints give the lowest peak), not to
predict an allocator: it walks the joint forward+backward trace in order, allocates each op's
tensor outputs, frees a tensor after the last op that reads it, and counts views as sharing their
base's storage (``thunder_remat.storage``: a reshape is a view when the input's strides allow
it, as in PyTorch), which then lives until the last read of any of its views. Forward inputs and
parameters are held anyway and not counted. The forward/backward split keeps exactly the forward
values the backward reads, which the walk keeps alive the same way. The forward's outputs are
taken to be consumed by the loss before the backward starts (a caller that keeps the model's
output through the backward holds that much more).
"""

from __future__ import annotations

from thunder.core.pytree import tree_flatten

from thunder_remat.fusion_regions import region_cut_positions
from thunder_remat.trace_facts import forward_storages, is_backward
from thunder_remat.whole_graph.rewrite import CopySchedule
from thunder_remat.storage import StorageMap

__all__ = ["estimate_peak_bytes", "estimate_schedule_peak", "predict_regions"]


def estimate_peak_bytes(trace, regions: tuple[int, ...] | None = None) -> int:
    """The estimated peak of live tensor bytes (inputs excluded) over a joint trace."""
    return estimate_schedule_peak(CopySchedule(trace), regions=regions)


def predict_regions(trace, fusible, split: bool = True, keeps_apart=None) -> tuple[int, ...]:
    """Per position of a joint trace, the backward fusion region its bound symbol is expected to
    run in (-1: none): each run of consecutive backward bound symbols that ``fusible`` (a fusion
    executor's ``can_fuse``) accepts, cut where ``pairs.split`` will cut it (``split``; the rule is
    ``solvers.region_cuts``). Thunder fuses the joint trace after thunder_remat's rewrite; a copy
    the rewrite places before a backward reader runs in that reader's region. ``keeps_apart(bsym)``:
    the executor that fuses ``bsym`` cuts between ops computing the same value
    (``FusionAdapter.merges_same_computations``; None: none does)."""
    bsyms = trace.bound_symbols
    runs: list[list[int]] = []
    previous = False
    for position, bsym in enumerate(bsyms):
        fused = is_backward(bsym) and bool(fusible(bsym))
        if fused and not previous:
            runs.append([])
        if fused:
            runs[-1].append(position)
        previous = fused
    regions = [-1] * len(bsyms)
    region = -1
    held = {p.name for p in tree_flatten((trace.args, trace.kwargs))[0] if hasattr(p, "name")}
    last_read: dict[str, int] = {}  # name -> the last position reading it (one walk for every run)
    if split:
        for position, bsym in enumerate(bsyms):
            for p in bsym.flat_proxy_args:
                last_read[p.name] = position
    for run in runs:
        keep_apart = keeps_apart is not None and bool(keeps_apart(bsyms[run[0]]))
        cuts = set(_cuts(bsyms, run, held, last_read, keep_apart)) if split else set()
        region += 1
        for k, position in enumerate(run):
            regions[position] = region
            if k in cuts:
                region += 1
    return tuple(regions)


def _cuts(bsyms, run: list[int], held: set[str], last_read: dict[str, int], keep_apart: bool) -> list[int]:
    """Where ``pairs.split`` would cut a region made of the bound symbols at ``run``."""
    body = [bsyms[i] for i in run]
    made = {p.name for bsym in body for p in bsym.flat_proxy_outs}
    inputs = {p.name: p for bsym in body for p in bsym.flat_proxy_args if p.name not in made}
    after = {n for n in made if last_read.get(n, -1) > run[-1]}  # read after the region: its outputs
    return region_cut_positions(body, list(inputs.values()), after, held, keep_apart)


def estimate_schedule_peak(schedule: CopySchedule, storages: StorageMap | None = None,
                           regions: tuple[int, ...] | None = None, detail: bool = False):
    """The estimated step peak of the trace a schedule would build, without building it.

    ``storages``: those of the schedule's (unrewritten) trace, forward and backward, when already
    known (the schedules of one trace share them). A copy owns new storage like the op it copies,
    unless the op's output is a view of one of its inputs: then the copy is a view of what that
    input is read from (a copy, or the forward's value); a backward op's view of an input it now
    reads from a copy is a view of that copy.

    ``regions`` (``predict_regions``): the backward fusion regions the executor will form. A region
    is one call that holds its inputs as arguments: what it reads from before it (saved values,
    gradients so far) lives until it returns. Inside a region values are freed at their last use,
    as unfused (measured against torch.compile's CPU regions: docs/whole-graph.md).

    ``detail``: return (peak, the step where it happens, {storage: (step allocated, step of last
    read, bytes)} of the storages alive there) instead of the peak alone.
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

    # The forward's outputs go to the loss, which consumes them before the backward starts: the
    # step's return holds only what the backward returns (the gradients).
    last = len(trace.bound_symbols) - 1
    handed = trace.bound_symbols[last].args[0] if trace.bound_symbols[last].args else None
    to_loss = set()
    if isinstance(handed, dict) and "fw_flat_out" in handed:
        to_loss = {p.name for p in tree_flatten(handed["fw_flat_out"])[0] if hasattr(p, "name")}
    returned = tuple(n for n in tensor_reads[last] if n not in to_loss)
    region_steps: dict[int, list[int]] = {}  # region -> [first step, last step]
    read_in: dict = {}  # storage -> the regions that read it

    def run(position: int, sources: dict, copy: int | None, region: int) -> None:
        """One step: the bound symbol at ``position`` reading ``sources`` (input name -> copy
        number) instead of the forward's values; ``copy``: the number of the copy this step
        makes, or None; ``region``: the fusion region it runs in (-1: none)."""
        reads = tensor_reads[position] if position != last else returned
        now = {}
        for name in reads:
            k = sources.get(name)
            now[name] = copy_owner[(k, name)] if k is not None else current.get(name) or owner.get(name, name)
            if now[name] not in held:
                last_read[now[name]] = step
                if region >= 0:
                    read_in.setdefault(now[name], set()).add(region)
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
        region = regions[position] if regions is not None else -1
        if region >= 0:
            region_steps.setdefault(region, [step, step])
        for k in schedule.before.get(position, ()):
            i, inputs = schedule.copies[k]
            run(i, inputs, k, region)
            step += 1
        run(position, schedule.reads.get(position, {}), None, region)
        step += 1
        if region >= 0:
            region_steps[region][1] = step - 1
    for storage, readers in read_in.items():  # a region holds what it reads from before it
        start = born.get(storage, -1)
        for region in readers:
            first, last = region_steps[region]
            if start < first:
                last_read[storage] = max(last_read[storage], last)
    lifetimes = {storage: (at, last_read[storage], size.get(storage, sizes.get(storage, 0)))
                 for storage, at in born.items()}
    return _peak_of(lifetimes, step)[0] if not detail else _peak_of(lifetimes, step)


def _peak_of(lifetimes: dict, steps: int) -> tuple[int, int, dict]:
    """The most bytes alive at once, the step where that happens and the storages alive there, from
    ``lifetimes`` (storage -> (step it is allocated, step of its last read, bytes))."""
    change = [0] * (steps + 1)
    frees = [0] * (steps + 1)
    for born, dies, nbytes in lifetimes.values():
        change[born] += nbytes
        frees[dies] += nbytes
    live = peak = 0
    peak_step = 0
    for at in range(steps):
        live += change[at]
        if live > peak:
            peak, peak_step = live, at
        live -= frees[at]
    alive = {s: life for s, life in lifetimes.items() if life[0] <= peak_step <= life[1]}
    return peak, peak_step, alive
