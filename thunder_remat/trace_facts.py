"""Facts about a joint forward+backward trace that both passes read.

Which bound symbols are forward or backward, what Thunder's own forward/backward split saves,
which storage each value uses, what an op writes in place, and one tag reader: the tags a policy
sees for an op (``OpFacts.tags``) are the same in both passes. Written against Thunder 0.2.6.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from thunder.core import prims
from thunder.core.proxies import ProxyTag, TensorProxy
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import BoundSymbolTag, has_tags

from thunder_remat.cost import value_bytes
from thunder_remat.policies import OpFacts
from thunder_remat.storage import StorageMap, prim_id, storage_map

__all__ = ["collective_name", "is_backward", "is_backward_region", "reads_forward_values", "is_joint_trace",
           "loss_outputs", "loss_outside", "caller_loss_inputs", "split_joint", "ThunderSplit", "thunder_split", "forward_storages",
           "STALE_WRITE", "in_place_destination", "in_place_writes", "leaf_ops", "TagReader", "op_facts", "TraceNames", "trace_names"]

_COLLECTIVE_NAMES = frozenset({"all_gather", "all_reduce", "reduce_scatter", "broadcast", "wait", "synchronize",
                               "pack_for_fsdp", "unpack_for_fsdp", "update_bucket_view"})


def collective_name(bsym) -> str | None:
    """``all_gather``, ``wait``, ... for Thunder's distributed prims and the torch executor's
    implementations of them (``torch_all_gather_prim_impl`` in 0.2.6); None for other ops."""
    name = bsym.sym.name.removeprefix("torch_").removesuffix("_prim_impl")
    return name if name in _COLLECTIVE_NAMES else None


def is_backward(bsym) -> bool:
    return BoundSymbolTag.BACKWARD in bsym.tags


def is_backward_region(bsym) -> bool:
    """A backward op, or a fusion region made of backward ops (regions carry no tag themselves)."""
    return is_backward(bsym) or (bsym.sym.is_fusion and any(is_backward(sub) for sub in bsym.subsymbols))


def reads_forward_values(bsym) -> bool:
    """Whether a backward bsym's arguments are real reads (``get_grad(out)`` only names an output)."""
    return bsym.sym.id != prims.PrimIDs.GET_GRAD


def gradient_values(bsyms) -> set[str]:
    """Names of the values computed from the gradients a joint trace is handed: ``get_grad``'s
    outputs and everything made from them (a fusion region's ops walked one by one). A forward op,
    and the backward's copy of one (a recomputation), makes none."""
    found: set[str] = set()
    for bsym in bsyms:
        for op in (bsym.subsymbols if bsym.sym.is_fusion else (bsym,)):
            if op.sym.id == prims.PrimIDs.GET_GRAD or any(p.name in found for p in op.flat_proxy_args):
                found.update(p.name for p in op.flat_proxy_outs)
    return found


def is_joint_trace(trace) -> bool:
    """A joint forward+backward trace (not a prologue, epilogue or inference-only trace)."""
    bsyms = trace.bound_symbols
    if not bsyms or bsyms[-1].sym.id != prims.PrimIDs.RETURN:
        return False
    ret = bsyms[-1].args[0] if bsyms[-1].args else None
    return isinstance(ret, dict) and "fw_flat_out" in ret and any(is_backward(b) for b in bsyms)


def loss_outputs(trace) -> set[str]:
    """Names of the forward outputs a joint trace returns. They go to the caller's loss, which
    consumes them before the backward starts, so the step's return does not hold them through the
    backward (the step-peak estimate and the region cuts both take it so)."""
    ret = trace.bound_symbols[-1].args[0] if trace.bound_symbols and trace.bound_symbols[-1].args else None
    if not (isinstance(ret, dict) and "fw_flat_out" in ret):
        return set()
    return {p.name for p in tree_flatten(ret["fw_flat_out"])[0] if hasattr(p, "name")}


def loss_outside(trace) -> bool:
    """The joint trace returns a tensor of more than one element that gets a gradient: the caller's
    loss reads it and makes that gradient between the forward and the backward, while everything
    the forward saved is alive, and what that loss holds is not in the trace (a model compiled
    with its loss returns a scalar)."""
    return bool(caller_loss_inputs(trace))


