"""Estimate, from shapes alone, the most tensor bytes alive at once while a joint trace runs.

Used to compare rewrites of one trace (which backward checkpoints give the lowest peak), not to
predict an allocator: it walks the joint forward+backward trace in order, allocates each op's
tensor outputs (and, while it runs, the operand copies ``torch.matmul`` makes where strides
allow no batched view: ``StorageMap.workspace_bytes``), frees a tensor after the last op that
reads it, and counts views as sharing their base's storage (``thunder_remat.storage``: a reshape
is a view when the input's strides allow it, as in PyTorch), which then lives until the last
read of any of its views. Forward inputs and
parameters are held anyway and not counted. The forward/backward split keeps exactly the forward
values the backward reads, which the walk keeps alive the same way. The forward's outputs are
taken to be consumed by the loss before the backward starts (a caller that keeps the model's
output through the backward holds that much more).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from thunder.core.proxies import TensorProxy

from thunder_remat.cost import value_bytes
from thunder_remat.fusion_regions import (KernelKind, KernelModel, computation_signature, equal_computations,
                                          kernel_kind, runs_convolution, uncut_convolutions, uses_op)
from thunder_remat.solvers.memory_order import OrderProblem, locality_order, lowest_greedy_order, renumbered
from thunder_remat.solvers.region_cuts import apart_pairs, made_then_written, region_cuts, uncut_from
from thunder_remat.trace_facts import (TagReader, forward_storages, in_place_destination, is_backward, loss_outputs,
                                       trace_names)
from thunder_remat.whole_graph.rewrite import COPY_PREFIX, CopySchedule
from thunder_remat.storage import StorageMap, measured_workspace

__all__ = ["PEAK_KINDS", "PeakBreakdown", "RegionModel", "estimate_peak_bytes",
           "estimate_schedule_peak", "hold_kernel_runs", "inline_pointwise", "peak_breakdown", "predict_regions"]


def estimate_peak_bytes(trace, regions: RegionModel | None = None, prologue=frozenset(),
                        storages: StorageMap | None = None, outputs_late: bool = False) -> int:
    """The estimated peak of live tensor bytes (inputs excluded) over a joint trace; ``prologue``:
    the names its backward makes when it starts (``SavePassResult.prologue``) when it is a rewrite;
    ``storages``: its ``forward_storages(trace, with_backward=True)`` when known (a reordered
    backward has the same); ``outputs_late``: as ``estimate_schedule_peak``."""
    return estimate_schedule_peak(CopySchedule(trace), storages, regions=regions, prologue=prologue,
                                  outputs_late=outputs_late)


#: what the storages alive at the estimated peak are, in the order ``PeakBreakdown`` lists them
PEAK_KINDS = ("saved for backward", "recomputed", "gradients", "backward values", "outputs", "forward values",
              "op workspace", "gradient copies")
#: names the walk gives an op's workspace (``StorageMap.workspace_bytes``), alive while it runs
WORKSPACE_PREFIX = "workspace of "
#: the name the walk gives what autograd's AccumulateGrad copies of the returned gradients
#: (``StorageMap.gradient_copy_bytes``), alive at the step's return
GRADIENT_COPIES = "AccumulateGrad's layout copies"


@dataclass(frozen=True)
class PeakBreakdown:
    """Where the estimated step peak of a (rewritten) joint trace is and what is alive there: the
    answer to "why is the peak this high" that a saved-bytes report cannot give."""

    peak: int
    #: the position of the bound symbol at the peak in the trace, its name, and whether it is a
    #: backward op
    position: int
    op: str
    in_backward: bool
    #: bytes alive at the peak by kind (``PEAK_KINDS``; kinds with none left out): forward values
    #: the backward reads ("saved for backward"), the rewrite's copies ("recomputed", ``rc_`` names),
    #: the gradients the backward returns, its other values (cotangents, partial gradients,
    #: temporaries), the outputs the loss reads; "forward values" where the peak is in the forward;
    #: "op workspace": an unfused matmul's operand copies, a convolution's library workspace,
    #: while the op runs; "gradient copies": autograd's copies of gradients laid out unlike their
    #: parameters, when it stores them after the backward
    by_kind: dict
    #: the largest storages alive there, largest first: (the name that made it, bytes, kind); an
    #: op's workspace (``StorageMap.workspace_bytes``) is named after the op's first output
    largest: tuple

    def where(self) -> str:
        return f"{'backward' if self.in_backward else 'forward'} op {self.position} of the joint trace, {self.op}"

    def kinds(self) -> str:
        return ", ".join(f"{kind} {n:,} B" for kind, n in self.by_kind.items())


def peak_breakdown(trace, regions: RegionModel | None = None, prologue=frozenset(),
                   storages: StorageMap | None = None, top: int = 5) -> PeakBreakdown:
    """The ``PeakBreakdown`` of ``trace`` as ``estimate_peak_bytes`` walks it (the same arguments)."""
    if storages is None:
        storages = forward_storages(trace, with_backward=True)
    peak, position, alive = estimate_schedule_peak(CopySchedule(trace), storages, regions, detail=True,
                                                   prologue=prologue)
    bsyms = trace.bound_symbols
    names = trace_names(trace)
    made_at: dict = {}
    for at, outs in enumerate(names.tensor_outs):
        for name in outs:
            made_at.setdefault(storages.owner.get(name, name), at)
    outputs = loss_outputs(trace)
    gradients = {storages.owner.get(n, n) for n in names.tensor_reads[-1] if n not in outputs}
    outputs = {storages.owner.get(n, n) for n in outputs}
    in_backward = is_backward(bsyms[position])

    def kind(storage) -> str:
        if str(storage).startswith(WORKSPACE_PREFIX):
            return "op workspace"
        if storage == GRADIENT_COPIES:
            return "gradient copies"
        if storage in gradients:
            return "gradients"
        if storage in outputs:
            return "outputs"
        at = made_at.get(storage)
        if at is None or not is_backward(bsyms[at]):
            return "saved for backward" if in_backward else "forward values"
        return "recomputed" if str(storage).startswith(COPY_PREFIX) else "backward values"

    sized = sorted(((str(storage), life[2], kind(storage)) for storage, life in alive.items() if life[2] > 0),
                   key=lambda item: (-item[1], item[0]))
    by_kind = {k: sum(n for _, n, of in sized if of == k) for k in PEAK_KINDS}
    return PeakBreakdown(peak, position, bsyms[position].sym.name, in_backward,
                         {k: n for k, n in by_kind.items() if n}, tuple(sized[:top]))


@dataclass(frozen=True)
class RegionModel:
    """The fusion regions an executor will form from a joint trace and any rewrite of it.

    ``fusible[position]``: the executor fuses the bound symbol there; ``backward[position]``: it
    belongs to the backward. A backward op the executor fuses, or a copy of a forward op it fuses
    (the rewrite places copies in the backward, before their readers), runs in a region;
    consecutive such steps of the rewritten trace form one. ``split``: ``pairs.split`` cuts them,
    by ``solvers.region_cuts`` applied to the rewritten steps (what each reads and makes), as it
    will cut the built regions. So the cuts follow the plan: a value the backward recomputes is
    made inside a region, one it reads from the forward is an input the region holds.
    ``kernels``: how the executor's compiler holds memory inside a region (None: each op frees
    what it last reads, as unfused); with it the forward's fused ops form regions too
    (consecutive ones, never cut: the split cuts backward regions), walked the same way. Then
    ``kinds[position]`` is the ``KernelKind`` the op there
    becomes and ``heavy[position]`` whether it uses one of ``kernels.heavy_on_cpu`` on CPU;
    ``convolution[position]``: the op there runs a convolution; ``uncut_from[position]``: it
    keeps its region uncut (``fusion_regions.uncut_convolutions``; both filled where
    ``kernels.uncut_convolution_regions``: a region holding an ``uncut_from`` op is not cut, or
    with ``kernels.cut_before_gradient_convolutions`` not from the making of the first one's
    operands on).
    ``library[position]``: the op there is fused, on CPU, and a library call whose workspace is
    measured (``storage.measured_workspace``), which the executor's compiler calls as PyTorch does
    (Inductor's extern kernels; its 2-d convolutions on channels-last operands where
    ``kernels.channels_last_convolutions_on_cpu``): the walk holds that workspace at the op's step
    (filled where ``kernels`` is known; in other regions a workspace is not counted).
    ``signatures[position]``: (the op's ``fusion_regions.computation_signature`` if fused, the
    names it reads, (name, bytes) of each tensor it makes), filled where the split keeps same
    computations apart (``kernels.own_order`` and ``kernels.merges_same_computations``): the
    walk's cuts weigh keeping them apart as the split's do, by value as the split sees them.
    """

    fusible: tuple[bool, ...]
    backward: tuple[bool, ...]
    split: bool = True
    kernels: KernelModel | None = None
    kinds: tuple[str, ...] = ()
    heavy: tuple[bool, ...] = ()
    convolution: tuple[bool, ...] = ()
    library: tuple[bool, ...] = ()
    uncut_from: tuple[bool, ...] = ()
    signatures: tuple = ()

    @property
    def forward_regions(self) -> bool:
        """The forward's fused ops form regions too: only where the kernels are modelled (walked
        as unfused ops, a region's pointwise chain would hold every intermediate its kernel never
        writes)."""
        return self.kernels is not None

    @property
    def fuses_any(self) -> bool:
        return any(f and b for f, b in zip(self.fusible, self.backward))

    @property
    def memory_modelled(self) -> bool:
        """The estimate knows how the backward's regions hold memory: there are none, or the
        executor's kernels are modelled and no region runs a convolution (oneDNN's buffers)."""
        return not self.fuses_any or (self.kernels is not None and not any(self.convolution))


def predict_regions(trace, fusible, split: bool = True, kernels: KernelModel | None = None,
                    signatures_of: dict | None = None) -> RegionModel:
    """The ``RegionModel`` of a joint trace: ``fusible`` is the fusion executor's ``can_fuse``
    (Thunder fuses the joint trace after thunder_remat's rewrite); ``kernels``: its adapter's
    ``kernel_model()``. ``signatures_of``: the ``RegionModel.signatures`` entries already read, by
    bound symbol (``id``), filled in place: orders of one trace's bound symbols share them."""
    bsyms = trace.bound_symbols
    fused = tuple(bool(fusible(bsym)) for bsym in bsyms)
    kinds, heavy, convolution, library, uncut_from = (), (), (), (), ()
    if kernels is not None and kernels.uncut_convolution_regions:
        convolution = tuple(f and runs_convolution(bsym) for bsym, f in zip(bsyms, fused))
        if any(convolution):
            uncut_from = tuple(f and c for c, f in zip(uncut_convolutions(bsyms, kernels), fused))
    if kernels is not None:
        tags = TagReader()
        kinds = tuple(kernel_kind(bsym, tags) if f else None for bsym, f in zip(bsyms, fused))
        heavy = tuple(bool(f and kernels.heavy_on_cpu and _on_cpu(bsym) and uses_op(bsym, kernels.heavy_on_cpu))
                      for bsym, f in zip(bsyms, fused))
        library = tuple(bool(f and _on_cpu(bsym) and measured_workspace(bsym)) for bsym, f in zip(bsyms, fused))
    signatures = ()
    if split and kernels is not None and kernels.own_order and kernels.merges_same_computations:
        known = {} if signatures_of is None else signatures_of
        for bsym, f in zip(bsyms, fused):
            if (id(bsym), f) not in known:
                known[id(bsym), f] = (computation_signature(bsym) if f else None,
                                      tuple(p.name for p in bsym.flat_proxy_args),
                                      tuple((p.name, value_bytes(p)) for p in bsym.flat_proxy_outs
                                            if isinstance(p, TensorProxy)))
        signatures = tuple(known[id(bsym), f] for bsym, f in zip(bsyms, fused))
    return RegionModel(fused, tuple(is_backward(bsym) for bsym in bsyms), split, kernels, kinds, heavy, convolution,
                       library, uncut_from, signatures)


def estimate_schedule_peak(schedule: CopySchedule, storages: StorageMap | None = None,
                           regions: RegionModel | None = None, detail: bool = False, prologue=frozenset(),
                           outputs_late: bool = False):
    """The estimated step peak of the trace a schedule would build, without building it.

    ``storages``: those of the schedule's (unrewritten) trace, forward and backward, when already
    known (the schedules of one trace share them). A copy owns new storage like the op it copies,
    unless the op's output is a view of one of its inputs: then the copy is a view of what that
    input is read from (a copy, or the forward's value); a backward op's view of an input it now
    reads from a copy is a view of that copy.

    ``regions`` (``predict_regions``): the backward fusion regions the executor will form from the
    rewritten trace, cut as ``pairs.split`` will cut them, and the forward's where
    ``regions.kernels`` is known (``RegionModel``). A region is one call that holds its
    inputs as arguments: what it reads from before it (saved values, gradients so far) lives until
    it returns. Inside a region its ops run in order (``remat_keep_plan_order``) and values are
    freed at their last use, as unfused, unless ``regions.kernels`` models the executor's kernels
    (``inline_pointwise``, ``hold_kernel_runs``; measured against torch.compile's CPU regions:
    docs/whole-graph.md); a
    region the compiler orders itself (``KernelModel.orders_convolution_regions``) runs in the
    order it would choose (``_compiler_order``).

    The backward's prologue (the copies ``schedule.prologue`` counts, or the trace's ops making the
    names ``prologue``) ends a region, as ``pairs.split`` cuts it.

    ``detail``: return (peak, the step where it happens, {storage: (step allocated, step of last
    read, bytes)} of the storages alive there) instead of the peak alone.

    ``outputs_late``: a region left whole that runs a convolution (a forward region too) makes
    what none of its own ops reads (its outputs: weight gradients, mostly) at its end, not where
    the trace puts it.
    The compiler orders such a region itself and may run those ops after its convolutions
    (Inductor did on the zoo ConvNeXt); this is the lowest such a region may hold, for comparing
    it with cutting the region (``whole_graph.run.convolution_cuts``), not the estimate.
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

    # the step's return holds only what the backward returns (the gradients)
    last = len(trace.bound_symbols) - 1
    to_loss = loss_outputs(trace)
    returned = tuple(n for n in tensor_reads[last] if n not in to_loss)
    bsyms = trace.bound_symbols
    gradient_copies = storages.gradient_copy_bytes(bsyms[last])
    step_reads: list[list] = []  # per step: the storages it reads (not held ones)
    step_makes: list[list] = []  # per step: the storages it allocates
    step_outs: list[list] = []  # per step: the storages its outputs are on (views included)
    step_writes: list = []  # per step: the storage it writes in place, or None
    step_fused: list[bool] = []  # per step: it runs in a fusion region the walk models
    step_backward: list[bool] = []  # per step: it belongs to the backward (a copy does)
    step_position: list[int] = []  # per step: the position of the bound symbol it runs
    step_same: list = []  # per step: what makes it the same computation as another (``equal_computations``)
    signatures = regions.signatures if regions is not None else ()

    def run(position: int, sources: dict, copy: int | None, fused: bool) -> None:
        """One step: the bound symbol at ``position`` reading ``sources`` (input name -> copy
        number) instead of the forward's values; ``copy``: the number of the copy this step
        makes, or None; ``fused``: it runs in a fusion region the walk models."""
        reads = tensor_reads[position] if position != last else returned
        now = {}
        first_read_of = {}  # the forward's storage -> the first input read on it
        read_now, made_now, out_now = [], [], []
        for name in reads:
            k = sources.get(name)
            first_read_of.setdefault(owner.get(name, name), name)
            now[name] = copy_owner[(k, name)] if k is not None else current.get(name) or owner.get(name, name)
            if now[name] not in held:
                last_read[now[name]] = step
                read_now.append(now[name])
        for name in tensor_outs[position]:
            original = owner.get(name, name)
            viewed = first_read_of.get(original)
            if viewed is not None:
                storage = now[viewed]
            elif copy is not None:
                storage = (copy, original)
                size[storage] = sizes.get(original, 0)
            else:
                storage = original
                size[storage] = sizes.get(original, 0)
            out_now.append(storage)
            if copy is not None:
                copy_owner[(copy, name)] = storage
            elif storage != original:
                current[name] = storage
            if storage not in held and storage not in born:
                born[storage] = step
                last_read.setdefault(storage, step)
                made_now.append(storage)
        workspace = (storages.workspace_bytes(bsyms[position]) if not fused
                     else storages.workspace_bytes(bsyms[position], channels_last) if library[position]
                     else 0)
        if workspace:  # copies the op makes and frees inside itself, alive with its outputs
            storage = f"{WORKSPACE_PREFIX}{(tensor_outs[position] or ('?',))[0]} (step {step})"
            born[storage], last_read[storage], size[storage] = step, step, workspace
        if position == last and gradient_copies:
            born[GRADIENT_COPIES], last_read[GRADIENT_COPIES], size[GRADIENT_COPIES] = step, step, gradient_copies
        destination = in_place_destination(bsyms[position]) if fused else None
        name = getattr(destination, "name", None)
        step_reads.append(read_now)
        step_makes.append(made_now)
        step_outs.append(out_now)
        step_writes.append(now.get(name, current.get(name) or owner.get(name, name)) if name else None)
        step_fused.append(fused)
        step_backward.append(copy is not None or backward[position])
        step_position.append(position)
        if signatures:  # values by (copy number or None, name)
            signature, read, made = signatures[position]
            values_read = tuple((sources.get(name), name) for name in read)
            values_made = {(copy, name): nbytes for name, nbytes in made}
            same = None if signature is None else (signature[0], values_read, tuple(values_made))
            step_same.append((same, values_read, values_made))

    fusible = regions.fusible if regions is not None else (False,) * len(bsyms)
    backward = regions.backward if regions is not None else (False,) * len(bsyms)
    library = regions.library if regions is not None and regions.library else (False,) * len(bsyms)
    channels_last = regions is not None and regions.kernels is not None and regions.kernels.channels_last_convolutions_on_cpu
    forward_fused = regions is not None and regions.forward_regions
    prologue_end = None  # the step of the prologue's last copy
    for position in range(len(bsyms)):
        for k in schedule.before.get(position, ()):
            i, inputs = schedule.copies[k]
            run(i, inputs, k, fusible[i])
            if k == schedule.prologue - 1:
                prologue_end = step
            step += 1
        fused = fusible[position] and (backward[position] or forward_fused)
        run(position, schedule.reads.get(position, {}), None, fused)
        if prologue and prologue.intersection(tensor_outs[position]):
            prologue_end = step
        step += 1
    uncut = [regions.uncut_from[p] for p in step_position] if regions is not None and regions.uncut_from else None
    cut_before = bool(regions is not None and regions.kernels and regions.kernels.cut_before_gradient_convolutions)
    region_of = _step_regions(step_fused, step_backward, step_reads, step_makes, step_outs, step_writes, last_read,
                              size, regions is not None and regions.split, prologue_end, uncut, cut_before,
                              step_same)
    walk_step = list(range(step))  # per step now: its step in the walk's order (moved by a compiler's order)
    if regions is not None and regions.kernels is not None:
        kinds = [regions.kinds[p] if region >= 0 else None for p, region in zip(step_position, region_of)]
        heavy = [regions.heavy[p] for p in step_position]
        step_reads = inline_pointwise(regions.kernels, kinds, heavy, region_of, step_reads, step_makes, size)
        own = regions.kernels.own_order  # the compiler orders every region, else those running a convolution
        ordered = sorted({r for p, r in zip(step_position, region_of) if r >= 0 and (own or regions.convolution[p])}) \
            if regions.kernels.orders_convolution_regions and (own or regions.convolution) else ()
        if ordered:
            walk_step = _compiler_order(ordered, region_of, step_reads, step_makes, step_writes, born, size)
            for per_step in (step_reads, step_makes, region_of, kinds, step_position, *([uncut] if uncut else [])):
                per_step[:] = [per_step[k] for k in walk_step]
            now_at = {old: new for new, old in enumerate(walk_step)}
            for storage, at in born.items():
                born[storage] = now_at[at]
            last_read.clear()
            last_read.update(born)  # the reads' part follows, in the new order
        hold_kernel_runs(kinds, region_of, step_reads, step_makes, born, last_read, size)
    region_steps: dict[int, list[int]] = {}  # region -> [first step, last step]
    read_in: dict = {}  # storage -> the regions that read it
    for at, region in enumerate(region_of):
        if region >= 0:
            region_steps.setdefault(region, [at, at])[1] = at
            for storage in step_reads[at]:
                read_in.setdefault(storage, set()).add(region)
    for storage, readers in read_in.items():  # a region holds what it reads from before it
        start = born.get(storage, -1)
        for region in readers:
            first, last = region_steps[region]
            if start < first:
                last_read[storage] = max(last_read[storage], last)
    if outputs_late and uncut and not cut_before:
        for region, (first, last) in region_steps.items():
            if any(uncut[first:last + 1]):
                for storage, at in born.items():
                    if first <= at < last and last_read[storage] > last and region not in read_in.get(storage, ()):
                        born[storage] = last
    lifetimes = {storage: (at, last_read[storage], size.get(storage, sizes.get(storage, 0)))
                 for storage, at in born.items()}
    if not detail:
        return _peak_of(lifetimes, step)[0]
    peak, at, alive = _peak_of(lifetimes, step)
    return peak, walk_step[at], alive


def _step_regions(fused: list[bool], backward: list[bool], reads: list[list], makes: list[list], outs: list[list],
                  writes: list, last_read: dict, size: dict, split: bool, prologue_end: int | None = None,
                  uncut: list[bool] | None = None, cut_before_uncut: bool = False, same=()) -> list[int]:
    """The region each step runs in (-1: none): runs of consecutive fused steps of one trace
    (``backward``: per step, it belongs to the backward), each backward run cut where
    ``solvers.region_cuts`` cuts it (``split``), reading storages as a built region reads names,
    and after ``prologue_end`` (the step of the backward prologue's last copy), as ``pairs.split``
    cuts after the prologue; a run holding a step ``uncut`` marks is not cut, or with
    ``cut_before_uncut`` not from the step making the first such step's operands on
    (``region_cuts.uncut_from``); a forward run is not cut (``pairs.split`` cuts backward regions
    only). ``same``: per step, (its ``equal_computations`` entry, the values it reads, the values
    it makes -> bytes), where the split keeps same computations apart (empty: it does not)."""
    region_of = [-1] * len(fused)
    last_value_read: dict = {}  # where ``same`` is given: value -> the last step reading it
    for at, (_, values_read, _) in enumerate(same):
        for value in values_read:
            last_value_read[value] = at
    region, k = -1, 0
    while k < len(fused):
        if not fused[k]:
            k += 1
            continue
        start = k
        while k < len(fused) and fused[k] and backward[k] == backward[start]:
            k += 1
        cuts: set[int] = set()
        if split and backward[start] and k - start > 1:
            made = {storage for at in range(start, k) for storage in makes[at]}
            # the run's inputs no later step reads: a cut can free them
            inputs = {storage for at in range(start, k) for storage in reads[at]
                      if storage not in made and last_read[storage] < k}
            outputs = {storage for storage in made if last_read[storage] >= k}
            run_makes = [makes[at] for at in range(start, k)]
            # never between the first op in the run that makes a storage or a view of it and a
            # write into it (``fusion_regions.written_after_made``)
            fixed = made_then_written(outs[start:k], writes[start:k])
            if uncut:
                fixed |= uncut_from([reads[at] for at in range(start, k)], run_makes, uncut[start:k],
                                    cut_before_uncut)
            boundaries = (prologue_end - start,) if prologue_end is not None and start <= prologue_end < k else ()
            apart = ()
            if same:
                last_local = {value: last_value_read.get(value, -1) - start for at in range(start, k)
                              for value in same[at][2]}
                apart = apart_pairs(equal_computations([same[at][0] for at in range(start, k)]),
                                    [same[at][2] for at in range(start, k)], last_local,
                                    {value for value, at in last_local.items() if at >= k - start})
            cuts = set(region_cuts([reads[at] for at in range(start, k)], run_makes, size, inputs, outputs,
                                   apart=apart, fixed=fixed, boundaries=boundaries))
        region += 1
        for local, at in enumerate(range(start, k)):
            region_of[at] = region
            if local in cuts:
                region += 1
    return region_of


def inline_pointwise(model: KernelModel, kinds: list, heavy: list[bool], region_of: list[int], reads: list[list],
                     makes: list[list], size: dict) -> list[list]:
    """The first half of applying ``model`` to a walk of steps (``KernelModel`` says what it
    models; ``hold_kernel_runs`` is the second): zero the size of the pointwise values its readers
    compute inside them, and make those readers read the values' inputs instead. Independent of
    the steps' order within a region, so it runs before a compiler's order is chosen.

    Per step: ``kinds`` its ``fusion_regions.KernelKind`` (None outside regions), ``heavy`` it uses
    one of ``model.heavy_on_cpu`` on CPU, ``region_of`` its region (-1: none), ``reads`` and
    ``makes`` the storages it reads and allocates; ``size``: storage -> bytes, updated in place.
    Returns the steps' reads, updated (the caller's lists are not changed)."""
    readers: dict = {}
    for at, read in enumerate(reads):
        for storage in read:
            readers.setdefault(storage, []).append(at)
    reads = [list(read) for read in reads]
    for at, kind in enumerate(kinds):
        if kind != KernelKind.POINTWISE or not makes[at]:
            continue
        by = sorted({r for storage in makes[at] for r in readers.get(storage, ())})
        if not by or any(region_of[r] != region_of[at] or kinds[r] == KernelKind.EXTERN for r in by):
            continue  # handed out of the region, or read by a library call: written
        inputs = reads[at]
        if len(inputs) > model.accumulated_reads_threshold:
            continue
        if len(by) > 1 and (len(inputs) > model.reads_threshold or heavy[at]):
            continue
        for storage in makes[at]:
            size[storage] = 0
        for r in by:
            for storage in inputs:
                if storage not in reads[r]:
                    reads[r].append(storage)
                    readers.setdefault(storage, []).append(r)
    return reads


def hold_kernel_runs(kinds: list, region_of: list[int], reads: list[list], makes: list[list], born: dict,
                     last_read: dict, size: dict) -> None:
    """The second half (``inline_pointwise``), on the steps in the order they run: extend
    ``last_read`` to the steps' ``reads``, then hold what each run of fused ops between extern
    kernels reads to the run's end and allocate what it hands on at the run's start. ``born``,
    ``last_read`` and ``size`` (storage -> step allocated, step of last read, bytes) are updated
    in place."""
    for at, read in enumerate(reads):
        for storage in read:
            last_read[storage] = max(last_read.get(storage, at), at)
    at = 0
    while at < len(kinds):  # runs of fused ops between extern kernels
        if kinds[at] in (None, KernelKind.EXTERN):
            at += 1
            continue
        first = at
        while at + 1 < len(kinds) and region_of[at + 1] == region_of[first] and kinds[at + 1] != KernelKind.EXTERN:
            at += 1
        for k in range(first, at + 1):
            for storage in reads[k]:
                if born.get(storage, -1) < first:
                    last_read[storage] = max(last_read[storage], at)
            for storage in makes[k]:
                if last_read.get(storage, k) > at:
                    born[storage] = first
                elif kinds[k] != KernelKind.OTHER:
                    size[storage] = 0
                # a reduction's or scatter's output read only inside the run is still a buffer
                # of the run's kernels, alive from its step to its last read (an embedding's
                # backward there is a table-sized one)
        at += 1


def _compiler_order(ordered: list[int], region_of: list[int], reads: list[list], makes: list[list], writes: list,
                    born: dict, size: dict) -> list[int]:
    """The walk's steps in the order the compiler runs them: each region in ``ordered`` (its steps
    consecutive) in ``memory_order.lowest_greedy_order`` of its ops, from their
    ``memory_order.locality_order`` (the FX pass before the scheduler), with the bytes the compiler
    sees (the values it writes: a library call's workspace is not one), the others as they are.
    ``reads`` and ``makes``: per step, after ``inline_pointwise``; ``writes``: per step, the
    storage it writes in place, or None; ``born``: storage -> the step making it."""
    order = list(range(len(region_of)))
    steps_of: dict[int, list[int]] = {region: [] for region in ordered}
    last_reader: dict = {}  # storage -> the last step reading it
    for at, (region, read) in enumerate(zip(region_of, reads)):
        if region in steps_of:
            steps_of[region].append(at)
        for storage in read:
            last_reader[storage] = at
    for region in ordered:
        steps = steps_of[region]
        first, last = steps[0], steps[-1]
        local = {at: i for i, at in enumerate(steps)}
        preds: list[set[int]] = [set() for _ in steps]
        for at in steps:
            for storage in reads[at]:
                maker = born.get(storage, -1)
                if first <= maker < at:
                    preds[local[at]].add(local[maker])
        for at in steps:  # a write in place follows what touches the storage before it, precedes what reads it after
            written = writes[at]
            if written is None:
                continue
            for other in steps:
                if written in reads[other] or written in makes[other]:
                    if other < at:
                        preds[local[at]].add(local[other])
                    elif other > at:
                        preds[local[other]].add(local[at])
        # storages numbered as first met: the rewrites one compilation compares share regions (the
        # forward's) whose names differ, and the order is cached by content
        label: dict = {}
        for at in steps:
            for storage in (*reads[at], *makes[at]):
                label.setdefault(storage, len(label))
        # as the compiler sees it: the region's inputs are freed after their last reader in it
        # (the caller holds them, which adds the same bytes to every order), what is read after
        # the region is never freed
        kept = frozenset(number for storage, number in label.items() if last_reader.get(storage, -1) > last)
        chosen = _region_order(tuple(frozenset(p) for p in preds),
                               tuple(frozenset(label[s] for s in reads[at]) for at in steps),
                               tuple(frozenset(label[s] for s in makes[at]) for at in steps),
                               tuple(size.get(storage, 0) for storage in label), kept)
        order[first:last + 1] = [steps[i] for i in chosen]
    return order


@lru_cache(maxsize=256)
def _region_order(preds: tuple, reads: tuple, makes: tuple, sizes: tuple, kept: frozenset) -> tuple[int, ...]:
    """The order the compiler gives a region (``_compiler_order``'s problem, storages numbered):
    its locality pass's order (the graph's order when the scheduler gets it), then the lowest of
    the scheduler's greedy orders from there."""
    problem = OrderProblem(preds, reads, makes, dict(enumerate(sizes)), kept)
    base = locality_order(problem)
    return tuple(base[i] for i in lowest_greedy_order(renumbered(problem, base)))


def _on_cpu(op) -> bool:
    return any(getattr(getattr(p, "device", None), "type", None) == "cpu" for p in op.flat_proxy_outs)


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
