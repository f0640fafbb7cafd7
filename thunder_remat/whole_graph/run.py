"""The whole-graph pass: choose what the forward saves for backward, under a memory budget.

analysis (``analysis``: trace -> ``SaveProblem``) -> solve (``planner``: problem -> ``BudgetChoice``)
-> checkpoints (``checkpoints``: where the backward makes values again) -> rewrite (``rewrite``:
schedule -> trace), on the joint forward+backward trace before fusion. If any stage fails, the
trace is left as Thunder made it and a warning says why: a wrong result is never an option.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field, replace
from typing import ClassVar

from thunder_remat.budget import Budget, BudgetKind
from thunder_remat.policies import contraction_kind
from thunder_remat.records import PassResult, PassStatus
from thunder_remat.verify import kept_if_verified
from thunder_remat.cost import value_bytes
from thunder_remat.trace_facts import caller_loss_inputs, forward_storages, loss_outside
from thunder_remat.whole_graph.reasons import PlanReasons, plan_reasons
from thunder_remat.whole_graph.analysis import build_save_problem
from thunder_remat.whole_graph.checkpoints import AUTO_MIN_GAIN, CheckpointChoice, anchor_fractions, checkpointed_schedule
from thunder_remat.storage import StorageMap
from thunder_remat.fusion_regions import gradient_convolutions
from thunder_remat.whole_graph.peak import (PeakBreakdown, RegionModel, estimate_peak_bytes, peak_breakdown,
                                           predict_regions)
from thunder_remat.whole_graph.frontier_walk import held_rewrites, plans_ahead, walk_frontier
from thunder_remat.whole_graph.peak_budget import choose_for_peak
from thunder_remat.whole_graph.reorder import lowest_peak_order
from thunder_remat.whole_graph.planner import (BudgetChoice, Frontier, PlanSearch, build_frontier, choose_fastest,
                                               is_fastest_budget, target_bytes)
from thunder_remat.whole_graph.problem import SaveProblem, with_measured_costs
from thunder_remat.whole_graph.rewrite import build, prologue_names
from thunder_remat.whole_graph.zero3 import prefetch_regathers

__all__ = ["SavePassResult", "plan_saved_values", "convolution_cuts", "BudgetInfeasibleWarning", "UnmodelledPeakWarning", "LossOutsideWarning"]

log = logging.getLogger(__name__)


class BudgetInfeasibleWarning(UserWarning):
    """The memory budget is below what the smallest plan can save (the smallest plan is used), or a
    peak budget below every plan's estimated step peak (the lowest-peak plan is used)."""


class UnmodelledPeakWarning(UserWarning):
    """A peak budget is held to an estimate that does not model how some fusion region holds
    memory: the measured peak may be above the budget."""


class LossOutsideWarning(UnmodelledPeakWarning):
    """A peak budget is held to an estimate that leaves out the caller's loss (the compiled
    function returns what the loss reads): its memory comes on top of what is saved."""


#: what a peak budget's estimate leaves out when the loss is the caller's
LOSS_OUTSIDE = ("the caller's loss runs outside the compiled function, on top of what is saved: its memory is not "
                "in the estimate (compile the loss with the model to count it)")


