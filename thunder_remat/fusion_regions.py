"""Where a backward fusion region is cut, read from its bound symbols (the rule is ``solvers.region_cuts``).

Shared by the split that cuts the fused trace (``pairs.split``) and by the step-peak estimate that
predicts those cuts before Thunder fuses (``whole_graph.peak``), so both cut in the same places.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from thunder.core.proxies import Proxy, TensorProxy
from thunder.core.pytree import tree_flatten

from thunder_remat.cost import value_bytes
from thunder_remat.solvers.region_cuts import apart_pairs, made_then_written, region_cuts, uncut_from
from thunder_remat.storage import StorageMap, storage_map
from thunder_remat.policies import contraction_kind
from thunder_remat.trace_facts import TagReader, gradient_values, in_place_destination

__all__ = ["RegionNames", "region_names", "computation_signature", "equal_computations", "same_computations",
           "to_keep_apart", "region_cut_positions", "written_after_made", "KernelModel", "KernelKind", "kernel_kind",
           "runs_convolution", "gradient_convolutions", "uncut_convolutions"]


@dataclass(frozen=True)
class RegionNames:
    """What the ops of a region read and make, by name, and the proxy of every name."""

    proxies: dict
    reads: list[tuple[str, ...]]
    makes: list[tuple[str, ...]]


def region_names(bsyms: Sequence) -> RegionNames:
    """One walk over a region's ops for the cut rule and the split that emits its pieces."""
    proxies = {}
    for bsym in bsyms:
        for p in (*bsym.flat_proxy_args, *bsym.flat_proxy_outs):
            proxies.setdefault(p.name, p)
    return RegionNames(proxies, [tuple(p.name for p in bsym.flat_proxy_args) for bsym in bsyms],
                       [tuple(p.name for p in bsym.flat_proxy_outs) for bsym in bsyms])


def computation_signature(bsym) -> tuple[tuple, tuple[str, ...]] | None:
    """(what makes ``bsym``'s op the op it is, its constants included; the names of the values it
    reads, in argument order), or None for an op that is never the same computation as another:
    an in-place write, or one making no tensor. Two ops compute the same values when their first
    parts are equal and they read the same values (``equal_computations``)."""
    if in_place_destination(bsym) is not None:
        return None
    if not any(isinstance(p, TensorProxy) for p in bsym.flat_proxy_outs):
        return None
    leaves, spec = tree_flatten((bsym.args, bsym.kwargs))
    static = (bsym.sym.name, str(bsym.sym.id), str(spec),
              tuple("value" if isinstance(x, Proxy) else ("constant", repr(x)) for x in leaves))
    return static, tuple(x.name for x in leaves if isinstance(x, Proxy))


def equal_computations(ops: Sequence) -> list[tuple[int, int]]:
    """Pairs ``(i, j)``, ``i < j``, of ``ops`` computing the same values, ``i`` the latest before
    ``j``. Each op: None (never the same as another), or (its ``computation_signature``'s first
    part, the values it reads, the values it makes), values by any hashable name; a read value is
    the same as another when it is, or when ops that are the same made them (a chain recomputed
    twice)."""
    canonical: dict = {}  # a value -> the first value computed the same way
    latest: dict[tuple, int] = {}
    pairs = []
    for j, op in enumerate(ops):
        if op is None:
            continue
        static, reads, makes = op
        key = (static, tuple(canonical.get(v, v) for v in reads))
        i = latest.get(key)
        latest[key] = j
        if i is None:
            continue
        pairs.append((i, j))
        for mine, theirs in zip(makes, ops[i][2]):
            canonical[mine] = canonical.get(theirs, theirs)
    return pairs


def same_computations(bsyms: Sequence) -> list[tuple[int, int]]:
    """``equal_computations`` of a region's bound symbols: the same op on the same inputs, an
    input being the same when it is the same value or made by ops that are the same. In-place
    writes are never the same computation."""
    ops = []
    for bsym in bsyms:
        signature = computation_signature(bsym)
        ops.append(None if signature is None else (*signature, tuple(p.name for p in bsym.flat_proxy_outs)))
    return equal_computations(ops)


