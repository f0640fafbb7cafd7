"""Backward checkpoints: which recomputed values the backward holds, and where the rest are made again.

A plan far below the fastest recomputes most of the forward; recomputed once, at first use, all
of it runs when the backward starts and every matmul output it makes stays alive until its
layer's backward. A checkpoint level, anchored at the plan a larger budget would choose, holds
that plan's values (recomputed, only while the backward runs) and recomputes the rest from them
near their use, bringing the step's peak down to about the anchor plan's.

``remat_checkpoint_budget`` names the anchors, or "auto" tries ``AUTO_ANCHORS`` and keeps the one
whose copy schedule has the lowest estimated step peak (``peak``), if it gains enough.
Plain records in, a ``CheckpointChoice`` out; the schedule is the rewrite's (no bound symbol is
built for the candidates "auto" drops).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from thunder_remat.records import Timings
from thunder_remat.trace_facts import forward_storages
from thunder_remat.whole_graph.peak import estimate_schedule_peak
from thunder_remat.whole_graph.planner import BudgetChoice
from thunder_remat.whole_graph.problem import SaveProblem
from thunder_remat.whole_graph.rewrite import CopySchedule, schedule_copies

__all__ = ["AUTO_ANCHORS", "AUTO_MIN_GAIN", "AUTO_TIE", "Candidate", "CheckpointChoice", "anchor_fractions",
           "backward_checkpoints", "choose_anchor", "copy_schedule", "checkpointed_schedule", "held_schedules",
           "storage_makers_and_views"]

#: "auto" tries the plans at these budget fractions as checkpoint anchors ...
AUTO_ANCHORS = (0.1, 0.2, 0.3, 0.5, 0.7)
#: ... and uses the best only if it lowers the estimated step peak by at least this fraction
#: (see docs/benchmarks.md for the measurements behind it)
AUTO_MIN_GAIN = 0.02
#: The estimate is off by several percent against measured peaks, so anchors whose estimates lie
#: within this fraction of the lowest count as tied; the tie goes to the largest anchor, whose
#: rewrite recomputes least.
AUTO_TIE = 0.03


@dataclass(frozen=True)
class CheckpointChoice:
    """The copy schedule the rewrite builds, and the checkpoints behind it."""

    schedule: CopySchedule
    #: (anchor budget fraction, recomputed ops held) per level, outermost first; empty: none
    levels: tuple[tuple[float, frozenset[int]], ...] = ()
    #: "auto" only: estimated step peaks of the schedule chosen and of the one without checkpoints
    peak_estimate: int | None = None
    peak_estimate_without_checkpoints: int | None = None
    #: "auto" only: the estimated step peak with each anchor chain tried (a tuple of fractions)
    anchor_estimates: dict = field(default_factory=dict)
    #: "auto" only: (anchor fraction, anchor plan) per level, so a plan that saves less can hold them
    anchors: tuple = ()
    #: "auto" only: the rewrite without checkpoints when checkpoints were chosen, so that the two
    #: can be compared again once the backward of each runs in its own lowest-peak order
    alternatives: tuple[CheckpointChoice, ...] = ()


def anchor_fractions(setting) -> tuple[float, ...]:
    """The budget fractions whose plans a ``remat_checkpoint_budget`` setting may anchor
    checkpoints at (the solve stage chooses their plans: ``PlanSearch.anchor_plans``)."""
    if setting is False or setting is None:
        return ()
    if setting == "auto":
        return AUTO_ANCHORS
    return tuple(float(f) for f in (setting if isinstance(setting, tuple) else (setting,)))


def backward_checkpoints(problem: SaveProblem, choice: BudgetChoice, fractions,
                         anchors: dict) -> tuple[tuple[float, frozenset[int]], ...]:
    """One level per budget in ``fractions``, nearest the chosen plan first, anchored at the plan
    that budget chooses (``anchors``: fraction -> plan, from the solve stage); a level is left out
    if its plan saves no more than the chosen one or adds no op. With a second level, the backward
    holds the first anchor's values and recomputes the second's from them where they are first
    needed, as the first anchor's own backward would (see ``schedule_copies``).
    """
    return tuple((fraction, ops) for fraction, ops, _ in _anchored_levels(problem, choice, fractions, anchors))


def _anchored_levels(problem: SaveProblem, choice: BudgetChoice, fractions, anchors: dict) -> tuple:
    """``backward_checkpoints``' levels with each one's anchor plan: (fraction, ops, plan). The
    solve stage chose plans only for the fractions whose target is above its plan's saved bytes;
    the others save no more than the chosen plan (a budget's plan never saves more than its
    target), so they would give no level anyway."""
    if choice.frontier is None:
        return ()
    held = [(float(f), anchors[float(f)]) for f in sorted(fractions) if float(f) in anchors]
    return levels_for_anchors(problem, choice.plan, held)


def levels_for_anchors(problem: SaveProblem, plan, anchors) -> tuple:
    """The checkpoint levels of ``plan`` held at ``anchors`` ((fraction, anchor plan), nearest
    first): per anchor, the ops ``plan`` recomputes that make a value the anchor saves and no
    nearer anchor (nor ``plan`` itself) does, as (fraction, ops, anchor plan). An anchor that saves
    no more than ``plan``, or adds no op, gives no level."""
    recomputed = set(plan.recomputed)
    covered = set(plan.saved)
    levels = []
    for fraction, anchor in anchors:
        if anchor.saved_bytes <= plan.saved_bytes:
            continue
        held = set(anchor.saved) - covered
        covered |= held
        level = frozenset(op.index for op in problem.ops if op.index in recomputed and held.intersection(op.outputs))
        if level:
            levels.append((fraction, level, anchor))
    return tuple(levels)


def copy_schedule(trace, problem: SaveProblem, plan, window, checkpoints=(), names=None, early=False) -> CopySchedule:
    """Where the backward makes each recomputed value again, holding ``checkpoints`` (op sets);
    ``names``: the trace's ``trace_names`` when several schedules of it are made; ``early``: the
    outermost level is made when the backward starts (``schedule_copies``)."""
    # Re-gathers (FSDP ZeRO-3) are recomputed by rule but are collectives: never issued twice.
    held = frozenset().union(*checkpoints)
    cheap = frozenset(op.index for op in problem.ops
                      if op.soft_ban is None and op.hard_ban is None and not op.collective) - held
    recomputed = set(plan.recomputed)
    segments = frozenset(op.index for op in problem.ops if op.index in recomputed and not op.collective
                         and op.index not in held and op.index not in cheap)
    # a cheap op that makes storage of its own may be made again at every far use rather than held,
    # if it reads no recomputed value, and so may its views (``rewrite.remade_at_every_far_use``)
    unbounded, views = storage_makers_and_views(problem, cheap & recomputed)
    return schedule_copies(trace, plan.recomputed, window=window, cheap=cheap, checkpoints=checkpoints,
                           segments=segments, names=names, early=early, unbounded=unbounded, views=views)


def storage_makers_and_views(problem: SaveProblem, indices) -> tuple[frozenset[int], frozenset[int]]:
    """Of the ops at ``indices``: those that make storage of their own, and those whose outputs all
    view another value's storage."""
    owns = {op.index: [problem.values[out].owner == out for out in op.outputs if out in problem.values]
            for op in problem.ops if op.index in indices}
    return (frozenset(i for i, own in owns.items() if any(own)),
            frozenset(i for i, own in owns.items() if own and not any(own)))