@dataclass
class SavePassResult(PassResult):
    """What the whole-graph pass chose (``PassResult``: status, failure, timings)."""

    STAGES: ClassVar[tuple[str, ...]] = ("analysis", "solve", "rewrite", "estimate")

    problem: SaveProblem | None = None
    choice: BudgetChoice | None = None
    budget: tuple | None = None
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
    #: with remat_checkpoint_budget="auto" or a peak budget: the estimated step peak (whole_graph.peak)
    #: of the rewrite used and ("auto") of the one without checkpoints, in bytes (None: not estimated)
    peak_estimate: int | None = None
    peak_estimate_without_checkpoints: int | None = None
    #: with "auto": the estimated step peak with each anchor chain tried (a tuple of budget fractions)
    anchor_estimates: dict = field(default_factory=dict)
    #: where the estimated step peak of the rewrite used is and what is alive there (None: not estimated)
    peak_at: PeakBreakdown | None = None
    #: activation bytes Thunder alone saves with the compilation's fusion executors (None: not
    #: asked, no fusion executor, or a saved-bytes budget); fraction 1.0 saves no more, and a peak
    #: budget walks no plan that saves more
    ceiling: int | None = None
    #: why the plan saves each value and recomputes each op, recorded when it was chosen
    reasons: PlanReasons | None = None
    #: names of what the rewritten backward makes when it starts (the outermost checkpoints, made
    #: early: ``CopySchedule.prologue``); a backward fusion region is cut after them
    prologue: frozenset[str] = frozenset()
    #: backward regions running a convolution, which the executor's kernel model leaves uncut, are
    #: cut before the making of their first gradient convolution's operands
    #: (``KernelModel.cut_before_gradient_convolutions``): estimated lower (``convolution_cuts``)
    cut_before_gradient_convolutions: bool = False
    #: the fusion regions run the rewrite's order (``remat_keep_plan_order`` below the fastest
    #: plan); else the executor's compiler orders each region itself, and the estimate follows it
    #: (``KernelModel.own_order``)
    plan_order_kept: bool = False
    #: the order the backward runs in: "trace" (as autograd emitted it and the rewrite placed its
    #: copies) or the name of one of ``whole_graph.reorder.ORDERS``
    backward_order: str = "trace"
    #: a peak budget, and the compiled function returns tensors that get gradients from the
    #: caller's loss (``trace_facts.loss_outside``): that loss runs on top of what is saved, unestimated
    loss_outside: bool = False

    @property
    def checkpoint_ops(self) -> tuple[int, ...]:
        """Every checkpoint op, of all levels."""
        return tuple(sorted(i for level in self.checkpoint_levels for i in level))

    @property
    def checkpoint_anchor(self) -> float | None:
        """The nearest anchor (the outermost checkpoint level), or None without checkpoints."""
        return self.checkpoint_anchors[0] if self.checkpoint_anchors else None

    @property
    def capped(self) -> bool:
        """Thunder alone saves less than the fastest plan: the fraction scale's top (a peak budget's
        first plan) is the plan that saves no more."""
        return self.ceiling is not None and self.choice is not None and self.choice.frontier is not None \
            and self.ceiling < self.choice.frontier.fastest.saved_bytes

    @property
    def above_fastest(self) -> bool:
        """A peak budget with room took a plan that saves more than the fastest and recomputes less."""
        return (self.choice is not None and self.choice.frontier is not None
                and self.choice.plan.saved_bytes > self.choice.frontier.fastest.saved_bytes)

    @property
    def below_fastest(self) -> bool:
        """The plan was chosen below the fastest (a fraction under 1.0, a tight peak budget): the
        user asked for memory, and the regions run in the rewrite's order. A plan above the fastest
        compiles as the fastest does."""
        return (self.choice is not None and self.choice.frontier is not None and not self.above_fastest
                and self.choice.plan.recomputed != self.choice.frontier.fastest.recomputed)

    @property
    def peak_budget(self) -> bool:
        """The budget is a step peak (``"peak:6GiB"``)."""
        return self.budget is not None and BudgetKind(self.budget[0]) is BudgetKind.PEAK

    @property
    def copies(self) -> int:
        return len(self.copied_ops)

    @property
    def rewritten_cost(self) -> float:
        """Estimated cost of every copy made (the plan's estimate counts each op once)."""
        costs = {op.index: op.cost for op in self.problem.ops} if self.problem else {}
        return float(sum(costs[i] for i in self.copied_ops))

    @property
    def frontier(self) -> Frontier | None:
        """The Pareto frontier of plans the budget chose from (None at the fastest plan, which
        needs none: ``whole_graph.planner.build_frontier(result.problem)`` solves one)."""
        return None if self.choice is None else self.choice.frontier

    @property
    def nested_within(self) -> str:
        """What a plan nested within a lower-peak rewrite is ("" for a frontier plan): for the
        provenance line and ``explain()``."""
        within = None if self.choice is None else self.choice.within
        if within is None:
            return ""
        return (f"nested within the plan saving {within.saved_bytes:,} B: it saves only values that plan saves and "
                "holds its rewrite, a lower estimated step peak than the frontier's plan for this budget, for more "
                "recompute")

    def provenance(self) -> str:
        if self.status is PassStatus.FAILED:
            return f"thunder_remat whole-graph save planning failed and was skipped: {self.failure}"
        plan = self.choice.plan
        budget = "none" if self.budget is None else f"{self.budget[0]} {self.budget[1]:g}"
        text = (
            f"thunder_remat whole-graph save planning (took {self.timings.total_ms:.1f} ms; "
            f"budget {budget}"
        )
        if self.choice.target_bytes is not None:
            text += f" = {self.choice.target_bytes} B"
        if self.capped:
            scale = "plans walked" if self.peak_budget else "the fraction scale"
            text += f", {scale} capped at Thunder alone's {self.ceiling} B"
        text += (
            f"; saves {plan.saved_bytes} B of activations (storage bytes); "
            f"{len(plan.recomputed)} forward ops recomputed in backward, est. {plan.recompute_cost:.3g} "
            f"{self.problem.cost_unit}"
        )
        if self.above_fastest:
            text += " (more than the fastest plan, recomputing less: the peak budget has room)"
        if self.nested_within:
            text += f" ({self.nested_within})"
        if self.copies > len(plan.recomputed):
            text += (f"; {self.copies} copies made, {self.copies - len(plan.recomputed)} of them for far uses, "
                     f"est. {self.rewritten_cost:.3g} {self.problem.cost_unit} in all")
        if self.checkpoint_ops:
            text += (f"; backward recomputes from {len(self.checkpoint_ops)} checkpoint ops "
                     f"(anchored at budget {', '.join(f'{a:g}' for a in self.checkpoint_anchors)})")
        if self.backward_order != "trace":
            text += f"; backward run in the {self.backward_order!r} order"
        if self.cut_before_gradient_convolutions:
            text += "; backward regions cut before their first gradient convolution"
        if self.peak_estimate is not None:
            text += f"; est. step peak {self.peak_estimate} B"
            if self.peak_estimate_without_checkpoints is not None:
                text += f" ({self.peak_estimate_without_checkpoints} B without checkpoints)"
        if self.loss_outside:
            text += f"; {LOSS_OUTSIDE}"
        if not self.choice.feasible:
            text += "; budget infeasible, " + ("lowest-peak plan used" if self.peak_budget else "smallest plan used")
        return text + ")"