def region_cut_positions(bsyms: Sequence, inputs: Sequence, outputs: set[str], held: set[str],
                         keep_apart: bool, names: RegionNames | None = None,
                         storages: StorageMap | None = None, boundaries=(),
                         uncut_from_ops: Sequence[bool] = (), cut_before_uncut: bool = True) -> list[int]:
    """Positions after which ``solvers.region_cuts`` cuts a region running ``bsyms``.

    ``inputs``: the region's input proxies; ``outputs``: names of what it returns (or what is read
    after it); ``held``: names held anyway (the function's arguments), which a cut cannot free.
    ``keep_apart``: the executor's compiler computes ops computing the same values once and holds
    the result between them (``FusionAdapter.merges_same_computations``): what it would hold
    counts toward cutting between them (``to_keep_apart``). Never cut between the op that makes
    a storage and an in-place write into it (``written_after_made``). ``names``: the
    ``region_names`` of ``bsyms`` when the caller has them. ``storages``: the storage map of the
    whole trace the region is part of, so that an input that is a view of another value (made
    before the region) holds that value's storage, as the step-peak estimate counts it; without
    it the region's inputs own their storages. ``boundaries``: positions after which the region is
    always cut (``region_cuts``). ``uncut_from_ops``: per op, whether no cut may fall from the
    making of its operands on, or with ``cut_before_uncut`` False none in the region at all
    (``uncut_convolutions``, ``region_cuts.uncut_from``).

    The rule sees storages, not names: a value and its views are one storage, made once and freed
    after the last read of any of them.
    """
    names = names if names is not None else region_names(bsyms)
    storages = storages if storages is not None else storage_map(list(bsyms), list(inputs))
    owner_of = storages.owner_of
    held_storages = {owner_of(name) for name in held}
    tensors = {name: p for name, p in names.proxies.items() if isinstance(p, TensorProxy)}
    sizes: dict[str, int] = {}  # storage -> its bytes
    for name, p in tensors.items():
        sizes.setdefault(owner_of(name), storages.owner_bytes.get(owner_of(name)) or value_bytes(p))
    reads = [tuple(dict.fromkeys(owner_of(n) for n in row if n in tensors and owner_of(n) not in held_storages))
             for row in names.reads]
    made: set[str] = set()
    makes = []
    for row in names.makes:
        fresh = [n for n in row if n in tensors and owner_of(n) == n and n not in made]
        made.update(fresh)
        makes.append(tuple(fresh))
    freeable = {owner_of(p.name) for p in inputs} - held_storages
    apart = to_keep_apart(bsyms, outputs) if keep_apart else ()
    fixed = written_after_made(bsyms, storages)
    fixed |= uncut_from(reads, makes, uncut_from_ops, cut_before_uncut)
    return region_cuts(reads, makes, sizes, freeable, {owner_of(n) for n in outputs}, apart, fixed, boundaries)


def written_after_made(bsyms: Sequence, storages) -> set[int]:
    """Positions after which a region running ``bsyms`` must not be cut: between the op that makes
    a storage and an in-place write into it. A piece writing into memory an earlier piece made and
    returned gave wrong gradients with torch.compile (T5's in-place position bias): Inductor may
    return one buffer for two equal outputs, and two writes then land in one."""
    makes = [[storages.owner_of(p.name) for p in bsym.flat_proxy_outs] for bsym in bsyms]
    writes = []
    for bsym in bsyms:
        destination = in_place_destination(bsym)
        writes.append(storages.owner_of(destination.name) if hasattr(destination, "name") else None)
    return made_then_written(makes, writes)


def to_keep_apart(bsyms: Sequence, outputs: set[str]) -> list[tuple[int, int, int]]:
    """``solvers.region_cuts.apart_pairs`` of a region running ``bsyms`` and returning ``outputs``
    (names), by name: views count too (a compiler that sees one view where the trace has two sees
    their readers read the same buffer, and may fuse them into one kernel that runs at the
    earlier reader)."""
    last_read: dict[str, int] = {}
    for k, bsym in enumerate(bsyms):
        for p in bsym.flat_proxy_args:
            last_read[p.name] = k
    same = same_computations(bsyms)
    made = {i: {p.name: value_bytes(p) for p in bsyms[i].flat_proxy_outs if isinstance(p, TensorProxy)}
            for i, _ in same}
    return apart_pairs(same, made, last_read, outputs)


