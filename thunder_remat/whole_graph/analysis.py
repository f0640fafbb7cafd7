"""Analysis stage of the whole-graph pass: a joint forward+backward trace becomes a plain ``SaveProblem``.

Works on the joint trace Thunder 0.2.6 hands to ``transform_for_execution`` (after the grad
transform, before fusion): forward bound symbols first, then the backward ones, which carry
``BoundSymbolTag.BACKWARD``, then the return, whose ``flat_args`` are the forward inputs.
This is the only stage of the whole-graph pass that reads bound symbols.

The stage reads the trace in three steps, each a function of its own: the forward's values (what
saving each keeps alive), what the backward reads of them, then the forward's ops, each judged
once by the policies and by the structural rules of ``_StructuralRules``.
"""

from __future__ import annotations

from dataclasses import dataclass

from thunder_remat.cost import op_flops, value_bytes
from thunder_remat.policies import Judgement, judge_op
from thunder_remat.storage import StorageMap
from thunder_remat.trace_facts import (STALE_WRITE, TagReader, ThunderSplit, collective_name, forward_storages,
                                       in_place_destination, in_place_writes, is_backward, op_facts,
                                       reads_forward_values, split_joint, thunder_split)
from thunder_remat.whole_graph.problem import ForwardOp, ForwardValue, SaveProblem
from thunder_remat.whole_graph.zero3 import REGATHER, regathered_ops

__all__ = ["build_save_problem", "MOVED_BY_SPLIT"]

MOVED_BY_SPLIT = "not needed by the forward's outputs: Thunder's split runs it in the backward"


def build_save_problem(trace, policies, *, regather_params: bool = False) -> SaveProblem:
    """``regather_params``: FSDP ZeRO-3 is on; gathered parameters are never saved but re-gathered."""
    forward, backward, inputs = split_joint(trace)
    storages = forward_storages(trace)
    split = thunder_split(trace)
    values, made_by = _forward_values(trace, forward, inputs, storages)
    overwritten = _overwritten(forward, values, storages)
    needed, must_save = _read_by_backward(backward, values, split)
    rules = _StructuralRules(
        regathered=frozenset(regathered_ops(forward, inputs)) if regather_params else frozenset(),
        in_forward=frozenset(split.forward),
        stale_owners=frozenset(storages.owner_of(n) for n in needed if n in overwritten),
        storages=storages,
    )
    return SaveProblem(
        values=values,
        ops=_forward_ops(forward, values, made_by, policies, rules),
        needed_by_backward=needed,
        saved_by_thunder=tuple(n for n in split.saved if n in values),
        must_save=must_save,
        overwritten=overwritten,
    )


def _forward_values(trace, forward, inputs, storages: StorageMap) -> tuple[dict[str, ForwardValue], dict[str, int]]:
    """Every forward value by name (the inputs first, then each op's outputs in trace order), and
    for each op output the trace index of the op that makes it first."""
    proxies: dict[str, tuple] = {}  # name -> (proxy, is_input), in the order values are met
    for bsym in trace.bound_symbols[:-1]:
        if not is_backward(bsym):
            for p in bsym.flat_proxy_outs:
                if p.name in inputs:
                    proxies.setdefault(p.name, (p, True))
    for p in trace.bound_symbols[-1].args[0]["flat_args"]:
        if hasattr(p, "name"):
            proxies.setdefault(p.name, (p, True))
    made_by: dict[str, int] = {}
    for i, bsym in forward:
        for p in bsym.flat_proxy_outs:
            if p.name not in proxies:
                proxies[p.name] = (p, False)
                made_by[p.name] = i
    return {name: _forward_value(p, is_input, storages) for name, (p, is_input) in proxies.items()}, made_by


def _forward_value(p, is_input: bool, storages: StorageMap) -> ForwardValue:
    owner = storages.owner_of(p.name)
    return ForwardValue(
        name=p.name,
        nbytes=value_bytes(p),
        is_input=is_input,
        shape=tuple(getattr(p, "shape", ()) or ()),
        dtype=str(getattr(p, "dtype", "")),
        owner=owner,
        storage_bytes=0 if owner in storages.held else storages.owner_bytes.get(owner, value_bytes(p)),
        maybe_view=p.name in storages.maybe_view and not is_input,
    )


