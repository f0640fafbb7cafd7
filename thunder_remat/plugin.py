"""The plugin boundary: how a Thunder user turns thunder_remat on, and where options are read.

Three ways in, one behaviour:

* ``thunder.jit(fn, remat=True, remat_...=...)``: compile options, read with Thunder's
  ``get_compile_option`` so ``thunder.last_compile_options`` lists them;
* ``thunder.jit(fn, transforms=[RematTransform(...)])`` or ``executors=[..., RematFusionExecutor(...)]``;
* ``thunder.compile(fn, plugins="remat")`` or ``plugins=[Remat(...)]``.

The options are merged into one validated ``RematConfig`` per compilation (compile options win
over the transform's), and a ``RematFusionExecutor`` carrying it runs after every other fusion
executor on the joint forward+backward trace.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import replace

from thunder.core.compile_data import get_compile_option
from thunder.core.recipe import Plugin, PluginPolicy
from thunder.core.trace import from_trace
from thunder.core.transforms import Transform
from thunder.extend import FusionExecutor

from thunder_remat.budget import BudgetKind
from thunder_remat.config import COMPILE_OPTIONS, RematConfig, config_from_options, option_name
from thunder_remat.executors import adapter_for
from thunder_remat.executors.hooks.compile_stash import stash, stash_for, stashed, stashed_now, transforms_now
from thunder_remat.executors.hooks.pipeline import record_provenance
from thunder_remat.executors.base import fusion_counter
from thunder_remat.pairs.run import PairPassResult, rematerialize_fusion_pairs
from thunder_remat.pairs.split import separate_forward_and_backward, split_backward_regions
from thunder_remat.records import PassStatus, RematSession
from thunder_remat.verify import kept_if_verified
from thunder_remat.whole_graph.run import SavePassResult, plan_saved_values

__all__ = ["RematFusionExecutor", "RematTransform", "Remat", "resolve_config", "last_pair_pass", "last_save_plan",
           "last_joint_trace", "thunder_alone_saved_bytes", "expected_regions"]

EXECUTOR_NAME = "thunder_remat"


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector paused while a pass runs (its previous state restored).

    The passes allocate many short-lived containers, freed by reference counting; in the
    middle of a deep model's compilation the heap holds millions of Thunder objects, so each full
    collection those allocations trigger walks all of them (about half a second at 32 layers):
    a cost that grows with the model twice over. Cycles the passes leave are collected later.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class RematFusionExecutor(FusionExecutor):
    """Claims no operation; its fusion pass rewrites the pairs of regions other executors made."""

    def __init__(self, config: RematConfig | None = None) -> None:
        super().__init__(EXECUTOR_NAME)
        self.config = config if config is not None else RematConfig()

    def fusion_pass(self, trace):
        """The fusion-pair pass (``remat_fusion_pairs``), then the backward region cuts
        (``remat_split_regions``), verified together; undone together if verification fails.
        Then, below the fastest plan, every region is set to run in the rewritten order
        (``remat_keep_plan_order``: a compiler that reorders would compute early and hold what
        the plan recomputes late; at the fastest plan the regions compile as Thunder compiles them,
        where the order settings measured up to 9% more peak: docs/benchmarks.md). The plan
        decided which (``SavePassResult.plan_order_kept``) and estimated its peak that way."""
        if not self.config.enabled:
            return trace
        session = stashed_now("session") or RematSession()
        keep_order = session.plan_order_kept
        trace = self._pairs_and_cuts(trace, session, keep_order)
        if keep_order:
            for bsym in trace.bound_symbols:
                if bsym.sym.is_fusion:
                    adapter_for(bsym.sym.executor).keep_plan_order(bsym)
        return trace

    def _pairs_and_cuts(self, trace, session: RematSession, keep_order: bool):
        original, separated = trace, []
        if session.saved_set_planned:  # the forward must hand over the plan's values, no more
            bsyms, separated = separate_forward_and_backward(trace, adapter_for, fusion_counter)
            if separated:
                trace = _finalize(trace, bsyms)
        if not (self.config.fusion_pairs or self.config.split_regions or separated):
            return trace
        with _collector_paused():
            if self.config.fusion_pairs:
                result = rematerialize_fusion_pairs(trace, self.config, adapter_for=adapter_for, finalize=_finalize,
                                                    session=session)
            else:
                result = PairPassResult(trace)
            result.separated_regions = separated
            if self.config.split_regions:
                bsyms, result.split_regions = split_backward_regions(
                    result.trace, adapter_for, fusion_counter, keep_order, session.prologue,
                    session.cut_before_gradient_convolutions)
                if result.split_regions:
                    result.trace = _finalize(result.trace, bsyms)
            if self.config.verify and result.trace is not original and \
                    not kept_if_verified(result, original, result.trace, "fusion-pair rewrite"):
                result.separated_regions, result.split_regions = [], []  # undone with the rest
        record_provenance(result.provenance())
        stash("pair_result", result)
        return result.trace


def _fusion_facts(fusers: list):
    """(whether one of ``fusers`` can fuse a bound symbol, or None if there are none; how their
    regions hold memory inside, where every fusion executor agrees on it, else None: as unfused)."""
    if not fusers:
        return None, None
    models = {adapter_for(ex).kernel_model() for ex in fusers}
    return (lambda bsym: any(ex.can_fuse(bsym) for ex in fusers)), (models.pop() if len(models) == 1 else None)


def expected_regions(trace, executors, split: bool = True, plan=None):
    """The ``whole_graph.peak.RegionModel`` the plan of a compilation with ``executors`` expects
    for ``trace`` (a joint trace, e.g. ``last_save_plan(jm).trace``); None if none of them fuses.
    ``plan``: that compilation's ``SavePassResult``, whose choices of regions it follows (where
    regions running convolutions are cut, whether they run the plan's order)."""
    from thunder_remat.whole_graph.peak import predict_regions

    fusible, kernels = _fusion_facts([ex for ex in executors if isinstance(ex, FusionExecutor)])
    if kernels is not None and plan is not None:
        kernels = replace(kernels, cut_before_gradient_convolutions=plan.cut_before_gradient_convolutions,
                          own_order=not plan.plan_order_kept)
    return predict_regions(trace, fusible, split, kernels) if fusible is not None else None


