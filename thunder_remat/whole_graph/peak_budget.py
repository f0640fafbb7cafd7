"""A peak budget (``remat_memory_budget="peak:6GiB"``): the least recompute whose estimated step peak fits.

A saved-bytes budget picks a plan by what the forward hands over; what decides whether a step
fits is its peak, which also holds what the backward recomputes and the gradients it makes. So
this stage walks the frontier of plans from the one that recomputes least, gives each the copy
schedule and checkpoints the options ask for (``checkpoints.checkpointed_schedule``), estimates
its step peak (``peak.estimate_schedule_peak``) and takes the first that fits. When none fits
it takes the one with the lowest estimated peak, and the pass warns with both figures.

A lower peak budget never gets a higher estimated peak: it takes a plan that fits it (and so
fits every larger one), or the lowest of all.
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

__all__ = ["PeakChoice", "choose_for_peak"]

log = logging.getLogger(__name__)


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


def choose_for_peak(trace, problem: SaveProblem, frontier: Frontier, target: int, *, window, setting,
                    timings: Timings, regions=None) -> PeakChoice:
    """The first plan of ``frontier``, least recompute first, whose rewrite's estimated step peak
    is at most ``target`` bytes; otherwise the plan with the lowest estimate. ``regions``: the
    backward fusion regions the estimates model (``peak.predict_regions``)."""
    storages = None  # the trace's storages, forward and backward: shared by every estimate
    tried: list[tuple[int, int]] = []
    lowest = None
    plans = sorted(frontier.plans, key=lambda p: (p.recompute_cost, -p.saved_bytes, p.key))
    for n, plan in enumerate(plans, start=1):
        choice = BudgetChoice(plan, None, True, frontier, frontier.networks)
        checkpoints = checkpointed_schedule(trace, problem, choice, window=window, setting=setting, timings=timings,
                                            regions=regions)
        peak = checkpoints.peak_estimate
        if peak is None:
            with timings.stage("estimate"):
                if storages is None:
                    storages = forward_storages(trace, with_backward=True)
                peak = estimate_schedule_peak(checkpoints.schedule, storages, regions)
        tried.append((plan.saved_bytes, peak))
        log.info("peak budget %d B: plan %d of %d saves %d B, estimated step peak %d B", target, n, len(plans),
                 plan.saved_bytes, peak)
        if peak <= target:
            return PeakChoice(choice, checkpoints, peak, True, tuple(tried))
        if lowest is None or peak < lowest[2]:
            lowest = (choice, checkpoints, peak)
    choice, checkpoints, peak = lowest
    return PeakChoice(BudgetChoice(choice.plan, None, False, frontier, frontier.networks), checkpoints, peak, False,
                      tuple(tried))