@dataclass
class Candidate:
    """One checkpoint setting tried by "auto": its anchor chain, levels and estimated step peak;
    its copy schedule is kept only while it can still be chosen."""

    chain: tuple
    levels: tuple
    peak: int
    schedule: object = None


def choose_anchor(plain_peak: int, candidates):
    """The "auto" rule: of the candidates whose estimated peak is at least ``AUTO_MIN_GAIN`` below
    the rewrite without checkpoints, those within ``AUTO_TIE`` of the lowest tie, and the tie
    goes to the last (the largest anchor, which recomputes least). None if none gains enough.
    Only candidates that pass the minimum gain on their own take part in the tie."""
    qualifying = [c for c in candidates if c.peak <= (1.0 - AUTO_MIN_GAIN) * plain_peak]
    if not qualifying:
        return None
    lowest = min(c.peak for c in qualifying)
    return [c for c in qualifying if c.peak <= (1.0 + AUTO_TIE) * lowest][-1]


def checkpointed_schedule(trace, problem: SaveProblem, choice: BudgetChoice, *, window, setting,
                          timings: Timings, anchors=None, regions=None, inherit=(), names=None,
                          storages=None) -> CheckpointChoice:
    """The copy schedule with the checkpoints ``setting`` asks for (``remat_checkpoint_budget``:
    False, a fraction or tuple of fractions, or "auto"); time goes to ``timings``; ``anchors``:
    fraction -> the plan that budget chooses, for every fraction of ``anchor_fractions(setting)``
    whose target is above ``choice``'s saved bytes (``PlanSearch.anchor_plans``): this stage
    solves nothing; ``regions``: the fusion regions the estimates model
    (``peak.predict_regions``; None: no fusion).

    ``inherit`` ("auto" only): (fraction, plan) anchors, nearest first, of the lowest-peak rewrite
    found for a plan that saves more (``frontier_walk``); holding them is one more candidate, taken
    if its estimate is lower than every other. ``names``, ``storages``: the trace's
    ``trace_names`` and ``forward_storages(trace, with_backward=True)`` when already known.
    """
    candidates = _Candidates(trace, problem, choice, window, timings, anchors, regions, names, storages)
    if window is None or setting is False or choice.frontier is None:
        return CheckpointChoice(candidates.schedule())
    if setting != "auto":
        levels = backward_checkpoints(problem, choice, anchor_fractions(setting), anchors)
        return CheckpointChoice(candidates.schedule(tuple(ops for _, ops in levels)), levels)
    ops = {op.index: op for op in problem.ops}
    plain = candidates.schedule()
    cheap_only = not any(ops[i].soft_ban for i in choice.plan.recomputed)
    if cheap_only and not inherit:
        return CheckpointChoice(plain)  # only cheap ops recomputed: the window alone bounds what is held
    plain_peak = candidates.estimate(plain)
    best = None if cheap_only else _best_anchor_chain(candidates, plain_peak)
    if inherit:
        best = _held_above(candidates, inherit, best, plain_peak)
    if best is None:
        return CheckpointChoice(plain, (), plain_peak, plain_peak, candidates.estimates)
    levels = tuple((fraction, ops) for fraction, ops, _ in best.levels)
    anchors = tuple((fraction, anchor) for fraction, _, anchor in best.levels)
    without = CheckpointChoice(plain, (), plain_peak, plain_peak, candidates.estimates)
    return CheckpointChoice(best.schedule, levels, best.peak, plain_peak, candidates.estimates, anchors, (without,))


