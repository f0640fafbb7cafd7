"""Analysis: describe a joint forward+backward trace as a plain ``SaveProblem``.

Works on the joint trace Thunder 0.2.6 hands to ``transform_for_execution`` (after the grad
transform, before fusion): forward bound symbols first, then the backward ones, which carry
``BoundSymbolTag.BACKWARD``, then the return, whose ``flat_args`` are the forward inputs.
This is the only stage of the whole-graph pass that reads bound symbols.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from thunder.core import prims
from thunder.core.proxies import ProxyTag, TensorProxy
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import BoundSymbolTag, has_tags

from thunder_remat.cost import op_flops, value_bytes
from thunder_remat.policies import Judgement, OpFacts, judge_op
from thunder_remat.save_problem import ForwardOp, ForwardValue, SaveProblem
from thunder_remat.storage import StorageMap, storage_map

__all__ = ["is_joint_trace", "split_joint", "ThunderSplit", "thunder_split", "forward_storages", "build_save_problem"]

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


def is_joint_trace(trace) -> bool:
    """A joint forward+backward trace (not a prologue, epilogue or inference-only trace)."""
    bsyms = trace.bound_symbols
    if not bsyms or bsyms[-1].sym.id != prims.PrimIDs.RETURN:
        return False
    ret = bsyms[-1].args[0] if bsyms[-1].args else None
    return isinstance(ret, dict) and "fw_flat_out" in ret and any(is_backward(b) for b in bsyms)


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
        elif bsym.sym.name == "copy_" and len(bsym.args) > 1 and getattr(bsym.args[1], "name", None) in forward_names:
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
    """The tensor an op writes in place, or None: ``copy_(source, destination)`` writes its second
    argument, ``copy_with_setitem`` and torch's in-place methods their first; the rest are read.

    Running a write again is sound only into a destination made again with it (a fresh tensor):
    both passes recompute a write only together with its destination. ``copy_`` carries no
    IN_PLACE tag in Thunder 0.2.6, and torch's in-place methods keep theirs (a hard ban)."""
    if bsym.sym.name == "copy_":
        return bsym.args[1] if len(bsym.args) > 1 else None
    if bsym.sym.name == "copy_with_setitem" or prims.OpTags.IN_PLACE in (bsym.sym.tags or ()):
        return bsym.args[0] if bsym.args else None
    return None


def tag_names(bsym) -> frozenset[str]:
    names = set()
    for tag in (bsym.sym.tags or ()):
        names.add(getattr(tag, "name", str(tag)))
    for sub in bsym.subsymbols:
        for tag in (sub.sym.tags or ()):
            names.add(getattr(tag, "name", str(tag)))
    if BoundSymbolTag.RECOMPUTE_IN_BACKWARD in bsym.tags or any(
        ProxyTag.RECOMPUTE_IN_BACKWARD in p.tags for p in bsym.flat_proxy_outs
    ):
        names.add("RECOMPUTE_IN_BACKWARD")
    if collective_name(bsym) is not None or "distributed" in str(bsym.sym.id):
        names.add("COLLECTIVE")
    return frozenset(names)


def op_facts(bsym, tags: frozenset[str], outputs, inputs) -> OpFacts:
    """What the policies judge an op by: name, tag names, and the bytes of the given proxies."""
    return OpFacts(
        op=bsym.sym.name,
        tags=tags,
        output_bytes=sum(value_bytes(p) for p in outputs),
        input_bytes=sum(value_bytes(p) for p in inputs),
    )


def _source(bsym) -> str:
    filename = getattr(bsym, "source_filename", None)
    positions = getattr(bsym, "source_positions", None)
    line = getattr(positions, "lineno", None) if positions is not None else None
    return f"{filename}:{line}" if filename and line else ""


REGATHER = "ZeRO-3: the sharded parameter is re-gathered in the backward"
MOVED_BY_SPLIT = "not needed by the forward's outputs: Thunder's split runs it in the backward"


def _regathered(forward, inputs) -> set[int]:
    """Positions of the all-gathers of forward inputs (sharded parameters) and of their waits.

    A structural rule (the same on every rank, whatever the sizes): under FSDP ZeRO-3 these are
    re-issued in the backward instead of saving the gathered parameter.
    """
    futures, chosen = set(), set()
    for i, bsym in forward:
        name = collective_name(bsym)
        reads = [p.name for p in bsym.flat_proxy_args]
        if name == "all_gather" and reads and all(r in inputs for r in reads):
            chosen.add(i)
            futures.update(p.name for p in bsym.flat_proxy_outs)
        elif name == "wait" and reads and all(r in futures for r in reads):
            chosen.add(i)
    return chosen


