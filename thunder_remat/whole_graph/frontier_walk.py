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

Holding a rewrite above means recomputing, when the backward starts, values that plan saves; a
plan that saves other values in their place can still end above it. So where a plan's rewrite
is estimated above the lowest one walked, the walk also tries the plan nested within that
rewrite: within the same byte target, the least recompute that saves only values the lower plan
saves (``problem.nested_within``), holding the lower rewrite. It recomputes more than the
frontier's plan (which had the least recompute in the target), so it is taken only when its
estimate is lower by ``AUTO_MIN_GAIN`` or more, the checkpoint search's rule (the estimate is good
to a few percent, and a smaller difference is not worth the recompute), and only when it
recomputes no more than the next frontier plan below: a plan that recomputes more than that one
could be beaten by it at a lower budget, and a peak budget, walking plans by recompute, would take
it before a plan that recomputes less.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

from thunder_remat.budget import Budget
from thunder_remat.records import Timings
from thunder_remat.trace_facts import forward_storages
from thunder_remat.whole_graph.checkpoints import (AUTO_MIN_GAIN, CheckpointChoice, checkpointed_schedule,
                                                   held_schedules)
from thunder_remat.whole_graph.peak import estimate_schedule_peak
from thunder_remat.whole_graph.planner import BudgetChoice, Frontier, PlanSearch, build_frontier
from thunder_remat.whole_graph.problem import SaveProblem, nested_within

__all__ = ["WalkStep", "walk_order", "walk_frontier", "plans_ahead", "held_rewrites"]

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
    nested_searches: dict = {}  # the plan nested within -> the search over its nested problem
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
        if setting == "auto" and lowest is not None and peak > lowest.peak:
            below = [p.recompute_cost for p in choice.frontier.plans if walk_order(p) > walk_order(choice.plan)]
            nested = _nested_step(trace, problem, choice, lowest, nested_searches, min(below, default=math.inf),
                                  window=window, timings=timings, anchors=anchors, regions=regions, names=names,
                                  storages=storages)
            if nested is not None and nested.peak <= (1.0 - AUTO_MIN_GAIN) * peak:
                log.info("frontier walk: plan %d nested within the plan saving %d B: saves %d B, estimated step "
                         "peak %d B (recompute %.3g, was %.3g)", n, lowest.choice.plan.saved_bytes,
                         nested.choice.plan.saved_bytes, nested.peak, nested.choice.plan.recompute_cost,
                         choice.plan.recompute_cost)
                step = nested
        yield step
        if lowest is None or step.peak < lowest.peak:
            lowest = step


def _nested_step(trace, problem: SaveProblem, choice: BudgetChoice, lowest: WalkStep, searches: dict,
                 most_recompute: float, **schedule) -> WalkStep | None:
    """``choice``'s byte target planned nested within ``lowest``'s rewrite, holding it; or, where
    ``lowest`` is itself nested and fits the target, its rewrite as it is, if that is lower (None:
    neither recomputes at most ``most_recompute``, or the nested plan is the frontier's own).
    ``searches``: the nested problems' searches so far, by the plan they nest within (several
    plans may nest within one)."""
    target = choice.plan.saved_bytes if choice.target_bytes is None else choice.target_bytes
    timings = schedule["timings"]
    with timings.stage("solve"):
        search = searches.get(lowest.choice.plan.key)
        if search is None:
            nested = nested_within(problem, lowest.choice.plan.saved)
            search = searches[lowest.choice.plan.key] = PlanSearch(build_frontier(nested, choice.frontier.solver))
        picked = search.choose(Budget.bytes(target))
    reused = None
    if (lowest.choice.within is not None and lowest.choice.plan.saved_bytes <= target
            and lowest.choice.plan.recompute_cost <= most_recompute):
        reused = WalkStep(dataclasses.replace(lowest.choice, target_bytes=choice.target_bytes), lowest.checkpoints,
                          lowest.peak)
    if (not picked.feasible or picked.plan.key in (choice.plan.key, lowest.choice.plan.key)
            or picked.plan.recompute_cost > most_recompute):
        return reused
    within = dataclasses.replace(choice, plan=picked.plan, networks=picked.networks, within=lowest.choice.plan)
    checkpoints = checkpointed_schedule(trace, problem, within, setting="auto", inherit=_anchors_of(lowest),
                                        **schedule)
    peak = checkpoints.peak_estimate
    if peak is None:
        with timings.stage("estimate"):
            peak = estimate_schedule_peak(checkpoints.schedule, schedule["storages"], schedule["regions"])
    if reused is not None and reused.peak <= peak:
        return reused
    return WalkStep(within, checkpoints, peak)


def held_rewrites(trace, problem: SaveProblem, step: WalkStep, above: WalkStep, *, window, timings: Timings,
                  regions=None) -> tuple[CheckpointChoice, ...]:
    """``step``'s plan holding ``above``'s rewrite (``checkpoints.held_schedules``), for a caller
    that compares rewrites once each backward runs in its own order, which the walk's estimates
    (in the trace's order) do not see."""
    return held_schedules(trace, problem, step.choice, _anchors_of(above), window=window, timings=timings,
                          regions=regions, plain_peak=step.checkpoints.peak_estimate_without_checkpoints)


def _anchors_of(step: WalkStep) -> tuple:
    """The anchors that make a plan below hold ``step``'s rewrite: its plan first, then its own anchors."""
    frontier = step.choice.frontier
    low, high = frontier.smallest.saved_bytes, frontier.fastest.saved_bytes
    fraction = round((step.choice.plan.saved_bytes - low) / (high - low), 4) if high > low else 1.0
    return ((fraction, step.choice.plan), *step.checkpoints.anchors)


def _held_above(checkpoints: CheckpointChoice, inherit) -> bool:
    """The rewrite holds the inherited anchors (for the log)."""
    return bool(inherit) and bool(checkpoints.anchors) and checkpoints.anchors[0][1] is inherit[0][1]