def caller_loss_inputs(trace) -> tuple:
    """The outputs of more than one element a joint trace returns that get a gradient (``loss_outside``)."""
    outputs = loss_outputs(trace)
    return tuple(bsym.args[0] for bsym in trace.bound_symbols
                 if bsym.sym.id == prims.PrimIDs.GET_GRAD and getattr(bsym.args[0], "name", None) in outputs
                 and math.prod(bsym.args[0].shape) > 1)


def split_joint(trace):
    """(forward op bsyms by index in the trace, backward bsyms by index, input names)."""
    forward, backward, inputs = [], [], set()
    ret = trace.bound_symbols[-1]
    for p in ret.args[0]["flat_args"]:
        if hasattr(p, "name"):
            inputs.add(p.name)
    for i, bsym in enumerate(trace.bound_symbols[:-1]):
        if is_backward(bsym):
            backward.append((i, bsym))
        elif bsym.sym.id in (prims.PrimIDs.UNPACK_TRIVIAL, prims.PrimIDs.UNPACK_SEQUENCE) or not bsym.flat_proxy_outs:
            inputs.update(p.name for p in bsym.flat_proxy_outs)
        else:
            forward.append((i, bsym))
    return forward, backward, inputs


@dataclass(frozen=True)
class ThunderSplit:
    """What Thunder's forward/backward split makes of a joint trace."""

    #: positions of the bound symbols that run in the forward
    forward: frozenset[int]
    #: tensor values the forward saves for the backward, in the order the backward reads them
    saved: tuple[str, ...]
    #: saved values that ops of the forward read, which the split runs in the backward because
    #: the forward's outputs do not need them (an in-place update of a dead copy, say)
    read_by_moved: frozenset[str] = frozenset()


def thunder_split(trace) -> ThunderSplit:
    """The forward part and the saved values of ``trace`` as Thunder 0.2.6 splits it.

    Mirrors ``thunder.transforms.autodiff.split_into_forward_and_backward`` after Thunder's
    dead-code elimination (jit runs it on the joint trace first): walking back from the forward's
    outputs, a bound symbol runs in the forward if it produces something the forward needs, and
    everything else runs in the backward, forward ops the forward does not need included. The
    backward's reads of forward values are what is saved.
    """
    bsyms = trace.bound_symbols
    ret = bsyms[-1].args[0]
    needed = {p.name for p in tree_flatten(bsyms[-1].args)[0] if hasattr(p, "name")}
    live = []
    for i in range(len(bsyms) - 2, -1, -1):
        bsym = bsyms[i]
        if has_tags(bsym, {prims.OpTags.DONT_DCE}) or any(p.name in needed for p in bsym.flat_proxy_outs):
            live.append(i)
            needed.update(p.name for p in bsym.flat_proxy_args)
    forward_names = {p.name for p in tree_flatten(ret["fw_flat_out"])[0] if hasattr(p, "name")}
    forward_names.update(p.name for p in ret["flat_args"] if hasattr(p, "name"))
    forward, backward = set(), []
    for i in live:  # last first
        bsym = bsyms[i]
        if bsym.sym.id == prims.PrimIDs.GET_GRAD:
            continue
        reads = {p.name for p in bsym.flat_proxy_args}
        if bsym.sym.id == prims.PrimIDs.UNPACK_TRIVIAL or any(p.name in forward_names for p in bsym.flat_proxy_outs):
            forward.add(i)
            forward_names.update(reads)
            forward_names.update(p.name for p in bsym.flat_proxy_outs)
        elif prim_id(bsym) == prims.PrimIDs.COPY_ and len(bsym.args) > 1 and getattr(bsym.args[1], "name", None) in forward_names:
            forward.add(i)
            forward_names.update(reads)
        else:
            backward.append(i)
    saved, moved = {}, set()
    for i in reversed(backward):
        for p in bsyms[i].flat_proxy_args:
            if isinstance(p, TensorProxy) and p.name in forward_names:
                saved.setdefault(p.name, None)
                if not is_backward(bsyms[i]):
                    moved.add(p.name)
    return ThunderSplit(frozenset(forward), tuple(saved), frozenset(moved))