def _overwritten(forward, values: dict[str, ForwardValue], storages: StorageMap) -> frozenset[str]:
    """Forward values (not inputs) whose storage a later forward op writes in place."""
    stale: set[str] = set()
    for _, overwritten in in_place_writes([bsym for _, bsym in forward], storages):
        stale |= overwritten
    return frozenset(n for n in stale if not values[n].is_input)


def _read_by_backward(backward, values, split: ThunderSplit) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(forward values the backward reads, in first-use order; those saved whatever the plan).

    Forward ops that Thunder's split moves to the backward are not rewritten, so the forward hands
    over what they read whatever the plan; they count as read by the backward."""
    needed: dict[str, None] = {}
    for _, bsym in backward:
        if reads_forward_values(bsym):
            for p in bsym.flat_proxy_args:
                if p.name in values:
                    needed.setdefault(p.name, None)
    must_save = tuple(n for n in split.saved if n in split.read_by_moved and n in values)
    for name in must_save:
        needed.setdefault(name, None)
    return tuple(needed), must_save


@dataclass(frozen=True)
class _StructuralRules:
    """What the trace's structure decides about an op whatever the policies say."""

    #: forward ops gathering a ZeRO-3 parameter: re-gathered in the backward, never saved
    regathered: frozenset[int]
    #: forward ops Thunder's split keeps in the forward; any other runs in the backward anyway
    in_forward: frozenset[int]
    #: storages the backward reads through a value a later write changes
    stale_owners: frozenset[str]
    storages: StorageMap

    def judge(self, index: int, judgement: Judgement) -> Judgement:
        """The policies' ``judgement`` of forward op ``index``, overruled where the structure decides."""
        if index in self.regathered:
            return Judgement(recompute_reason=REGATHER)
        if index not in self.in_forward and judgement.hard is None:
            # its outputs are never saved: the split runs it in the backward whatever the plan
            return Judgement(recompute_reason=MOVED_BY_SPLIT)
        return judgement

    def write_ban(self, destination: str | None) -> str | None:
        """Why an op writing ``destination`` in place may not run again (a write run again in the
        backward would change what the backward reads from before it), or None."""
        if destination is not None and self.storages.owner_of(destination) in self.stale_owners:
            return STALE_WRITE
        return None


def _forward_ops(forward, values, made_by: dict[str, int], policies, rules: _StructuralRules) -> list[ForwardOp]:
    """One ``ForwardOp`` for every forward op that makes a value first.

    An op fed by nothing but constants (arange, a causal mask from it) makes a constant: Thunder's
    split recomputes those in the backward whatever the plan says, so the plan prices them at
    nothing and never counts them as saved."""
    tags_of = TagReader()
    constants: set[str] = set()
    ops = []
    for i, bsym in forward:
        outs = [p for p in bsym.flat_proxy_outs if made_by.get(p.name) == i]
        if not outs:
            continue
        reads = [p for p in bsym.flat_proxy_args if p.name in values]
        names = tags_of(bsym)
        facts = op_facts(bsym, names, outs, reads, sum(p.name in constants for p in reads))
        judgement = rules.judge(i, judge_op(facts, policies))
        is_constant = judgement.hard is None and all(p.name in constants for p in reads)
        if is_constant:
            constants.update(p.name for p in outs)
        destination = getattr(in_place_destination(bsym), "name", None)
        destination = destination if destination in values else None
        ops.append(
            ForwardOp(
                index=i,
                op=bsym.sym.name,
                outputs=tuple(p.name for p in outs),
                inputs=tuple(dict.fromkeys(p.name for p in reads)),
                cost=0.0 if is_constant else op_flops(bsym, names),
                hard_ban=judgement.hard or rules.write_ban(destination),
                soft_ban=judgement.soft,
                force_recompute=judgement.recompute,
                recompute_reason=judgement.recompute_reason,
                source=_source(bsym),
                collective=collective_name(bsym) is not None,
                writes=destination,
            )
        )
    return ops


def _source(bsym) -> str:
    filename = getattr(bsym, "source_filename", None)
    positions = getattr(bsym, "source_positions", None)
    line = getattr(positions, "lineno", None) if positions is not None else None
    return f"{filename}:{line}" if filename and line else ""
