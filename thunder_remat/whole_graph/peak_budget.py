"""A peak budget (``remat_memory_budget="peak:6GiB"``): the least recompute whose estimated step peak fits.

A saved-bytes budget picks a plan by what the forward hands over; what decides whether a step
fits is its peak, which also holds what the backward recomputes and the gradients it makes. So
this stage walks the plans from the one that recomputes least (those that save more than the
fastest plan and recompute less first, then the frontier; ``frontier_walk``:
each plan gets the copy schedule and checkpoints the options ask for, and may hold the best
rewrite above it), estimates its step peak (``peak.estimate_schedule_peak``) and takes the first
that fits. When none fits
it takes the one with the lowest estimated peak, and the pass warns with both figures.

A lower peak budget never gets a higher estimated peak: it takes a plan that fits it (and so
fits every larger one), or the lowest of all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from thunder_remat.records import Timings
from thunder_remat.whole_graph.checkpoints import CheckpointChoice
from thunder_remat.whole_graph.frontier_walk import walk_frontier, walk_order
from thunder_remat.whole_graph.planner import BudgetChoice, PlanSearch
from thunder_remat.whole_graph.problem import SaveProblem

__all__ = ["PeakChoice", "choose_for_peak"]


@dataclass(frozen=True)
class PeakChoice:
    """The plan and schedule a peak budget chose, and what the search saw."""

    choice: BudgetChoice
    checkpoints: CheckpointChoice
    #: estimated step peak of the chosen rewrite, bytes
    peak: int
    #: the estimate fits the budget (False: no plan fits, the lowest-peak one was taken)
    fits: bool
    #: (saved bytes, estimated step peak) of every plan tried, in the order tried
    tried: tuple[tuple[int, int], ...]


def choose_for_peak(trace, problem: SaveProblem, search: PlanSearch, target: int, *, window, setting,
                    timings: Timings, anchors=None, regions=None, ceiling: int | None = None,
                    above: bool = True) -> PeakChoice:
    """The first plan walked, least recompute first, whose rewrite's estimated step peak is at
    most ``target`` bytes; otherwise the plan with the lowest estimate.
    ``anchors``: the checkpoint anchors' plans (``checkpoints.checkpointed_schedule``);
    ``regions``: the fusion regions the estimates model (``peak.predict_regions``).
    With ``above`` the walk starts above the fastest plan, at the plans that save more and
    recompute less (``PlanSearch.plans_above_fastest``): a budget with room to spare recomputes
    less than 1.0. Without it (the caller's loss runs outside the trace, on top of everything
    saved: ``trace_facts.loss_outside``) it starts at the fastest plan.
    ``ceiling``: the activation bytes Thunder alone saves (``PlanSearch.choose_capped``); where it
    is below the fastest plan's (Thunder recomputes a contraction the policies keep), the walk
    starts at the plan a fraction of 1.0 takes instead, and no plan walked saves more. Above it,
    plans are judged by their estimated peak alone, as every plan of the walk is."""
    tried: list[tuple[int, int]] = []
    lowest = None
    frontier = search.frontier
    plans = list(frontier.plans)
    if ceiling is not None and ceiling < frontier.fastest.saved_bytes:
        top = search.choose_capped(None, ceiling).plan
        plans = [plan for plan in plans if plan.saved_bytes <= top.saved_bytes]
        if top not in plans:
            plans.append(top)
    elif above:
        plans += search.plans_above_fastest()
    plans = sorted(plans, key=walk_order)
    choices = (BudgetChoice(plan, None, True, frontier, frontier.networks) for plan in plans)
    for step in walk_frontier(trace, problem, choices, window=window, setting=setting, timings=timings,
                              anchors=anchors, regions=regions):
        tried.append((step.choice.plan.saved_bytes, step.peak))
        if step.peak <= target:
            return PeakChoice(step.choice, step.checkpoints, step.peak, True, tuple(tried))
        if lowest is None or step.peak < lowest.peak:
            lowest = step
    choice = dataclasses.replace(lowest.choice, target_bytes=None, feasible=False)
    return PeakChoice(choice, lowest.checkpoints, lowest.peak, False, tuple(tried))