@dataclass(frozen=True)
class TraceNames:
    """The names each top-level bound symbol of a trace reads and writes, by position: the walks
    over one trace that "auto" repeats per checkpoint candidate (copy schedules, peak estimates)
    read these instead of flattening every bound symbol again."""

    #: per position: names of the proxies it reads / of the tensors it reads / of the tensors it makes
    reads: tuple[tuple[str, ...], ...]
    tensor_reads: tuple[tuple[str, ...], ...]
    tensor_outs: tuple[tuple[str, ...], ...]
    #: positions of the backward bound symbols whose arguments are real reads (see ``reads_forward_values``)
    backward_readers: tuple[int, ...]
    #: position of each forward op that writes in place -> the values whose storage it overwrites
    #: (made since that storage's previous write; see ``in_place_writes``)
    overwritten_by: dict[int, frozenset[str]] = field(default_factory=dict)


def trace_names(trace) -> TraceNames:
    reads, tensor_reads, tensor_outs, readers = [], [], [], []
    writes = False
    for position, bsym in enumerate(trace.bound_symbols):
        args = bsym.flat_proxy_args
        reads.append(tuple(p.name for p in args))
        tensor_reads.append(tuple(p.name for p in args if isinstance(p, TensorProxy)))
        tensor_outs.append(tuple(p.name for p in bsym.flat_proxy_outs if isinstance(p, TensorProxy)))
        if is_backward(bsym) and reads_forward_values(bsym):
            readers.append(position)
        writes = writes or in_place_destination(bsym) is not None
    overwritten_by = {}
    if writes:  # the joint trace is not fused yet: its forward ops are its leaf ops
        forward, _, _ = split_joint(trace)
        found = in_place_writes([bsym for _, bsym in forward], forward_storages(trace))
        overwritten_by = {i: frozenset(stale) for (i, _), (_, stale) in zip(forward, found) if stale}
    return TraceNames(tuple(reads), tuple(tensor_reads), tuple(tensor_outs), tuple(readers), overwritten_by)


def forward_storages(trace, *, with_backward: bool = False) -> StorageMap:
    """Storage owners of the forward values of a joint trace (inputs held); ``with_backward``:
    of the backward's values too."""
    forward, backward, inputs = split_joint(trace)
    held = {}
    for bsym in trace.bound_symbols[:-1]:
        for p in bsym.flat_proxy_outs:
            if p.name in inputs:
                held.setdefault(p.name, p)
    for p in trace.bound_symbols[-1].args[0]["flat_args"]:
        if hasattr(p, "name"):
            held.setdefault(p.name, p)
    ops = sorted(forward + backward, key=lambda item: item[0]) if with_backward else forward
    return storage_map([bsym for _, bsym in ops], held.values())


#: why a write is never run again in the backward (the pair pass pins it for the same reason)
STALE_WRITE = "in-place write into a storage the backward reads from before it"


def in_place_destination(bsym):
    """The tensor an op writes in place, or None: ``copy_(source, destination)`` (the prim, or the
    torch executor's op running it: ``storage.prim_id``) writes its second argument, ltorch's
    ``Tensor.copy_`` its first, torch's in-place methods (``IN_PLACE`` tag) their first; the rest
    are read.
    ``copy_with_setitem`` is not a write: Thunder 0.2.6 runs it on a clone of its input (its
    result is written back with a ``copy_``).

    Running a write again is sound only into a destination made again with it (a fresh tensor):
    both passes recompute a write only together with its destination. ``copy_`` carries no
    IN_PLACE tag in Thunder 0.2.6, and torch's in-place methods keep theirs (a hard ban)."""
    if prim_id(bsym) == prims.PrimIDs.COPY_:
        return bsym.args[1] if len(bsym.args) > 1 else None
    if bsym.sym.id == "torch.Tensor.copy_":  # ltorch's method: ``a.copy_(b)`` writes ``a``
        return bsym.args[0] if bsym.args else None
    if prims.OpTags.IN_PLACE in (bsym.sym.tags or ()):
        return bsym.args[0] if bsym.args else None
    return None


