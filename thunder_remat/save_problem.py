"""What the forward could save for backward, as plain data (no thunder import).

The joint-trace analysis fills one ``SaveProblem``; the planner (``save_plan``) solves it. Each
forward operation is one ``ForwardOp``: the values it produces, the values it reads, what it
would cost to run again, and whether (and why) it may not be recomputed in the backward.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

__all__ = ["ForwardValue", "ForwardOp", "SaveProblem", "with_measured_costs"]


@dataclass(frozen=True)
class ForwardValue:
    """A value the forward computes or receives."""

    name: str
    nbytes: int
    #: a forward input (argument or parameter): held anyway, so saving it costs nothing extra
    is_input: bool = False
    shape: tuple = ()
    dtype: str = ""


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
    source: str = ""
    #: a communication op (a ZeRO-3 re-gather): the backward never issues it twice
    collective: bool = False


@dataclass
class SaveProblem:
    """Forward values and ops, and which forward values the backward reads."""

    values: dict[str, ForwardValue] = field(default_factory=dict)
    ops: list[ForwardOp] = field(default_factory=list)
    #: forward values read by backward operations, in first-use order
    needed_by_backward: tuple[str, ...] = ()
    #: unit of every op's ``cost``: "flops" (estimated from shapes) or "us" (measured microseconds)
    cost_unit: str = "flops"

    def producer_of(self) -> dict[str, ForwardOp]:
        return {out: op for op in self.ops for out in op.outputs}

    def nbytes(self, names) -> int:
        return sum(self.values[n].nbytes for n in names if not self.values[n].is_input)


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
    return SaveProblem(values=dict(problem.values), ops=ops, needed_by_backward=problem.needed_by_backward,
                       cost_unit="us")