def _measure(trace, problem: SaveProblem) -> dict[int, float]:
    """Time the forward ops the plan may recompute (not the banned ones, not the free views)."""
    from thunder_remat.executors.hooks.op_timing import time_ops

    candidates = {op.index: trace.bound_symbols[op.index] for op in problem.ops if op.hard_ban is None and op.cost > 0}
    return time_ops(candidates)


def plan_saved_values(trace, config, *, zero3: bool = False, fusible=None, kernels=None,
                      ceiling=None) -> SavePassResult:
    """Solve and rewrite ``trace`` (a joint trace) according to ``config``; never raises for a bad trace.

    ``zero3``: the trace comes from FSDP ZeRO-3 and ``config.fsdp_regather`` is on: gathered
    parameters are re-gathered in the backward instead of saved. ``fusible``: whether one of the
    compilation's fusion executors can fuse a bound symbol (None: none fuses); step peaks are
    estimated for the regions each rewrite is expected to form, cut as ``pairs.split`` will cut
    them (``peak.RegionModel``); ``kernels``: how the executor's kernels hold memory inside a
    region (a ``fusion_regions.KernelModel`` from its adapter; None: as unfused). ``ceiling``:
    () -> the activation bytes Thunder alone saves for ``trace`` with the same executors, asked
    only where a region may take an op the policies keep; a fraction budget then runs from the
    smallest plan (0.0) to the fastest plan that saves no more than that (1.0).
    """
    result = SavePassResult(trace=trace, budget=config.budget, solver=config.solver)
    timings = result.timings
    try:
        with timings.stage("analysis"):
            regather = zero3 and config.fsdp_regather
            problem = build_save_problem(trace, config.policies, regather_params=regather)
            if config.cost_model == "measured":
                problem = with_measured_costs(problem, _measure(trace, problem))
            result.problem = problem
        window = config.recompute_window or None
        regions = predict_regions(trace, fusible, config.split_regions, kernels) if fusible is not None else None
        peak_budget = config.budget is not None and BudgetKind(config.budget[0]) is BudgetKind.PEAK
        ceiling = _ask_ceiling(trace, problem, fusible, ceiling)
        search = anchors = walked = None
        with timings.stage("solve"):
            if is_fastest_budget(config.budget):
                choice = choose_fastest(problem, config.budget)
                if ceiling is not None and choice.plan.saved_bytes > ceiling:
                    search = PlanSearch(build_frontier(problem, config.solver))
                    choice = search.choose_capped(config.budget, ceiling)
            else:
                search = PlanSearch(build_frontier(problem, config.solver))
                if peak_budget:
                    choice = None
                elif ceiling is not None and BudgetKind(config.budget[0]) is BudgetKind.FRACTION:
                    choice = search.choose_capped(config.budget, ceiling)
                else:
                    choice = search.choose(config.budget)
            if search is not None and window is not None:
                # the checkpoint stage's anchors, chosen here: it runs no min cut of its own
                floor = search.frontier.smallest.saved_bytes if choice is None else choice.plan.saved_bytes
                anchors = search.anchor_plans(f for f in anchor_fractions(config.checkpoint_budget)
                                              if target_bytes(search.frontier, Budget.fraction(f)) > floor)
            result.ceiling = ceiling
        if peak_budget:
            result.loss_outside = loss_outside(trace)
            picked = choose_for_peak(trace, problem, search, int(config.budget[1]), window=window,
                                     setting=config.checkpoint_budget, anchors=anchors, timings=timings,
                                     regions=regions, ceiling=ceiling, above=not result.loss_outside)
            choice, checkpoints = picked.choice, picked.checkpoints
        elif config.checkpoint_budget == "auto" and window is not None and choice.frontier is not None:
            # below the fastest plan: walk down to the chosen plan, which may hold a rewrite above it
            choices = [BudgetChoice(p, None, True, choice.frontier, choice.frontier.networks)
                       for p in plans_ahead(choice.frontier, choice.plan)] + [choice]
            first = last = None
            for last in walk_frontier(trace, problem, choices, window=window, setting="auto", anchors=anchors,
                                      timings=timings, regions=regions):
                first = first or last
            choice, checkpoints = last.choice, last.checkpoints  # a nested step keeps the budget's target
            if first.choice.plan is choice.frontier.fastest and ceiling is None and last is not first:
                walked = (first, last)  # the fastest plan's rewrite, as a fraction of 1.0 compiles it
        else:
            checkpoints = checkpointed_schedule(trace, problem, choice, window=window,
                                                setting=config.checkpoint_budget, anchors=anchors, timings=timings,
                                                regions=regions)
        result.choice = choice
        result.reasons = plan_reasons(problem, choice.plan)
        keep = config.keep_plan_order and result.below_fastest
        reorder = config.reorder_backward and not regather
        # the plan's regions as they will compile, and the fastest plan's as 1.0 compiles them
        fastest_kernels = replace(kernels, own_order=True) if kernels is not None else None

        built: dict = {}  # id(option) -> (option, its rewrite, its prologue): the same in either region order
        estimated: dict = {}  # (id(option), kernels) -> its _Rewrite
        held: list = []  # the chosen plan holding the fastest plan's rewrite: its options, made once

        def in_run_order(option, kernels) -> _Rewrite:
            if (id(option), kernels) in estimated:
                return estimated[id(option), kernels]
            if id(option) not in built:
                with timings.stage("rewrite"):
                    new = build(option.schedule)
                    prologue = prologue_names(option.schedule, new)
                    if regather:
                        new = prefetch_regathers(new, config.fsdp_prefetch, option.schedule.copy_positions())
                built[id(option)] = (option, new, prologue)
            _, new, prologue = built[id(option)]
            ordered = _Ordered(new, None, "trace")
            if reorder:
                with timings.stage("estimate"):
                    ordered = _lowest_peak_order(new, prologue, fusible, kernels, config.split_regions)
            made = estimated[id(option), kernels] = _Rewrite(option, ordered, prologue)
            return made

        def held_options() -> list:
            if not held:
                fastest, chosen = walked
                held.append(held_rewrites(trace, problem, chosen, fastest, window=window, timings=timings,
                                          regions=regions))
            return held[0]

        def rewritten(kernels) -> _Rewrite:
            made = _lowest_rewrite((checkpoints, *(checkpoints.alternatives if reorder else ())),
                                   lambda option: in_run_order(option, kernels))
            if reorder and walked is not None:
                made = _held_at_fastest(made, walked[0], held_options, in_run_order, kernels, fastest_kernels)
            return made

        rewrite = rewritten(kernels if keep else fastest_kernels)
        if keep and kernels is not None and rewrite.ordered.peak is not None:  # else neither order is estimated
            rewrite, keep = _kept_or_own_order(rewrite, rewritten(fastest_kernels))
        result.plan_order_kept = keep
        own_order = not keep and kernels is not None
        if own_order:
            kernels = fastest_kernels
        checkpoints, ordered, prologue = rewrite.checkpoints, rewrite.ordered, rewrite.prologue
        new, result.backward_order = ordered.trace, ordered.order
        _record_checkpoints(result, checkpoints)
        if peak_budget:
            result.peak_estimate = picked.peak if checkpoints is picked.checkpoints else checkpoints.peak_estimate
        if result.backward_order != "trace":
            log.debug("backward run in the %r order: est. step peak %d B", result.backward_order, ordered.peak)
        if result.peak_estimate is not None and ordered.peak is not None and (result.backward_order != "trace"
                                                                              or own_order):
            result.peak_estimate = ordered.peak  # the plan was estimated in another order, or its regions in theirs
        result.copied_ops = tuple(checkpoints.schedule.emitted)
        with timings.stage("rewrite"):
            replayed = {op.op for op in problem.ops if op.force_recompute} if regather else set()
            if config.verify and not kept_if_verified(result, trace, new, "whole-graph rewrite",
                                                      saved=choice.plan.saved, saved_bytes=choice.plan.saved_bytes,
                                                      replayed=replayed):
                return result
        result.trace = new
        result.prologue = prologue
        with timings.stage("estimate"):
            cut = convolution_cuts(new, prologue, fusible, config.split_regions, kernels)
        if cut is not None:
            result.cut_before_gradient_convolutions = True
            ordered = replace(cut, order=result.backward_order)  # its storages and regions for the breakdown
            if result.peak_estimate is not None:
                result.peak_estimate = cut.peak
        with timings.stage("estimate"):  # the reorder's storages and regions of this trace, where it ran
            if ordered.storages is not None:
                built = ordered.regions
            else:
                built = predict_regions(new, fusible, config.split_regions, kernels) if fusible is not None else None
            result.peak_at = peak_breakdown(new, built, prologue, ordered.storages)
        if result.peak_estimate is None:  # no search estimated it (the fastest plan): the rewrite's walk
            result.peak_estimate = result.peak_at.peak
        changed = result.copied_ops or result.backward_order != "trace"
        result.status = PassStatus.REWRITTEN if changed else PassStatus.UNCHANGED
    except Exception as exc:  # containment: leave the trace as Thunder made it
        result.fail(trace, f"{type(exc).__name__}: {exc}")
        warnings.warn(
            f"thunder_remat: whole-graph save planning failed ({result.failure}); "
            "the forward saves what Thunder chose",
            stacklevel=2,
        )
        log.debug("whole-graph save planning failed", exc_info=True)
        return result
    if not choice.feasible and peak_budget:
        warnings.warn(
            f"thunder_remat: remat_memory_budget {config.memory_budget!r} asks for an estimated step peak of at "
            f"most {int(config.budget[1])} B, but the lowest estimate of any plan is {result.peak_estimate} B; "
            "using that plan" + (f" (at its peak, {result.peak_at.where()}: {result.peak_at.kinds()})"
                                 if result.peak_at is not None else ""),
            BudgetInfeasibleWarning,
            stacklevel=2,
        )
    elif not choice.feasible:
        warnings.warn(
            f"thunder_remat: remat_memory_budget {config.memory_budget!r} asks for at most "
            f"{choice.target_bytes} B of saved activations, but the smallest plan saves "
            f"{choice.plan.saved_bytes} B; using the smallest plan",
            BudgetInfeasibleWarning,
            stacklevel=2,
        )
    if peak_budget and regions is not None and not regions.memory_modelled:
        unmodelled = ("the fusion executor's kernels (its regions are taken to hold what they read until they "
                      "return)" if kernels is None else
                      "the memory of convolutions in its regions (oneDNN scratch buffers and layout conversions; "
                      "on the zoo's CNNs the allocator measured 6-58% above the estimate)")
        warnings.warn(
            f"thunder_remat: remat_memory_budget {config.memory_budget!r} is compared with an estimated step peak "
            f"that does not model {unmodelled}; the measured peak may be above the budget",
            UnmodelledPeakWarning,
            stacklevel=2,
        )
    if peak_budget and result.loss_outside:
        handed = sum(value_bytes(p) for p in caller_loss_inputs(trace))
        warnings.warn(
            f"thunder_remat: remat_memory_budget {config.memory_budget!r} is compared with an estimated step peak "
            f"that leaves out the caller's loss: the compiled function returns {handed} B of outputs that get "
            "gradients, and that loss and its backward run on top of what is saved; the measured peak may be above "
            "the budget (compile the loss with the model, returning it, to count it)",
            LossOutsideWarning,
            stacklevel=2,
        )
    log.info("%s", result.provenance())
    return result