def build_save_problem(trace, policies, *, regather_params: bool = False) -> SaveProblem:
    """``regather_params``: FSDP ZeRO-3 is on; gathered parameters are never saved but re-gathered."""
    forward, backward, inputs = split_joint(trace)
    regather = _regathered(forward, inputs) if regather_params else set()
    problem = SaveProblem()
    proxies = {}
    constants: set[str] = set()

    storages = forward_storages(trace)
    split = thunder_split(trace)
    in_forward = split.forward

    def add_value(p, is_input: bool) -> None:
        if p.name not in problem.values:
            proxies[p.name] = p
            owner = storages.owner_of(p.name)
            problem.values[p.name] = ForwardValue(
                name=p.name,
                nbytes=value_bytes(p),
                is_input=is_input,
                shape=tuple(getattr(p, "shape", ()) or ()),
                dtype=str(getattr(p, "dtype", "")),
                owner=owner,
                storage_bytes=0 if owner in storages.held else storages.owner_bytes.get(owner, value_bytes(p)),
                maybe_view=p.name in storages.maybe_view and not is_input,
            )

    for bsym in trace.bound_symbols[:-1]:
        if not is_backward(bsym):
            for p in bsym.flat_proxy_outs:
                if p.name in inputs:
                    add_value(p, True)
    for p in trace.bound_symbols[-1].args[0]["flat_args"]:
        if hasattr(p, "name"):
            add_value(p, True)

    # storage owner -> forward values of it made so far: a write overwrites them all
    made_on: dict[str, set[str]] = {}
    overwritten: set[str] = set()
    for i, bsym in forward:
        destination = getattr(in_place_destination(bsym), "name", None)
        if destination in problem.values:
            overwritten.update(made_on.get(storages.owner_of(destination), ()))
        else:
            destination = None
        outs = [p for p in bsym.flat_proxy_outs if p.name not in problem.values]
        for p in outs:
            made_on.setdefault(storages.owner_of(p.name), set()).add(p.name)
        if not outs:
            continue
        reads = [p for p in bsym.flat_proxy_args if p.name in problem.values]
        for p in outs:
            add_value(p, False)
        names = tag_names(bsym)
        judgement = judge_op(op_facts(bsym, names, outs, reads), policies)
        if i in regather:
            judgement = Judgement(recompute=True, reasons=(REGATHER,))
        elif i not in in_forward and judgement.hard is None:
            # Thunder's split runs a forward op the forward outputs do not need in the backward,
            # whatever the plan: its outputs are never saved.
            judgement = Judgement(recompute=True, reasons=(MOVED_BY_SPLIT,))
        # An op fed by nothing but constants (arange, a causal mask from it) makes a constant:
        # Thunder's forward/backward split recomputes those in the backward whatever the plan says,
        # so the plan prices them at nothing and never counts them as saved.
        is_constant = judgement.hard is None and all(p.name in constants for p in reads)
        if is_constant:
            constants.update(p.name for p in outs)
        problem.ops.append(
            ForwardOp(
                index=i,
                op=bsym.sym.name,
                outputs=tuple(p.name for p in outs),
                inputs=tuple(dict.fromkeys(p.name for p in reads)),
                cost=0.0 if is_constant else op_flops(bsym, names),
                hard_ban=judgement.hard,
                soft_ban=judgement.soft,
                force_recompute=judgement.recompute,
                source=_source(bsym),
                collective=collective_name(bsym) is not None,
                writes=destination,
            )
        )
    problem.overwritten = frozenset(n for n in overwritten if not problem.values[n].is_input)

    needed = {}
    for _, bsym in backward:
        if not reads_forward_values(bsym):
            continue
        for p in bsym.flat_proxy_args:
            if p.name in problem.values:
                needed.setdefault(p.name, None)
    # Values that forward ops moved to the backward by the split read: those ops are not
    # rewritten, so the forward hands these values over whatever the plan.
    problem.must_save = tuple(n for n in split.saved if n in split.read_by_moved and n in problem.values)
    for name in problem.must_save:
        needed.setdefault(name, None)
    problem.needed_by_backward = tuple(needed)
    problem.saved_by_thunder = tuple(n for n in split.saved if n in problem.values)
    # A write run again in the backward would change what the backward reads from before it.
    stale = {storages.owner_of(n) for n in needed if n in problem.overwritten}
    problem.ops = [replace(op, hard_ban=STALE_WRITE) if op.writes is not None and op.hard_ban is None
                   and storages.owner_of(op.writes) in stale else op for op in problem.ops]
    return problem
