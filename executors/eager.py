"""A light fusion executor for fast logic tests and quick runs: regions run eagerly in PyTorch.

It groups symbols exactly like Thunder's torch.compile executor (it reuses that executor's
fusion pass, written against lightning-thunder 0.2.6) but a region's body is executed by Thunder's
plain torch executor instead of being compiled by Inductor, so building one costs milliseconds.
"""

from __future__ import annotations

import torch
from thunder.core import prims
from thunder.core.codeutils import SigInfo
from thunder.core.proxies import unvariableify
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, tracectx
from thunder.executors.passes import transform_for_execution
from thunder.executors.torch_compile import TorchCompileExecutor
from thunder.executors.torchex import ex as pytorch_ex
from thunder.executors.torchex import no_autocast
from thunder.extend import ImplInfo

from thunder_remat.executors.base import cache_info_now, cache_info_restored

__all__ = ["EagerFusionExecutor", "eager_fusion_ex", "make_eager_executor"]


class _LazyRegion:
    """Builds the region's Python callable on first call, so re-emitting a region stays cheap.
    The build runs under the cache info of the jit call that made the region."""

    def __init__(self, bsyms, inputs, outputs) -> None:
        self._parts = (bsyms, inputs, outputs)
        self._info = cache_info_now()
        self._fn = None

    @property
    def built(self) -> bool:
        return self._fn is not None

    def build(self) -> None:
        if self._fn is None:
            with cache_info_restored(self._info):
                self._fn = _region_callable(*self._parts)

    def __call__(self, *args):
        self.build()
        return self._fn(*args)


def _region_callable(bsyms, inputs, outputs):
    region = TraceCtx(None)
    region.args = list(inputs)
    region.kwargs = {}
    region.names = {a.name for a in inputs}
    with tracectx(region):
        for a in inputs:
            prims.unpack_trivial(a, name=a.name)
    region.bound_symbols += list(bsyms)
    region.bound_symbols.append(prims.python_return.bind(list(outputs), output=None))
    for bsym in bsyms:
        for sub in (bsym, *bsym.subsymbols):
            for o in sub.flat_proxy_outs:
                if o.name not in region.names:
                    region.add_name(o.name)
    region._siginfo = SigInfo("eager_region")
    region._siginfo.args = [(a.name, None) for a in inputs]
    fn = transform_for_execution(region, executors_list=(pytorch_ex,)).python_callable(include_decorators=False)
    return torch.no_grad()(no_autocast(fn))


class EagerFusionExecutor(TorchCompileExecutor):
    """Fusion regions named ``EagerFusion<n>``, executed op by op."""

    def fuse(self, region, fusion_counter: int) -> BoundSymbol:
        inputs = [unvariableify(x) for x in region.inputs]
        outputs = [unvariableify(x) for x in region.outputs]
        name = f"EagerFusion{fusion_counter}"
        sym = Symbol(name, meta=None, is_fusion=True, executor=self)
        return BoundSymbol(
            sym, tuple(inputs), {}, tuple(outputs), tuple(region.bound_symbols),
            _call_ctx={name: _LazyRegion(tuple(region.bound_symbols), inputs, outputs)},
        )


def make_eager_executor(name: str = "remat_eager", *, exclude=()) -> EagerFusionExecutor:
    """An eager fusion executor that fuses every torch op except those in ``exclude`` (op ids).

    Excluding ops splits the program into several regions, which is how tests get many pairs
    and cross-executor pairs without Inductor compiles.
    """
    ex = EagerFusionExecutor(name=name)
    excluded = set(exclude)
    ex._implmap = {op: ImplInfo() for op in pytorch_ex.implmap if op not in excluded}
    return ex


eager_fusion_ex = make_eager_executor()
