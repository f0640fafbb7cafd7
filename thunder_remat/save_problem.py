"""What the forward could save for backward, as plain data (no thunder import).

The joint-trace analysis fills one ``SaveProblem``; the planner (``save_plan``) solves it. Each
forward operation is one ``ForwardOp``: the values it produces, the values it reads, what it
would cost to run again, and whether (and why) it may not be recomputed in the backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ForwardValue", "ForwardOp", "SaveProblem"]


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
    flops: float
    hard_ban: str | None = None
    soft_ban: str | None = None
    force_recompute: bool = False
    source: str = ""


@dataclass
class SaveProblem:
    """Forward values and ops, and which forward values the backward reads."""

    values: dict[str, ForwardValue] = field(default_factory=dict)
    ops: list[ForwardOp] = field(default_factory=list)
    #: forward values read by backward operations, in first-use order
    needed_by_backward: tuple[str, ...] = ()

    def producer_of(self) -> dict[str, ForwardOp]:
        return {out: op for op in self.ops for out in op.outputs}

    def nbytes(self, names) -> int:
        return sum(self.values[n].nbytes for n in names if not self.values[n].is_input)