@dataclass(frozen=True)
class _Ordered:
    """A rewrite with its backward in the order chosen for it: the order's name
    (``whole_graph.reorder.ORDERS`` or "trace") and its estimated step peak (None: not estimated),
    with the storages and regions that estimate walked (None: not estimated)."""

    trace: object
    peak: int | None
    order: str
    storages: StorageMap | None = None
    regions: RegionModel | None = None


@dataclass(frozen=True)
class _Rewrite:
    """A copy schedule built, with its backward in its chosen order, and the names of what that
    backward makes when it starts."""

    checkpoints: CheckpointChoice
    ordered: _Ordered
    prologue: frozenset


def _lowest_rewrite(options, in_run_order) -> _Rewrite:
    """The first of ``options`` (copy schedules: the search's pick first), unless another is
    estimated lower once each backward runs in its own order (``in_run_order``: option ->
    ``_Rewrite``)."""
    best = None
    for option in options:
        made = in_run_order(option)
        if best is None or (made.ordered.peak is not None and best.ordered.peak is not None
                            and made.ordered.peak < best.ordered.peak):
            best = made
    return best


def _held_at_fastest(rewrite: _Rewrite, fastest, held_options, in_run_order, kernels, fastest_kernels) -> _Rewrite:
    """``rewrite`` (of the frontier walk's chosen step), or, where the fastest plan's rewrite (the
    walk's first step, ``fastest``) is estimated lower once each backward runs in its own order,
    the chosen plan holding it (``held_options()``: ``frontier_walk.held_rewrites``) if that is
    lower.

    The walk compares plans by estimates in the trace's order; the backward's order is chosen
    after, and lowers some rewrites more than others (the fastest plan of GPT-J by 13%, its 0.5
    plan by 5%), so a plan below the fastest could peak above it. Holding the fastest plan's
    rewrite recomputes, when the backward starts, what that plan saves, and runs the rest as its
    backward does: about its peak, with the saved bytes of the budget. ``fastest_kernels``: the
    kernel model of the regions as 1.0 compiles them (in the compiler's own order), for the
    fastest plan's estimate; ``kernels``: as the held rewrites compile (``in_run_order``: option,
    kernels -> ``_Rewrite``)."""
    if rewrite.ordered.peak is None:
        return rewrite
    top = in_run_order(fastest.checkpoints, fastest_kernels)
    if top.ordered.peak is None or rewrite.ordered.peak <= top.ordered.peak:
        return rewrite
    best = rewrite
    for option in held_options():
        made = in_run_order(option, kernels)
        if made.ordered.peak is not None and made.ordered.peak < best.ordered.peak:
            best = made
    log.info("frontier walk: the fastest plan's rewrite is estimated at %d B in its backward's order, the chosen "
             "plan's at %d B; holding it: %s", top.ordered.peak, rewrite.ordered.peak,
             f"{best.ordered.peak} B" if best is not rewrite else "not lower, not held")
    return best