@dataclass(frozen=True)
class KernelModel:
    """How a fusion executor's compiler turns a region's ops into kernels, where that changes what
    is alive (Inductor's rules, read from its config by the executor's adapter; measured against
    the allocator in docs/whole-graph.md).

    - A pointwise value read only by pointwise or reducing ops of its region is not written to
      memory: each reader computes it from the value's inputs, which then live until that reader
      runs. It is written when it has several readers and reads more than ``reads_threshold``
      values (or, on CPU, uses one of ``heavy_on_cpu``), when it reads more than
      ``accumulated_reads_threshold`` values, or when an extern kernel (a matmul, a convolution)
      reads it.
    - The ops of a region between two extern kernels run as fused kernels, which allocate what
      they hand on before they run and free what they read after: such a run holds its inputs to
      its end and allocates its outputs at its start.
    - ``uncut_convolution_regions``: a backward region that runs a convolution is not cut. What
      the compiler's layout conversions around its convolution kernels hold is not modelled, so
      the cut rule cannot see what a cut there costs (measured: cuts raised the zoo CNNs' peaks).
    - ``cut_before_gradient_convolutions``: with the above, such a region is still cut before the
      op making the operands of its first gradient convolution (``gradient_convolutions``), and
      left whole from there on (``region_cuts.uncut_from``). Chosen per compilation, where the
      step-peak estimate says it lowers the peak (a transformer whose only convolution is its
      patch embedding, run last in the backward).
    - ``orders_convolution_regions``: the compiler runs a region that runs a convolution in an
      order of its own, chosen for the least peak of what it allocates (Inductor's
      ``reorder_for_peak_memory``; thunder_remat keeps the plan's order in other regions below the
      fastest plan). The walk runs such a region in the order ``memory_order.lowest_greedy_order``
      picks among the same kinds of greedy orders, on the values the compiler allocates.
    - ``channels_last_convolutions_on_cpu``: the compiler calls a 2-d CPU convolution on
      channels-last operands (Inductor's layout optimization with oneDNN), so the library's own
      workspace is that of channels-last operands (measured: ``kernel_workspace``).
    - ``merges_same_computations``: the compiler computes two ops computing the same values once
      and holds the result between them, unless a cut separates them; the split weighs cutting
      there (``to_keep_apart``) where the regions run in the compiler's own order.
    - ``own_order``: the regions compile in the compiler's own order, not the plan's (the fastest
      plan: ``remat_keep_plan_order`` applies below it). The compiler then orders every region
      as ``orders_convolution_regions`` says it orders one running a convolution, and the split
      keeps same computations apart where ``merges_same_computations``. Chosen per compilation.
    """

    reads_threshold: int
    accumulated_reads_threshold: int
    heavy_on_cpu: tuple[str, ...] = ()
    uncut_convolution_regions: bool = False
    channels_last_convolutions_on_cpu: bool = False
    cut_before_gradient_convolutions: bool = False
    orders_convolution_regions: bool = False
    merges_same_computations: bool = False
    own_order: bool = False


class KernelKind:
    """What kind of kernel an op of a region becomes (``kernel_kind``)."""

    EXTERN = "extern"  # a library call (matmul, convolution): reads realized buffers
    POINTWISE = "pointwise"  # may be computed inside its readers
    OTHER = "other"  # a reduction, a scatter, a random op: fused, but always written


_WRITTEN_TAGS = frozenset({"REDUCTION_OP", "MATMUL_OP", "RANDOM_OP", "IN_PLACE", "COLLECTIVE"})
#: ops (Thunder 0.2.6 names, anywhere in a decomposition) that scatter, scan or sort without a
#: reduction tag: Inductor writes their outputs
_WRITTEN_OPS = ("embedding_backward", "scatter", "scatter_add", "index_add", "index_put", "index_copy", "cumsum",
                "sort", "argsort")


def kernel_kind(bsym, tags: TagReader) -> str:
    """The ``KernelKind`` of ``bsym`` inside a region."""
    name = bsym.sym.name
    if contraction_kind(name) or name in ("linear", "matmul"):
        return KernelKind.EXTERN
    if tags(bsym) & _WRITTEN_TAGS or uses_op(bsym, _WRITTEN_OPS):
        return KernelKind.OTHER
    return KernelKind.POINTWISE


def runs_convolution(bsym) -> bool:
    """Whether ``bsym`` or any op of its decomposition is a convolution (or its transpose, or
    either's backward)."""
    if contraction_kind(bsym.sym.name) in ("convolution", "transposed convolution"):
        return True
    return any(runs_convolution(sub) for sub in bsym.subsymbols)


def gradient_convolutions(bsyms: Sequence, gradients: set[str] | None = None) -> list[bool]:
    """Per bound symbol (a region's ops, or a trace's), whether it runs a convolution that reads a
    value computed from a gradient (``trace_facts.gradient_values`` of the whole trace, or of
    ``bsyms`` when not given): a convolution of the backward proper, not the backward's
    recomputation of a forward one."""
    gradients = gradient_values(bsyms) if gradients is None else gradients
    return [any(p.name in gradients for p in bsym.flat_proxy_args) and runs_convolution(bsym) for bsym in bsyms]


def uncut_convolutions(bsyms: Sequence, kernels: KernelModel | None, gradients: set[str] | None = None) -> list[bool]:
    """Per op of a backward region (or of a trace), whether it keeps the region uncut, as
    ``kernels`` says: every convolution (the region left whole), or with
    ``cut_before_gradient_convolutions`` gradient convolutions only (uncut from the making of the
    first one's operands on, ``region_cuts.uncut_from``; the backward's copies of forward
    convolutions are cut around as any op). All False where ``kernels`` leaves regions running
    convolutions to the cut rule. ``gradients``: as ``gradient_convolutions``."""
    if kernels is None or not kernels.uncut_convolution_regions:
        return [False] * len(bsyms)
    if kernels.cut_before_gradient_convolutions:
        return gradient_convolutions(bsyms, gradients)
    return [runs_convolution(bsym) for bsym in bsyms]


def uses_op(bsym, names: tuple[str, ...]) -> bool:
    """Whether ``bsym`` or any op of its decomposition is one of ``names``."""
    if bsym.sym.name in names:
        return True
    return any(uses_op(sub, names) for sub in bsym.subsymbols)