def in_place_writes(bsyms, storages: StorageMap):
    """Walk ``bsyms`` in order (a fusion region through its body) and yield ``(op, overwritten)``
    for every op: the values of the storage ``op`` writes in place that were made since that
    storage's previous write (empty for an op that writes nothing). Those values now read the new
    data; a value made (again) after the write is fresh."""
    made_on: dict[str, set[str]] = {}
    for bsym in leaf_ops(bsyms):
        destination = getattr(in_place_destination(bsym), "name", None)
        overwritten = made_on.pop(storages.owner_of(destination), set()) if destination is not None else set()
        yield bsym, overwritten
        for p in bsym.flat_proxy_outs:
            made_on.setdefault(storages.owner_of(p.name), set()).add(p.name)


def leaf_ops(bsyms):
    """The ops of ``bsyms`` in order, a fusion region's body in place of the region."""
    for bsym in bsyms:
        if bsym.sym.is_fusion:
            yield from leaf_ops(bsym.subsymbols)
        else:
            yield bsym


#: tags that say what an op is as a whole, read from the op and its direct decomposition only: a
#: compute op whose decomposition reshapes somewhere is not a shape op
_WHOLE_OP_TAGS = frozenset({"SHAPE_OP"})


def _names(tags) -> set[str]:
    return {getattr(tag, "name", str(tag)) for tag in (tags or ())}


class TagReader:
    """The tag names of an op, the same for both passes (and so for a user's policy).

    Running an op runs its whole decomposition, so a random, reducing, matmul, in-place or
    collective step anywhere in it tags the op; ``SHAPE_OP`` comes from the op and its direct
    decomposition only. ``RECOMPUTE_IN_BACKWARD`` marks an op Thunder was told to recompute (on the
    bound symbol or its outputs), ``COLLECTIVE`` a distributed op (the torch executor's
    implementations carry no tag). One reader per pass caches each bound symbol's tags.
    """

    def __init__(self) -> None:
        # id -> (the bound symbol, kept alive so its id is not reused while cached; its tags)
        self._deep: dict[int, tuple[object, frozenset[str]]] = {}
        # one object per distinct tag set: a deep trace has tens of thousands of ops and a few
        # dozen distinct sets
        self._sets: dict[frozenset[str], frozenset[str]] = {}

    def __call__(self, bsym) -> frozenset[str]:
        names = set(self._contained(bsym))
        for sub in bsym.subsymbols:
            names |= _names(sub.sym.tags) & _WHOLE_OP_TAGS
        if BoundSymbolTag.RECOMPUTE_IN_BACKWARD in bsym.tags or any(
            ProxyTag.RECOMPUTE_IN_BACKWARD in p.tags for p in bsym.flat_proxy_outs
        ):
            names.add("RECOMPUTE_IN_BACKWARD")
        return frozenset(names)

    def _contained(self, bsym) -> frozenset[str]:
        """The op's own tags, and every tag but the whole-op ones of its decomposition."""
        hit = self._deep.get(id(bsym))
        if hit is not None:
            return hit[1]
        names = _names(bsym.sym.tags)
        if collective_name(bsym) is not None or "distributed" in str(bsym.sym.id):
            names.add("COLLECTIVE")
        for sub in bsym.subsymbols:
            names |= self._contained(sub) - _WHOLE_OP_TAGS
        tags = frozenset(names)
        tags = self._sets.setdefault(tags, tags)
        self._deep[id(bsym)] = (bsym, tags)
        return tags


def op_facts(bsym, tags: frozenset[str], outputs, inputs, constant_inputs: int = 0) -> OpFacts:
    """What the policies judge an op by: name, tag names, and the bytes of the given proxies.

    A torch in-place method whose decomposition writes nothing else (``add_`` is ``add`` then
    ``copy_`` into its first argument) loses its ``IN_PLACE`` tag here: like ``copy_`` it is judged
    by the write rule both passes keep (it runs again only into a destination made again with it,
    and never over data the other side still reads), not banned outright."""
    if "IN_PLACE" in tags and in_place_destination(bsym) is not None and not any(
            prims.OpTags.IN_PLACE in (sub.sym.tags or ()) for sub in bsym.subsymbols):
        tags = tags - {"IN_PLACE"}
    return OpFacts(
        op=bsym.sym.name,
        tags=tags,
        output_bytes=sum(value_bytes(p) for p in outputs),
        input_bytes=sum(value_bytes(p) for p in inputs),
        constant_inputs=constant_inputs,
    )
