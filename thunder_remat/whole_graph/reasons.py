"""Why a plan saves each value and recomputes each op, said when the plan is chosen.

The whole-graph pass records these with its result (``SavePassResult.reasons``) right after the
solve stage; ``explain()`` prints them as they were recorded. Plain data in, plain data out: the
problem's ops carry the rules' own words (``hard_ban``, ``soft_ban``, ``recompute_reason``), the
plan the solver's choices (kept bans, price).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from thunder_remat.whole_graph.problem import SaveProblem

__all__ = ["PlanReasons", "plan_reasons", "CHOSEN_BY_CUT", "RECOMPUTED_BY_CUT", "SAVED_FOR_ROOM"]

CHOSEN_BY_CUT = "cheaper to save than to recompute (minimum cut)"
RECOMPUTED_BY_CUT = "cheaper to recompute than to save (minimum cut)"
SAVED_FOR_ROOM = "saved to spare its recompute: the peak budget has room above the fastest plan"


@dataclass(frozen=True)
class PlanReasons:
    """Why, per value the plan saves (by name) and per op it recomputes (by op index)."""

    saved: dict = field(default_factory=dict)
    recomputed: dict = field(default_factory=dict)


def plan_reasons(problem: SaveProblem, plan) -> PlanReasons:
    """The reasons for ``plan`` (a ``planner.SavePlan`` of ``problem``)."""
    producer = problem.producer_of()
    saved = {}
    for name in plan.saved:
        value = problem.values.get(name)
        if value is not None and value.is_input:
            saved[name] = "input (held in memory anyway)"
        elif name in producer:
            saved[name] = _saved_reason(producer[name], problem, plan, producer)
    ops = {op.index: op for op in problem.ops}
    recomputed = {i: ops[i].recompute_reason or (f"budget overrules the policy: {ops[i].soft_ban}" if ops[i].soft_ban
                                                 else RECOMPUTED_BY_CUT)
                  for i in plan.recomputed}
    return PlanReasons(saved, recomputed)


def _saved_reason(op, problem: SaveProblem, plan, producer) -> str:
    if op.hard_ban:
        return f"cannot be recomputed: {op.hard_ban}"
    if op.index in plan.kept_bans and op.soft_ban:
        return f"policy keeps it: {op.soft_ban}"
    if op.index in plan.kept_bans:
        return SAVED_FOR_ROOM
    if op.soft_ban and plan.price > 0:
        return (f"budget: cheaper to save than to recompute at the plan's price of {plan.price:.3g} B per "
                f"{problem.cost_unit} ({op.soft_ban})")
    if op.soft_ban:
        return f"budget: {op.soft_ban} kept as the knapsack chose"
    blocked = [f"{dep} ({producer[dep].op}: {producer[dep].hard_ban})" for dep in op.inputs
               if dep in producer and producer[dep].hard_ban and dep not in plan.saved]
    if blocked:
        return CHOSEN_BY_CUT + "; recomputing needs " + ", ".join(blocked)
    return CHOSEN_BY_CUT
