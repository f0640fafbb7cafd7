"""What the forward could save for backward, as plain data (no thunder import).

The analysis stage (``whole_graph.analysis``) fills one ``SaveProblem``; the planner (``whole_graph.planner``) solves it. Each
forward operation is one ``ForwardOp``: the values it produces, the values it reads, what it
would cost to run again, and whether (and why) it may not be recomputed in the backward.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

__all__ = ["ForwardValue", "ForwardOp", "SaveProblem", "with_measured_costs", "nested_within"]


@dataclass(frozen=True)
class ForwardValue:
    """A value the forward computes or receives.

    What saving it costs is the storage it keeps alive (``thunder_remat.storage``): a view keeps
    its base's, a view of an input nothing beyond the input.
    """

    name: str
    #: numel x itemsize of the value itself
    nbytes: int
    #: a forward input (argument or parameter): held anyway, so saving it costs nothing extra
    is_input: bool = False
    shape: tuple = ()
    dtype: str = ""
    #: the value owning the storage this one uses (its own name for a fresh tensor)
    owner: str = ""
    #: bytes of that storage that saving this value keeps alive (0 when an input owns it)
    storage_bytes: int | None = None
    #: an op may return it as a view of one of its inputs: never saved (unless its op may not
    #: run again); its base is saved or it is recomputed in the backward, for free
    maybe_view: bool = False

    @property
    def held_bytes(self) -> int:
        if self.is_input:
            return 0
        return self.nbytes if self.storage_bytes is None else self.storage_bytes


@dataclass(frozen=True)
class ForwardOp:
    """One forward operation, as the planner sees it.

    ``hard_ban`` names why it may never run again in the backward (random without exact replay,
    in place, a collective, a Thunder tag); ``soft_ban`` names the policy that prefers saving its
    outputs (matmul, small reduction), which the memory budget may overrule. ``force_recompute``
    marks ops Thunder was told to recompute (``RECOMPUTE_IN_BACKWARD``).
    """

    index: int
    op: str
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]
    #: what running it again costs, in the problem's ``cost_unit``
    cost: float
    hard_ban: str | None = None
    soft_ban: str | None = None
    force_recompute: bool = False
    #: why ``force_recompute`` (the rule that asked for it)
    recompute_reason: str | None = None
    source: str = ""
    #: a communication op (a ZeRO-3 re-gather): the backward never issues it twice
    collective: bool = False
    #: the value it writes in place (``copy_``'s destination): it runs again only with that value
    writes: str | None = None


@dataclass
class SaveProblem:
    """Forward values and ops, and which forward values the backward reads."""

    values: dict[str, ForwardValue] = field(default_factory=dict)
    ops: list[ForwardOp] = field(default_factory=list)
    #: forward values read by backward operations, in first-use order
    needed_by_backward: tuple[str, ...] = ()
    #: unit of every op's ``cost``: "flops" (estimated from shapes) or "us" (measured microseconds)
    cost_unit: str = "flops"
    #: forward values Thunder's own forward/backward split saves for this trace (without the pass)
    saved_by_thunder: tuple[str, ...] = ()
    #: forward values that are saved whatever the plan (read by forward ops that Thunder's split
    #: runs in the backward, which the rewrite does not touch)
    must_save: tuple[str, ...] = ()
    #: forward values whose storage a later in-place write changes: never saved (the backward
    #: would read the new data); they are recomputed, or the write is
    overwritten: frozenset = frozenset()
    #: the only values a plan may save (inputs are held anyway); None: any value
    #: (``nested_within``)
    savable: frozenset | None = None

    def may_save(self, name: str) -> bool:
        """Whether a plan may save ``name`` (its storage bytes aside)."""
        return name not in self.overwritten and (self.savable is None or name in self.savable)

    def producer_of(self) -> dict[str, ForwardOp]:
        return {out: op for op in self.ops for out in op.outputs}

    def storage_bytes(self, names) -> int:
        """Bytes of the distinct storages saving ``names`` keeps alive (inputs' left out)."""
        owners: dict[str, int] = {}
        for n in names:
            value = self.values[n]
            if value.held_bytes:
                owners.setdefault(value.owner or n, value.held_bytes)
        return sum(owners.values())


def nested_within(problem: SaveProblem, saved) -> SaveProblem:
    """``problem`` whose plans save only values of ``saved`` (a plan's saved set): a plan nested
    within another keeps, of what that one saves, what its byte target lets it, and recomputes the
    rest from there. A soft ban of an op none of whose outputs may be saved is dropped (keeping it
    could only save what may not be)."""
    savable = frozenset(saved) | frozenset(problem.must_save)
    if problem.savable is not None:
        savable &= problem.savable
    ops = [op if op.soft_ban is None or any(n in savable for n in op.outputs) else replace(op, soft_ban=None)
           for op in problem.ops]
    return replace(problem, values=dict(problem.values), ops=ops, savable=savable)


def with_measured_costs(problem: SaveProblem, micros: dict[int, float]) -> SaveProblem:
    """``problem`` with op costs in measured microseconds (``micros``: op index -> us).

    An op with a flop estimate but no measurement (it could not run alone) is priced at the
    median microseconds-per-flop of the measured ops, so both kinds stay comparable; an op with
    no flops (a view) costs nothing either way.
    """
    rates = [micros[op.index] / op.cost for op in problem.ops if op.index in micros and op.cost > 0]
    rate = statistics.median(rates) if rates else 0.0
    ops = [
        replace(op, cost=float(micros[op.index]) if op.index in micros else op.cost * rate)
        for op in problem.ops
    ]
    return replace(problem, values=dict(problem.values), ops=ops, cost_unit="us")