def _kept_or_own_order(kept: _Rewrite, own: _Rewrite) -> tuple[_Rewrite, bool]:
    """The rewrite of a plan below the fastest with its regions in the plan's order (``kept``,
    ``remat_keep_plan_order``), or in the compiler's own (``own``) where that is estimated lower;
    with whether the plan's order is kept.

    Keeping the plan's order stops a compiler from computing a recomputed value with the first
    computation of it and holding it until the far reader; its own order also lowers what a
    region holds in other ways (the zoo BERT at 0.5: 375 kB in the plan's order, 358 kB in
    Inductor's, measured and estimated alike). The estimate models both (``KernelModel.own_order``),
    so each plan compiles in the one estimated lower. ``kept`` is estimated (where it is not, a
    region with a convolution: ``RegionModel.memory_modelled``, neither is, and the plan's order is
    kept without building ``own``)."""
    if own.ordered.peak is None or own.ordered.peak >= kept.ordered.peak:
        return kept, True
    log.info("regions compiled in the compiler's own order: est. step peak %d B, %d B in the plan's",
             own.ordered.peak, kept.ordered.peak)
    return own, False


def _lowest_peak_order(trace, prologue, fusible, kernels, split: bool) -> _Ordered:
    """``trace`` with its backward in the order of lowest estimated step peak; each order's regions
    are predicted from that order.

    Only where the estimate knows how the backward's regions hold memory: without backward fusion
    regions, or with an executor whose kernels it models (``kernels``, torch.compile's Inductor,
    measured against the allocator) and no region running a convolution (oneDNN's memory is not
    modelled). Otherwise the trace's order is kept: the estimate cannot tell whether an order holds
    less, and another order forms other regions (nvFuser at trace level: up to 35% more bytes
    crossing between regions; zoo ResNet with Inductor: 4.8% more measured peak;
    docs/whole-graph.md)."""
    signatures_of: dict = {}  # the orders share the trace's bound symbols
    own_regions = predict_regions(trace, fusible, split, kernels, signatures_of) if fusible is not None else None
    if own_regions is not None and not own_regions.memory_modelled:
        return _Ordered(trace, None, "trace")
    # an order of the same bound symbols shares the trace's storages (nothing moves across an
    # in-place write: reorder.backward_order_problem)
    storages = forward_storages(trace, with_backward=True)
    predicted = []  # each candidate with its regions: the chosen one's are kept

    def estimate(candidate) -> int:
        if candidate is trace:
            regions = own_regions
        else:
            regions = predict_regions(candidate, fusible, split, kernels, signatures_of) if fusible is not None else None
        predicted.append((candidate, regions))
        return estimate_peak_bytes(candidate, regions, prologue, storages)

    best, peak, order = lowest_peak_order(trace, estimate, prologue)
    return _Ordered(best, peak, order, storages, next(r for c, r in predicted if c is best))


