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

import threading

import thunder.executors.torch_compile as _tc
# The (compile data, compile stats) context variable: get_compile_option needs both, and there is
# no public getter for the stats in 0.2.6.
from thunder.core.compile_data import _compile_data, compile_data_and_stats

from thunder_remat.executors.base import FusionAdapter, cache_info_now, cache_info_restored, register_adapter
from thunder_remat.executors.builtin_pass import builds_deferred, gate_module

__all__ = ["TorchCompileAdapter", "DeferredRegion", "install"]


class TorchCompileAdapter(FusionAdapter):
    merges_same_computations = True


class DeferredRegion:
    """A torch.compile region whose callable is built by ``make_compiled`` on first call.

    The compile data and cache info of the compilation that created it are re-entered for the
    build, so options ``make_compiled`` reads (``torch_compile_fullgraph``) and the default dtype
    factory ops read keep their values.
    """

    def __init__(self, build, args, kwargs) -> None:
        self._build = build
        self._parts = (args, kwargs, _compile_data.get(), cache_info_now())
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
                    build_args, build_kwargs, (cd, cs), info = self._parts
                    with compile_data_and_stats(cd, cs), cache_info_restored(info):
                        self._fn = self._build(*build_args, **build_kwargs)
                    self._parts = None

    def __call__(self, *args):
        if self._fn is None:
            self.build()
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
