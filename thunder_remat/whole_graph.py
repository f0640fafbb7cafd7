"""The whole-graph pass: choose what the forward saves for backward, under a memory budget.

analysis (``joint_analysis``) -> solve (``save_plan``) -> rewrite (``recompute_rewrite``), on the
joint forward+backward trace before fusion. If any stage fails, the trace is left as Thunder made
it and a warning says why: a wrong result is never an option.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field

from thunder_remat.joint_analysis import build_save_problem, forward_storages
from thunder_remat.peak_estimate import estimate_schedule_peak
from thunder_remat.recompute_rewrite import build, prefetch_regathers, schedule_copies
from thunder_remat.save_plan import (BudgetChoice, Frontier, build_frontier, choose_fastest, choose_plan, is_fastest_budget,
                                     target_bytes)
from thunder_remat.save_problem import SaveProblem, with_measured_costs
from thunder_remat.verify import verify

__all__ = ["SavePassResult", "plan_saved_values", "BudgetInfeasibleWarning"]

log = logging.getLogger(__name__)


class BudgetInfeasibleWarning(UserWarning):
    """The memory budget is below what the smallest plan can save; the smallest plan is used."""


@dataclass
class SavePassResult:
    trace: object
    problem: SaveProblem | None = None
    choice: BudgetChoice | None = None
    budget: tuple | None = None
    #: where the pass's time went (milliseconds; they add up to the whole pass): building the
    #: problem; every min cut and knapsack (the budget's plan, gap filling, checkpoint anchors);
    #: the rewrites (with prefetching and verification); the step-peak estimates of "auto"
    analysis_ms: float = 0.0
    solve_ms: float = 0.0
    rewrite_ms: float = 0.0
    estimate_ms: float = 0.0
    failed: str | None = None
    solver: str = "dp"
    #: the forward op of every recomputed copy the rewrite made, in order (with a reuse window, cheap
    #: ops recomputed again for a far use appear more than once)
    copied_ops: tuple[int, ...] = ()
    #: recomputed ops whose outputs the backward holds as checkpoints (see remat_checkpoint_budget),
    #: one tuple per level, outermost (held from the start of the backward) first
    checkpoint_levels: tuple[tuple[int, ...], ...] = ()
    #: the budget fractions whose plans anchored the checkpoints, one per level, nearest the chosen
    #: plan first (empty: no checkpoints)
    checkpoint_anchors: tuple[float, ...] = ()
    #: with remat_checkpoint_budget="auto": the estimated step peak (thunder_remat.peak_estimate) of
    #: the rewrite used and of the one without checkpoints, in bytes (None when not estimated)
    peak_estimate: int | None = None
    peak_estimate_without_checkpoints: int | None = None
    #: with "auto": the estimated step peak with each anchor chain tried (a tuple of budget fractions)
    anchor_estimates: dict = field(default_factory=dict)

    @property
    def checkpoint_ops(self) -> tuple[int, ...]:
        """Every checkpoint op, of all levels."""
        return tuple(sorted(i for level in self.checkpoint_levels for i in level))

    @property
    def checkpoint_anchor(self) -> float | None:
        """The nearest anchor (the outermost checkpoint level), or None without checkpoints."""
        return self.checkpoint_anchors[0] if self.checkpoint_anchors else None

    @property
    def total_ms(self) -> float:
        return self.analysis_ms + self.solve_ms + self.rewrite_ms + self.estimate_ms

    @property
    def copies(self) -> int:
        return len(self.copied_ops)

    @property
    def rewritten_cost(self) -> float:
        """Estimated cost of every copy made (the plan's estimate counts each op once)."""
        costs = {op.index: op.cost for op in self.problem.ops} if self.problem else {}
        return float(sum(costs[i] for i in self.copied_ops))

    def frontier(self) -> Frontier:
        """The Pareto frontier of plans (built now, once, if the budget did not need it)."""
        if self.choice is None:
            raise ValueError("the whole-graph pass did not produce a plan" + (f": {self.failed}" if self.failed else ""))
        if self.choice.frontier is None:
            self.choice = BudgetChoice(self.choice.plan, self.choice.target_bytes, self.choice.feasible,
                                       build_frontier(self.problem, self.solver))
        return self.choice.frontier


    def provenance(self) -> str:
        if self.failed:
            return f"thunder_remat whole-graph save planning failed and was skipped: {self.failed}"
        plan = self.choice.plan
        budget = "none" if self.budget is None else f"{self.budget[0]} {self.budget[1]:g}"
        text = (
            f"thunder_remat whole-graph save planning (took {self.total_ms:.1f} ms; "
            f"budget {budget}"
        )
        if self.choice.target_bytes is not None:
            text += f" = {self.choice.target_bytes} B"
        text += (
            f"; saves {plan.saved_bytes} B of activations (storage bytes); "
            f"{len(plan.recomputed)} forward ops recomputed in backward, est. {plan.recompute_cost:.3g} "
            f"{self.problem.cost_unit}"
        )
        if self.copies > len(plan.recomputed):
            text += (f"; {self.copies} copies made, {self.copies - len(plan.recomputed)} of them for far uses, "
                     f"est. {self.rewritten_cost:.3g} {self.problem.cost_unit} in all")
        if self.checkpoint_ops:
            text += (f"; backward recomputes from {len(self.checkpoint_ops)} checkpoint ops "
                     f"(anchored at budget {', '.join(f'{a:g}' for a in self.checkpoint_anchors)})")
        if self.peak_estimate is not None and self.peak_estimate_without_checkpoints is not None:
            text += (f"; est. step peak {self.peak_estimate} B "
                     f"({self.peak_estimate_without_checkpoints} B without checkpoints)")
        if not self.choice.feasible:
            text += "; budget infeasible, smallest plan used"
        return text + ")"


def _measure(trace, problem: SaveProblem) -> dict[int, float]:
    """Time the forward ops the plan may recompute (not the banned ones, not the free views)."""
    from thunder_remat.executors.op_timing import time_ops

    candidates = {op.index: trace.bound_symbols[op.index] for op in problem.ops if op.hard_ban is None and op.cost > 0}
    return time_ops(candidates)


#: "auto" tries the plans at these budget fractions as checkpoint anchors ...
AUTO_ANCHORS = (0.1, 0.2, 0.3, 0.5, 0.7)
#: ... and uses the best only if it lowers the estimated step peak by at least this fraction
#: (2%: on the 2-layer GPT at 0.5, a 0.7 anchor estimated 2.7% lower measured 2.9% lower, and
#: without it the peak rose from 0.7 to 0.5; the price there was 10% more recompute).
AUTO_MIN_GAIN = 0.02
#: The estimate is off by several percent against measured peaks, so anchors whose estimates lie
#: within this fraction of the lowest count as tied; the tie goes to the largest anchor, whose
#: rewrite recomputes least. (6-layer GPT, attention fused, at 0.0: 0.2 was estimated 1.8% below
#: 0.1 and measured 7% below it, at 0.1's own peak; with attention decomposed the LLaMA had the
#: opposite case, 0.3 estimated 2.4% below 0.1 and measured 7% above it.)
AUTO_TIE = 0.03


def backward_checkpoints(problem: SaveProblem, choice: BudgetChoice, fractions) -> tuple[tuple[float, frozenset[int]], ...]:
    """Recomputed ops whose outputs the backward holds as checkpoints: (fraction, ops) for one
    level per budget in ``fractions``, nearest the chosen plan first, anchored at the plan that
    budget would choose; a level is left out if its plan saves no more than the chosen one or
    adds no op.

    A plan far below the fastest recomputes most of the forward; recomputed once, at first use,
    all of it runs when the backward starts and every matmul output it makes stays alive until
    its layer's backward. The anchor plan saves a few values per layer: holding those
    (recomputed, only while the backward runs) and recomputing the rest from them near its use
    brings the step's peak down to about the anchor plan's. With a second level, the backward
    holds the first anchor's values and recomputes the second's from them where they are first
    needed, as the first anchor's own backward would (see ``schedule_copies``).
    """
    if choice.frontier is None:
        return ()
    recomputed = set(choice.plan.recomputed)
    covered = set(choice.plan.saved)
    levels = []
    for fraction in sorted(fractions):
        if target_bytes(choice.frontier, ("fraction", float(fraction))) <= choice.plan.saved_bytes:
            # every plan that budget may choose saves no more than the chosen one (a fraction's
            # target is never below the smallest plan, so it always has a plan that fits)
            continue
        anchor = choose_plan(choice.frontier, ("fraction", float(fraction))).plan
        if anchor.saved_bytes <= choice.plan.saved_bytes:
            continue
        held = set(anchor.saved) - covered
        covered |= held
        level = frozenset(op.index for op in problem.ops if op.index in recomputed and held.intersection(op.outputs))
        if level:
            levels.append((float(fraction), level))
    return tuple(levels)


def _schedule(trace, problem: SaveProblem, plan, window, checkpoints=()):
    # Re-gathers (FSDP ZeRO-3) are recomputed by rule but are collectives: never issued twice.
    held = frozenset().union(*checkpoints)
    cheap = frozenset(op.index for op in problem.ops
                      if op.soft_ban is None and op.hard_ban is None and not op.collective) - held
    recomputed = set(plan.recomputed)
    segments = frozenset(op.index for op in problem.ops if op.index in recomputed and not op.collective
                         and op.index not in held and op.index not in cheap)
    return schedule_copies(trace, plan.recomputed, window=window, cheap=cheap, checkpoints=checkpoints,
                           segments=segments)


@dataclass
class _Candidate:
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


def _rewrite_with_checkpoints(trace, problem: SaveProblem, choice: BudgetChoice, config, result):
    """The copy schedule of the rewrite, with the backward checkpoints ``config`` asks for.

    "auto" estimates the step peak of each candidate's schedule (no bound symbol is built for
    the candidates it drops)."""
    window = config.recompute_window or None
    setting = config.checkpoint_budget
    if window is None or setting is False or choice.frontier is None:
        return _timed_schedule(result, trace, problem, choice.plan, window)
    if setting != "auto":
        with _timed(result, "solve_ms"):
            levels = backward_checkpoints(problem, choice, setting if isinstance(setting, tuple) else (setting,))
        _record_checkpoints(result, levels)
        return _timed_schedule(result, trace, problem, choice.plan, window, tuple(ops for _, ops in levels))
    ops = {op.index: op for op in problem.ops}
    plain = _timed_schedule(result, trace, problem, choice.plan, window)
    if not any(ops[i].soft_ban for i in choice.plan.recomputed):
        return plain  # only cheap ops recomputed: the window alone bounds what the backward holds
    with _timed(result, "estimate_ms"):
        storages = forward_storages(trace, with_backward=True)  # shared by every estimate
        plain_peak = estimate_schedule_peak(plain, storages)
    result.peak_estimate, result.peak_estimate_without_checkpoints = plain_peak, plain_peak
    seen = set()

    def attempt(chain) -> _Candidate | None:
        with _timed(result, "solve_ms"):
            levels = backward_checkpoints(problem, choice, chain)
        held = tuple(ops for _, ops in levels)
        if not held or held in seen:
            return None
        seen.add(held)
        schedule = _timed_schedule(result, trace, problem, choice.plan, window, held)
        with _timed(result, "estimate_ms"):
            peak = estimate_schedule_peak(schedule, storages)
        result.anchor_estimates[chain] = peak
        return _Candidate(chain, levels, peak, schedule)

    singles = []
    for fraction in AUTO_ANCHORS:
        candidate = attempt((fraction,))
        if candidate is None:
            continue
        singles.append(candidate)
        _let_go(plain_peak, singles)
    best = choose_anchor(plain_peak, singles)
    if best is None:
        return plain
    # Nest: hold the nearest anchor's values (the smallest anchor that gives another rewrite) and
    # recompute the chosen anchor's from them, as the nearest plan's own backward would; kept if
    # that lowers the estimate by AUTO_MIN_GAIN. (On the built-in models the nearest was also the
    # best of all nearer anchors, for one rewrite instead of up to four.)
    for fraction in (f for f in AUTO_ANCHORS if f < best.chain[0]):
        nested = attempt((fraction, *best.chain))
        if nested is not None:
            if nested.peak <= (1.0 - AUTO_MIN_GAIN) * best.peak:
                best = nested
            break
    _record_checkpoints(result, best.levels)
    result.peak_estimate = best.peak
    return best.schedule


def _let_go(plain_peak: int, candidates) -> None:
    """Drop the schedules of candidates that can no longer be chosen: those short of the minimum
    gain, and those above the tie band of the lowest so far (the lowest only falls)."""
    limit = (1.0 - AUTO_MIN_GAIN) * plain_peak
    lowest = min((c.peak for c in candidates if c.peak <= limit), default=None)
    for c in candidates:
        if lowest is None or c.peak > limit or c.peak > (1.0 + AUTO_TIE) * lowest:
            c.schedule = None


def _timed_schedule(result, trace, problem, plan, window, checkpoints=()):
    with _timed(result, "rewrite_ms"):
        return _schedule(trace, problem, plan, window, checkpoints)


class _timed:
    """Adds the time spent in the block to ``result.<field>`` (milliseconds)."""

    def __init__(self, result, field: str) -> None:
        self.result, self.field = result, field

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        setattr(self.result, self.field, getattr(self.result, self.field) + (time.perf_counter() - self.start) * 1e3)


def _record_checkpoints(result, levels):
    result.checkpoint_anchors = tuple(fraction for fraction, _ in levels)
    result.checkpoint_levels = tuple(tuple(sorted(ops)) for _, ops in levels)


def plan_saved_values(trace, config, *, zero3: bool = False) -> SavePassResult:
    """Solve and rewrite ``trace`` (a joint trace) according to ``config``; never raises for a bad trace.

    ``zero3``: the trace comes from FSDP ZeRO-3 and ``config.fsdp_regather`` is on: gathered
    parameters are re-gathered in the backward instead of saved.
    """
    result = SavePassResult(trace=trace, budget=config.budget, solver=config.solver)
    try:
        with _timed(result, "analysis_ms"):
            regather = zero3 and config.fsdp_regather
            problem = build_save_problem(trace, config.policies, regather_params=regather)
            if config.cost_model == "measured":
                problem = with_measured_costs(problem, _measure(trace, problem))
            result.problem = problem
        with _timed(result, "solve_ms"):
            if is_fastest_budget(config.budget):
                choice = choose_fastest(problem, config.budget)
            else:
                choice = choose_plan(build_frontier(problem, config.solver), config.budget)
            result.choice = choice
        schedule = _rewrite_with_checkpoints(trace, problem, choice, config, result)
        result.copied_ops = tuple(schedule.emitted)
        with _timed(result, "rewrite_ms"):
            new = build(schedule)
            if regather:
                new = prefetch_regathers(new, config.fsdp_prefetch)
            if config.verify:
                replayed = {op.op for op in problem.ops if op.force_recompute} if regather else set()
                verify(trace, new, saved=choice.plan.saved, saved_bytes=choice.plan.saved_bytes, replayed=replayed,
                       raise_on_error=True)
        result.trace = new
    except Exception as exc:  # containment: leave the trace as Thunder made it
        result.trace = trace
        result.failed = f"{type(exc).__name__}: {exc}"
        warnings.warn(
            f"thunder_remat: whole-graph save planning failed ({result.failed}); "
            "the forward saves what Thunder chose",
            stacklevel=2,
        )
        log.debug("whole-graph save planning failed", exc_info=True)
        return result
    if not choice.feasible:
        warnings.warn(
            f"thunder_remat: remat_memory_budget {config.memory_budget!r} asks for at most "
            f"{choice.target_bytes} B of saved activations, but the smallest plan saves "
            f"{choice.plan.saved_bytes} B; using the smallest plan",
            BudgetInfeasibleWarning,
            stacklevel=2,
        )
    log.info("%s", result.provenance())
    return result
