"""Walk the frontier from the plan that recomputes least, each plan able to hold the best rewrite above it.

A plan that saves less is not bound to a higher step peak: its backward may hold, recomputed
when the backward starts, exactly what a plan above it saves, and recompute the rest from there
as that plan's backward would. So each plan of the walk gets its own checkpoint search ("auto",
``checkpoints.checkpointed_schedule``) plus one candidate more: the anchors of the lowest-peak
rewrite found so far, with that rewrite's plan as the nearest anchor. Each plan's rewrite
depends only on the plans walked before it, whichever budget asked, so the estimated step peak
falls (up to what recomputing the held values at the backward start adds) as the budget falls:
budgets by fraction or bytes walk down to the plan they chose, a peak budget down to the first
plan that fits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from thunder_remat.records import Timings
from thunder_remat.trace_facts import forward_storages
from thunder_remat.whole_graph.checkpoints import CheckpointChoice, checkpointed_schedule
from thunder_remat.whole_graph.peak import estimate_schedule_peak
from thunder_remat.whole_graph.planner import BudgetChoice, Frontier
from thunder_remat.whole_graph.problem import SaveProblem

__all__ = ["WalkStep", "walk_order", "walk_frontier", "plans_ahead"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WalkStep:
    """One plan of the walk: its choice, its rewrite's copy schedule and checkpoints, the estimate."""

    choice: BudgetChoice
    checkpoints: CheckpointChoice
    #: estimated step peak of the rewrite, bytes
    peak: int


def walk_order(plan) -> tuple:
    """The walk's order: least recompute first, then most saved (then the plan's key: deterministic)."""
    return (plan.recompute_cost, -plan.saved_bytes, plan.key)


def plans_ahead(frontier: Frontier, plan) -> list:
    """The frontier's plans the walk visits before ``plan``: those that save more and recompute less."""
    return sorted((p for p in frontier.plans if p.saved_bytes > plan.saved_bytes
                   and walk_order(p) < walk_order(plan)), key=walk_order)


def walk_frontier(trace, problem: SaveProblem, choices, *, window, setting, timings: Timings, anchors=None,
                  regions=None):
    """Yield a ``WalkStep`` for each of ``choices`` (``BudgetChoice``, in ``walk_order``).

    With ``setting`` "auto" each plan may also hold the lowest-peak rewrite of the plans before it
    (see the module docstring); with other settings each gets the checkpoints ``setting`` names.
    ``anchors``: the anchor plans (``checkpoints.checkpointed_schedule``).
    """
    choices = list(choices)
    storages = None  # the trace's storages and names, shared by every schedule and estimate
    names = None
    lowest: WalkStep | None = None
    for n, choice in enumerate(choices, start=1):
        if storages is None:
            with timings.stage("estimate"):
                storages = forward_storages(trace, with_backward=True)
        inherit = _anchors_of(lowest) if setting == "auto" and lowest is not None else ()
        checkpoints = checkpointed_schedule(trace, problem, choice, window=window, setting=setting, timings=timings,
                                            anchors=anchors, regions=regions, inherit=inherit, names=names,
                                            storages=storages)
        names = checkpoints.schedule.names
        peak = checkpoints.peak_estimate
        if peak is None:
            with timings.stage("estimate"):
                peak = estimate_schedule_peak(checkpoints.schedule, storages, regions)
        step = WalkStep(choice, checkpoints, peak)
        log.info("frontier walk: plan %d of %d saves %d B, estimated step peak %d B%s", n, len(choices),
                 choice.plan.saved_bytes, peak, " (holding the rewrite above)" if _held_above(checkpoints, inherit)
                 else "")
        yield step
        if lowest is None or peak < lowest.peak:
            lowest = step


def _anchors_of(step: WalkStep) -> tuple:
    """The anchors that make a plan below hold ``step``'s rewrite: its plan first, then its own anchors."""
    frontier = step.choice.frontier
    low, high = frontier.smallest.saved_bytes, frontier.fastest.saved_bytes
    fraction = round((step.choice.plan.saved_bytes - low) / (high - low), 4) if high > low else 1.0
    return ((fraction, step.choice.plan), *step.checkpoints.anchors)


def _held_above(checkpoints: CheckpointChoice, inherit) -> bool:
    """The rewrite holds the inherited anchors (for the log)."""
    return bool(inherit) and bool(checkpoints.anchors) and checkpoints.anchors[0][1] is inherit[0][1]