def plan_joint_trace(trace, executor: RematFusionExecutor):
    """The whole-graph pass on the joint trace, before any fusion executor sees it; the
    compilation's ``RematSession`` records what it decided for the fusion-pair pass."""
    from thunder_remat.executors.hooks.fsdp import zero3_active

    config = executor.config
    stash("joint_trace", trace)
    session = RematSession(zero3=zero3_active())
    stash("session", session)
    if session.zero3 and config.enabled and config.fsdp_regather and not config.whole_graph:
        raise ValueError(
            "thunder_remat: under FSDP ZeRO-3, option 'remat_fsdp_regather' (re-gather parameters in the "
            "backward) needs 'remat_whole_graph'=True; set remat_whole_graph=True, or remat_fsdp_regather=False "
            "to save the gathered parameters as Thunder does"
        )
    if not (config.enabled and config.whole_graph):
        return trace
    fusers = [ex for ex in stashed_now("executors") or () if isinstance(ex, FusionExecutor)]
    fusible, kernels = _fusion_facts(fusers)

    ceiling = None
    if fusers and not session.zero3 and (config.budget is None
                                         or BudgetKind(config.budget[0]) in (BudgetKind.FRACTION, BudgetKind.PEAK)):
        # a fusion executor's own pair pass may recompute what thunder_remat's policies keep
        # (Thunder recomputes convolutions inside a torch.compile region): 1.0 saves no more, and a
        # peak budget walks no plan that saves more
        ceiling = lambda: _thunder_alone_bytes_now(trace)  # noqa: E731 (asked only if a kept contraction is fusible)
    with _collector_paused():
        result = plan_saved_values(trace, config, zero3=session.zero3, fusible=fusible, kernels=kernels,
                                   ceiling=ceiling)
    planned = result.status is not PassStatus.FAILED
    stash("session", replace(session, saved_set_planned=planned,
                             planned_below_fastest=planned and result.below_fastest,
                             plan_order_kept=planned and result.plan_order_kept,
                             prologue=result.prologue,
                             cut_before_gradient_convolutions=planned and result.cut_before_gradient_convolutions))
    record_provenance(result.provenance())
    stash("save_result", result)
    return result.trace


def _finalize(trace, bsyms):
    """The rewritten trace; a producer left with no outputs is dropped (nothing else became dead)."""
    new = from_trace(trace)
    new.bound_symbols = [b for b in bsyms if not (b.sym.is_fusion and not b.flat_proxy_outs)]
    return new


class RematTransform(Transform):
    """Carries a ``RematConfig`` into ``thunder.jit(transforms=[...])``."""

    def __init__(self, config: RematConfig | None = None, **options) -> None:
        self.config = _config_from_arguments(config, options)


