"""Adapter for Thunder's torch.compile (Inductor; Triton on CUDA) fusion executor.

Written against lightning-thunder 0.2.6 (``thunder.executors.torch_compile``). Regions are
re-emitted with ``TorchCompileExecutor.fuse``; Thunder's own pair pass is gated off.

Building a region's callable (``make_compiled``: a region trace lowered to the torch executor and
turned into Python source) costs 0.3-0.5 s per region on CPU for a small GPT. Thunder's fusion
pass builds every region twice (in ``fuse`` and again in ``update_fusion_call_ctx``) and a
re-emitted region would be a third build. While thunder_remat is active, ``make_compiled`` is
therefore deferred: the fusion symbol carries a callable that builds the region on its first call,
under the compile options of the compilation that made it. Each region that runs is built once.
"""

from __future__ import annotations

import sys
import threading

import thunder.executors.torch_compile as _tc
import torch

from thunder_remat.executors.base import FusionAdapter, cache_info_now, cache_info_restored, register_adapter
from thunder_remat.executors.hooks.builtin_pass import builds_deferred, gate_module
from thunder_remat.executors.hooks.compile_stash import context_now, entered
from thunder_remat.fusion_regions import KernelModel, runs_convolution

__all__ = ["TorchCompileAdapter", "DeferredRegion", "install"]


#: Inductor settings under which a region runs its kernels in the order of the region's ops
#: (torch 2.11). Each of these moves a kernel the rewrite placed late to an earlier point, so a
#: value the plan computes again for a far reader is computed with the first computation and held
#: in between: horizontal fusion (kernels that only share inputs), the FX pass that reorders
#: inference graphs for locality, and the scheduler's reordering for peak memory. Fusing producers
#: into consumers, which makes a region fast, is untouched. Measured on the small LLaMA at 0.0:
#: the allocator's peak 1.152 MB with Inductor's defaults, 0.824 MB with these (the estimate's
#: walk: 0.824 MB). ``force_pointwise_cat``: on CPU Inductor otherwise writes a concatenation's
#: inputs into slices of its output (``ConcatKernel``), allocated by the first slice written, which
#: can run long before the cat; one pointwise kernel allocates the output where the cat is, as the
#: estimate's kernel model has it (litgpt pythia at 0.0, 64 tokens x 4: 1.893 MB with the slices,
#: 1.553 MB with one kernel, estimate 1.567 MB).
KEEP_ORDER_OPTIONS = {
    "score_fusion_memory_threshold": sys.maxsize,
    "reorder_for_locality": False,
    "reorder_for_peak_memory": False,
    "force_pointwise_cat": True,
}


class TorchCompileAdapter(FusionAdapter):
    merges_same_computations = True
    separates_forward_end = True

    def kernel_model(self) -> KernelModel | None:
        """Inductor's rules for computing a pointwise value inside its readers (its ``realize_*``
        settings, as torch 2.11 reads them; on CPU a reused value using ``exp`` or ``sigmoid`` is
        written), and its fused kernels allocating their outputs before they run.

        None for an executor that forms regions only around ``required_ops`` (Thunder's
        ``torchcompile_cat`` and ``torchcompile_xentropy``: the predicted regions, which take every
        op it can fuse, are not its regions) or that builds its regions without Inductor (a
        subclass replacing ``fuse``, as thunder_remat's eager executor does)."""
        if self.executor.required_ops is not None or type(self.executor).fuse is not _tc.TorchCompileExecutor.fuse:
            return None
        from torch._inductor import config as inductor_config

        # regions running a convolution are not cut: on CPU Inductor runs convolutions as oneDNN
        # kernels whose layout conversions and scratch memory the cut rule does not see, and cut,
        # they measured more (zoo, 1.0: ResNet 1.301 MB against 1.201 MB uncut, ConvNeXt 0.799
        # against 0.692 MB)
        # a graph with a CPU convolution gets channels-last convolutions where oneDNN is there
        # (``GraphLowering.decide_layout_opt``, torch 2.11)
        channels_last = bool(inductor_config.layout_optimization and (
            inductor_config.force_layout_optimization
            or (torch.backends.mkldnn.enabled and torch.backends.mkldnn.is_available())))
        return KernelModel(reads_threshold=int(inductor_config.realize_reads_threshold),
                           accumulated_reads_threshold=int(inductor_config.realize_acc_reads_threshold),
                           heavy_on_cpu=("exp", "sigmoid"), uncut_convolution_regions=True,
                           channels_last_convolutions_on_cpu=channels_last,
                           # the walk of such a region also applies Inductor's reorder_for_locality
                           # pass first (on by default; not read here)
                           orders_convolution_regions=bool(inductor_config.reorder_for_peak_memory),
                           merges_same_computations=self.merges_same_computations)

    def keep_plan_order(self, bsym) -> None:
        """Regions with a convolution keep Inductor's order: it runs CPU convolutions as oneDNN
        kernels with layout conversions it schedules itself, and measured, its order held less
        there (zoo ResNet at 1.0: 1.201 MB against 1.295 MB in the plan's order; ConvNeXt and
        ViT, whose patch embedding is a convolution, up to 19% and 11% more)."""
        if any(runs_convolution(sub) for sub in bsym.subsymbols):
            return
        # the region's callable, as Thunder 0.2.6's fusion bound symbols carry it
        region = bsym._call_ctx.get(bsym.sym.name) if bsym._call_ctx else None
        if isinstance(region, DeferredRegion):
            region.inductor_options = KEEP_ORDER_OPTIONS


class DeferredRegion:
    """A torch.compile region whose callable is built by ``make_compiled`` on first call.

    The compile data and cache info of the compilation that created it are re-entered for the
    build, so options ``make_compiled`` reads (``torch_compile_fullgraph``) and the default dtype
    factory ops read keep their values.
    """

    def __init__(self, build, args, kwargs) -> None:
        #: Inductor config set while the region runs (so while Dynamo compiles it); None: as set
        self.inductor_options: dict | None = None
        self._build = build
        self._parts = (args, kwargs, context_now(), cache_info_now())
        self._fn = None
        self._lock = threading.Lock()

    @property
    def built(self) -> bool:
        return self._fn is not None

    def build(self) -> None:
        """Build the region now (the first call does this anyway)."""
        if self._fn is None:
            with self._lock:
                if self._fn is None:
                    build_args, build_kwargs, context, info = self._parts
                    with entered(context), cache_info_restored(info):
                        self._fn = self._build(*build_args, **build_kwargs)
                    self._parts = None

    def __call__(self, *args):
        if self._fn is None:
            self.build()
        if self.inductor_options:
            # torch.compile compiles on the first call (and on a recompile), so the settings apply
            # around every call, not around the build
            from torch._inductor import config as inductor_config

            with inductor_config.patch(self.inductor_options):
                return self._fn(*args)
        return self._fn(*args)


def _gate_make_compiled(module) -> None:
    """Route ``module.make_compiled`` through a deferral while thunder_remat is active (idempotent)."""
    original = module.make_compiled
    if getattr(original, "_thunder_remat_gate", False):
        return

    def make_compiled(*args, **kwargs):
        if builds_deferred():
            return DeferredRegion(original, args, kwargs)
        return original(*args, **kwargs)

    make_compiled._thunder_remat_gate = True
    make_compiled.__wrapped__ = original
    module.make_compiled = make_compiled


def install() -> None:
    gate_module(_tc)
    _gate_make_compiled(_tc)
    register_adapter(lambda ex: isinstance(ex, _tc.TorchCompileExecutor), TorchCompileAdapter)