def convolution_cuts(trace, prologue, fusible, split: bool, kernels) -> _Ordered | None:
    """``trace`` with its estimated step peak, storages and regions where backward regions are cut
    before their first gradient convolution (``KernelModel.cut_before_gradient_convolutions``, set
    on ``kernels`` in those regions), if that is ``AUTO_MIN_GAIN`` or more below the lowest the
    regions may hold whole; else None. ``trace``: the rewrite the pass returns, in its order;
    ``prologue``: its ``SavePassResult.prologue``.

    A region running a convolution is left whole because its compiler orders it itself, which the
    estimate follows only as modelled (``peak._compiler_order``): on the zoo ConvNeXt, Inductor ran
    the stem's convolution before the head's and last block's weight gradients, and cut before its
    first gradient convolution the step measured 16-19% more (two shapes), though the trace's
    order estimated the cut 1-2% lower.
    So the whole regions are estimated with what none of their ops reads made at their end
    (``outputs_late``, the lowest they may hold; within 0.3% of ConvNeXt's measured peak), and
    the cut is taken only where it is lower still: a transformer whose only convolution is its
    patch embedding (CLIPVision, ViT: 22-23% lower). Plans, checkpoints and orders are chosen with
    the regions whole."""
    if fusible is None or not split or kernels is None or not kernels.uncut_convolution_regions \
            or kernels.cut_before_gradient_convolutions:
        return None
    bsyms = trace.bound_symbols
    if not any(g and fusible(bsym) for g, bsym in zip(gradient_convolutions(bsyms), bsyms)):
        return None  # no region runs a gradient convolution: nothing to choose
    cut = replace(kernels, cut_before_gradient_convolutions=True)
    cut_regions = predict_regions(trace, fusible, split, cut)
    storages = forward_storages(trace, with_backward=True)
    whole = estimate_peak_bytes(trace, predict_regions(trace, fusible, split, kernels), prologue, storages,
                                outputs_late=True)
    lower = estimate_peak_bytes(trace, cut_regions, prologue, storages)
    log.debug("backward regions running convolutions: est. step peak at least %d B whole, %d B cut before their "
              "first gradient convolution", whole, lower)
    if lower > (1.0 - AUTO_MIN_GAIN) * whole:
        return None
    return _Ordered(trace, lower, "trace", storages, cut_regions)


