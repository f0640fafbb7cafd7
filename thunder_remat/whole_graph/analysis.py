"""Analysis stage of the whole-graph pass: a joint forward+backward trace becomes a plain ``SaveProblem``.

Works on the joint trace Thunder 0.2.6 hands to ``transform_for_execution`` (after the grad
transform, before fusion): forward bound symbols first, then the backward ones, which carry
``BoundSymbolTag.BACKWARD``, then the return, whose ``flat_args`` are the forward inputs.
This is the only stage of the whole-graph pass that reads bound symbols.
"""

from __future__ import annotations

from dataclasses import replace

from thunder_remat.cost import op_flops, value_bytes
from thunder_remat.policies import Judgement, judge_op
from thunder_remat.trace_facts import (STALE_WRITE, TagReader, collective_name, forward_storages, in_place_destination,
                                       in_place_writes, is_backward, op_facts, reads_forward_values, split_joint,
                                       thunder_split)
from thunder_remat.whole_graph.problem import ForwardOp, ForwardValue, SaveProblem
from thunder_remat.whole_graph.zero3 import REGATHER, regathered_ops

__all__ = ["build_save_problem", "MOVED_BY_SPLIT"]

MOVED_BY_SPLIT = "not needed by the forward's outputs: Thunder's split runs it in the backward"


def _source(bsym) -> str:
    filename = getattr(bsym, "source_filename", None)
    positions = getattr(bsym, "source_positions", None)
    line = getattr(positions, "lineno", None) if positions is not None else None
    return f"{filename}:{line}" if filename and line else ""



def build_save_problem(trace, policies, *, regather_params: bool = False) -> SaveProblem:
    """``regather_params``: FSDP ZeRO-3 is on; gathered parameters are never saved but re-gathered."""
    forward, backward, inputs = split_joint(trace)
    regather = regathered_ops(forward, inputs) if regather_params else set()
    problem = SaveProblem()
    proxies = {}
    constants: set[str] = set()

    storages = forward_storages(trace)
    tags_of = TagReader()
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

    overwritten: set[str] = set()
    writes = in_place_writes([bsym for _, bsym in forward], storages)
    for (i, bsym), (_, stale) in zip(forward, writes):
        overwritten |= stale
        destination = getattr(in_place_destination(bsym), "name", None)
        if destination not in problem.values:
            destination = None
        outs = [p for p in bsym.flat_proxy_outs if p.name not in problem.values]
        if not outs:
            continue
        reads = [p for p in bsym.flat_proxy_args if p.name in problem.values]
        for p in outs:
            add_value(p, False)
        names = tags_of(bsym)
        constant_reads = sum(p.name in constants for p in reads)
        judgement = judge_op(op_facts(bsym, names, outs, reads, constant_reads), policies)
        if i in regather:
            judgement = Judgement(recompute_reason=REGATHER)
        elif i not in in_forward and judgement.hard is None:
            # Thunder's split runs a forward op the forward outputs do not need in the backward,
            # whatever the plan: its outputs are never saved.
            judgement = Judgement(recompute_reason=MOVED_BY_SPLIT)
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
                recompute_reason=judgement.recompute_reason,
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