class Remat(Plugin):
    """``thunder.compile(model, plugins=[Remat(...)])``; registered as ``plugins="remat"``."""

    policy = PluginPolicy.POST

    def __init__(self, config: RematConfig | None = None, **options) -> None:
        self.config = _config_from_arguments(config, options)

    def setup_transforms(self):
        return [RematTransform(self.config)]


def _config_from_arguments(config: RematConfig | None, options: dict) -> RematConfig:
    """Keyword arguments use the compile-option names without the ``remat_`` prefix."""
    if config is not None and not isinstance(config, RematConfig):
        raise TypeError(f"thunder_remat: config must be a RematConfig, got {type(config).__name__}")
    prefixed = {option_name(k): v for k, v in options.items()}
    return config_from_options(config if config is not None else RematConfig(), prefixed)


def resolve_config(executors_list=()) -> RematConfig:
    """The config for the compilation in progress: transform or executor first, compile options on top."""
    base = None
    for transform in transforms_now():
        if isinstance(transform, RematTransform):
            base = transform.config
    for ex in executors_list:
        if isinstance(ex, RematFusionExecutor):
            base = ex.config
    options = {name: get_compile_option(name, desc) for name, (_, desc) in COMPILE_OPTIONS.items()}
    return config_from_options(base, options)


def executor_for_compilation(executors_list) -> RematFusionExecutor | None:
    config = resolve_config(executors_list)
    return RematFusionExecutor(config) if config.enabled else None


def is_remat_executor(ex) -> bool:
    return isinstance(ex, RematFusionExecutor)


# The accessors below describe one compilation (one cache entry) of ``jitted``, whole: by default
# the one whose computation last ran (another input shape, a cache hit, a ``torch.no_grad`` call
# each switch it); ``compilation=i`` picks the i-th cache entry of
# ``thunder.compile_stats(jitted).interpreter_cache`` instead (executors/hooks/compile_stash.py).


def last_pair_pass(jitted, *, compilation: int | None = None) -> PairPassResult | None:
    """What the fusion-pair pass did in the compilation of ``jitted`` whose computation last ran
    (or cache entry ``compilation``); None if it did not run."""
    return stashed(jitted, "pair_result", compilation)


def last_save_plan(jitted, *, compilation: int | None = None) -> SavePassResult | None:
    """What the whole-graph pass chose in the compilation of ``jitted`` whose computation last ran
    (or cache entry ``compilation``); None if it did not run (thunder_remat off, or an inference
    compilation: no backward, nothing to plan)."""
    return stashed(jitted, "save_result", compilation)


def last_joint_trace(jitted, *, compilation: int | None = None):
    """The joint forward+backward trace Thunder made in the compilation of ``jitted`` whose
    computation last ran (or cache entry ``compilation``), as thunder_remat first saw it (before
    any pass; None if thunder_remat was off or the compilation has no backward)."""
    return stashed(jitted, "joint_trace", compilation)


def _thunder_alone_bytes_now(joint) -> int:
    """Activation storage bytes Thunder alone saves for ``joint`` in the compilation in progress
    (kept for ``thunder_alone_saved_bytes``)."""
    from thunder_remat.executors.hooks.pipeline import fuse_as_thunder_alone_now
    from thunder_remat.trace_facts import forward_storages, thunder_split

    fused = fuse_as_thunder_alone_now(joint)
    saved = forward_storages(fused, with_backward=True).bytes_held(thunder_split(fused).saved)
    stash("alone", saved)
    return saved


def thunder_alone_saved_bytes(jitted, *, compilation: int | None = None) -> int | None:
    """Activation storage bytes Thunder without thunder_remat saves for the joint trace of the
    compilation of ``jitted`` whose computation last ran (or cache entry ``compilation``): the same
    executors fuse it, under that compilation's cache info, Thunder's own fusion-pair pass runs,
    then its forward/backward split (computed once per compilation, on first request; None if
    that compilation has no joint trace: thunder_remat off, or an inference compilation)."""
    from thunder_remat.executors.hooks.pipeline import fuse_as_thunder_alone
    from thunder_remat.trace_facts import forward_storages, thunder_split

    joint = last_joint_trace(jitted, compilation=compilation)
    if joint is None:
        return None
    cached = stashed(jitted, "alone", compilation)
    if cached is None:
        fused = fuse_as_thunder_alone(jitted, joint, compilation)
        cached = forward_storages(fused, with_backward=True).bytes_held(thunder_split(fused).saved)
        stash_for(jitted, "alone", cached, compilation)
    return cached