def held_schedules(trace, problem: SaveProblem, choice: BudgetChoice, held, *, window, timings: Timings,
                   regions=None, plain_peak: int | None = None, names=None,
                   storages=None) -> tuple[CheckpointChoice, ...]:
    """``choice``'s plan holding the rewrite ``held`` names ((fraction, plan) anchors, nearest
    first, as ``inherit`` in ``checkpointed_schedule``), made when the backward starts and, with
    backward fusion regions, at first use too (``_held_above``'s two ways), each with its
    estimated step peak; empty where holding adds no checkpoint. ``plain_peak``: the estimate of
    the plan's rewrite without checkpoints, for the records."""
    candidates = _Candidates(trace, problem, choice, window, timings, None, regions, names, storages)
    chain = tuple(fraction for fraction, _ in held)
    fused = regions is not None and regions.fuses_any
    made = []
    for early in (True, False) if fused else (True,):
        candidate = candidates.attempt(chain, held, early=early)
        if candidate is None:
            continue
        levels = tuple((fraction, ops) for fraction, ops, _ in candidate.levels)
        anchors = tuple((fraction, anchor) for fraction, _, anchor in candidate.levels)
        made.append(CheckpointChoice(candidate.schedule, levels, candidate.peak, plain_peak, dict(candidates.estimates),
                                     anchors))
    return tuple(made)