def _ask_ceiling(trace, problem: SaveProblem, fusible, ceiling) -> int | None:
    """Thunder alone's saved bytes, asked (Thunder's own fusion of the whole joint trace, its pair
    pass included) only where a fusion executor may take a contraction the policies keep (a
    convolution in a light-executor or torch.compile region): elsewhere Thunder's pass has no
    recompute the fastest plan's cut lacks that matters (on every zoo LLM the fastest plan saved no
    more), and its cost is not paid (nvFuser and torch.compile take no matmul by default)."""
    if ceiling is None or fusible is None:
        return None
    kept = (op for op in problem.ops if op.soft_ban and not op.hard_ban and contraction_kind(op.op))
    if not any(fusible(trace.bound_symbols[op.index]) for op in kept):
        return None
    return ceiling()


def _record_checkpoints(result: SavePassResult, checkpoints) -> None:
    """The figures of ``checkpoints`` the result keeps (not the schedule: it holds the whole trace's names)."""
    result.checkpoint_anchors = tuple(fraction for fraction, _ in checkpoints.levels)
    result.checkpoint_levels = tuple(tuple(sorted(ops)) for _, ops in checkpoints.levels)
    result.peak_estimate = checkpoints.peak_estimate
    result.peak_estimate_without_checkpoints = checkpoints.peak_estimate_without_checkpoints
    result.anchor_estimates = dict(checkpoints.anchor_estimates)