@dataclass
class _Candidates:
    """Makes and estimates the copy schedules one checkpoint search tries; every schedule and
    estimate of the trace shares its names and storages, and each anchor chain's lowest estimate
    is kept (``CheckpointChoice.anchor_estimates``)."""

    trace: object
    problem: SaveProblem
    choice: BudgetChoice
    window: object
    timings: Timings
    anchors: dict | None
    regions: object
    names: object = None
    storages: object = None
    estimates: dict = field(default_factory=dict)
    tried: set = field(default_factory=set)

    def schedule(self, checkpoints=(), early=False) -> CopySchedule:
        with self.timings.stage("rewrite"):
            made = copy_schedule(self.trace, self.problem, self.choice.plan, self.window, checkpoints, self.names,
                                 early)
        self.names = made.names
        return made

    def estimate(self, schedule: CopySchedule) -> int:
        with self.timings.stage("estimate"):
            if self.storages is None:
                self.storages = forward_storages(self.trace, with_backward=True)
            return estimate_schedule_peak(schedule, self.storages, self.regions)

    def attempt(self, chain, held_at=None, early=False) -> Candidate | None:
        """The candidate holding the anchors of ``chain`` (or the (fraction, plan) anchors
        ``held_at``); None if it holds nothing or was tried already."""
        if held_at is None:
            levels = _anchored_levels(self.problem, self.choice, chain, self.anchors)
        else:
            levels = levels_for_anchors(self.problem, self.choice.plan, held_at)
        held = tuple(ops for _, ops, _ in levels)
        if not held or (held, early) in self.tried:
            return None
        self.tried.add((held, early))
        schedule = self.schedule(held, early)
        peak = self.estimate(schedule)
        # an inherited chain is tried made early and late: the lower counts
        self.estimates[chain] = min(peak, self.estimates.get(chain, peak))
        return Candidate(chain, levels, peak, schedule)


def _best_anchor_chain(candidates: _Candidates, plain_peak: int) -> Candidate | None:
    """The best single anchor ("auto" rule, ``choose_anchor``), then nested with the nearest anchor
    below it if that lowers the estimate by ``AUTO_MIN_GAIN``; None if no anchor gains enough."""
    singles = []
    for fraction in AUTO_ANCHORS:
        candidate = candidates.attempt((fraction,))
        if candidate is None:
            continue
        singles.append(candidate)
        _let_go(plain_peak, singles)
    best = choose_anchor(plain_peak, singles)
    if best is None:
        return None
    # Nest: hold the nearest anchor's values (the smallest anchor that gives another rewrite) and
    # recompute the chosen anchor's from them, as the nearest plan's own backward would. (On the
    # built-in models the nearest was also the best of all nearer anchors, for one rewrite instead
    # of up to four.)
    for fraction in (f for f in AUTO_ANCHORS if f < best.chain[0]):
        nested = candidates.attempt((fraction, *best.chain))
        if nested is not None:
            return nested if nested.peak <= (1.0 - AUTO_MIN_GAIN) * best.peak else best
    return best


def _held_above(candidates: _Candidates, inherit, best: Candidate | None, plain_peak: int) -> Candidate | None:
    """``best``, or the lowest-peak rewrite of a plan that saves more, held (``inherit``) if its
    estimate is lower: its saved values and checkpoints made when the backward starts, where it
    holds least without fusion; with backward fusion regions they then run in the first region,
    which holds them to its end, so made at first use is tried too, and the estimate (which cuts
    the regions of each rewrite) picks."""
    chain = tuple(fraction for fraction, _ in inherit)
    fused = candidates.regions is not None and candidates.regions.fuses_any
    for held_above in [candidates.attempt(chain, inherit, early=True)] + (
            [candidates.attempt(chain, inherit)] if fused else []):
        if held_above is not None and held_above.peak < (plain_peak if best is None else best.peak):
            best = held_above
    return best


def _let_go(plain_peak: int, candidates) -> None:
    """Drop the schedules of candidates that can no longer be chosen: those short of the minimum
    gain, and those above the tie band of the lowest so far (the lowest only falls)."""
    limit = (1.0 - AUTO_MIN_GAIN) * plain_peak
    lowest = min((c.peak for c in candidates if c.peak <= limit), default=None)
    for c in candidates:
        if lowest is None or c.peak > limit or c.peak > (1.0 + AUTO_TIE) * lowest:
            c.schedule = None
