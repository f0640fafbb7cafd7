"""Measured run time of single forward ops, for ``remat_cost_model="measured"``.

Written against lightning-thunder 0.2.6 internals: an op of the joint trace is put alone in a
``TraceCtx`` (with a ``SigInfo`` so it can become Python), lowered onto Thunder's torch executor
by ``thunder.executors.passes.transform_for_execution`` (the unwrapped pass, so thunder_remat
does not run on it), and called on random tensors of the op's shapes, dtypes and devices. On
CUDA the time comes from CUDA events around each call; on CPU from ``time.perf_counter``. The
median of ``repeats`` calls after ``warmup`` calls is kept.

Timings are cached per op signature (name, argument shapes, dtypes, devices and constants) for
the life of the process, so the layers of a model are timed once and the same trace gets the same
costs again in one process. Across processes measured costs vary with the machine's noise.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Mapping

import torch
from thunder.core import prims
from thunder.core.codeutils import SigInfo
from thunder.core.devices import to_torch_device
from thunder.core.dtypes import to_torch_dtype
from thunder.core.proxies import NumberProxy, TensorProxy
from thunder.core.trace import TraceCtx, tracectx
from thunder.executors.passes import transform_for_execution
from thunder.executors.torchex import ex as torch_ex

from thunder_remat.cost import dim_size

__all__ = ["time_ops", "op_signature", "clear_timing_cache"]

log = logging.getLogger(__name__)

#: op signature -> measured microseconds (None: the op could not be run alone)
_CACHE: dict[str, float | None] = {}
#: seconds between progress messages while timing
PROGRESS_EVERY_S = 5.0


def clear_timing_cache() -> None:
    _CACHE.clear()


def _shape(proxy) -> tuple[int, ...]:
    return tuple(dim_size(d) for d in proxy.shape)


def _describe(arg) -> str:
    if isinstance(arg, TensorProxy):
        return f"T{_shape(arg)}:{arg.dtype}:{arg.device}"
    if isinstance(arg, NumberProxy):
        return f"N{arg.value!r}"
    return repr(arg)


def op_signature(bsym) -> str:
    """What decides an op's run time: its name and the shapes, dtypes, devices and constants it reads."""
    return f"{bsym.sym.name}(" + ", ".join(_describe(a) for a in bsym.flat_args) + ")"


def _one_op_callable(bsym):
    args = list({p.name: p for p in bsym.flat_proxy_args}.values())
    trace = TraceCtx()
    for p in (*args, *bsym.flat_proxy_outs):
        trace.add_name(p.name)
    trace.args = args
    trace._siginfo = SigInfo.from_name_and_args("thunder_remat_timed_op", args)
    with tracectx(trace):
        trace.bound_symbols.append(bsym)
        prims.python_return(tuple(bsym.flat_proxy_outs))
    return transform_for_execution(trace, executors_list=[torch_ex]).python_callable(), args


def _example(proxy):
    if isinstance(proxy, NumberProxy):
        return proxy.value
    dtype, device = to_torch_dtype(proxy.dtype), to_torch_device(proxy.device)
    shape = _shape(proxy)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.rand(shape, dtype=dtype, device=device)  # in [0, 1): no log/sqrt of negatives
    return torch.zeros(shape, dtype=dtype, device=device)  # valid indices for gathers and embeddings


def _time_one(bsym, repeats: int, warmup: int) -> float | None:
    try:
        fn, args = _one_op_callable(bsym)
        inputs = [_example(p) for p in args]
        devices = {t.device for t in inputs if isinstance(t, torch.Tensor)}
        cuda = any(d.type == "cuda" for d in devices)
        for _ in range(warmup):
            fn(*inputs)
        samples = []
        for _ in range(repeats):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn(*inputs)
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e3)
            else:
                t0 = time.perf_counter()
                fn(*inputs)
                samples.append((time.perf_counter() - t0) * 1e6)
        return float(statistics.median(samples))
    except Exception as exc:  # an op that cannot run alone keeps its flop-based estimate
        log.debug("could not time %s alone: %s: %s", bsym.sym.name, type(exc).__name__, exc)
        return None


def time_ops(bsyms: Mapping[int, object], *, repeats: int = 5, warmup: int = 2) -> dict[int, float]:
    """Microseconds per call for each op (keyed as given); ops that cannot be run alone are left out."""
    out: dict[int, float] = {}
    start = last = time.perf_counter()
    new = 0
    for n, (key, bsym) in enumerate(bsyms.items(), 1):
        signature = op_signature(bsym)
        if signature not in _CACHE:
            _CACHE[signature] = _time_one(bsym, repeats, warmup)
            new += 1
        if _CACHE[signature] is not None:
            out[key] = _CACHE[signature]
        now = time.perf_counter()
        if now - last >= PROGRESS_EVERY_S:
            log.info("thunder_remat: timed %d of %d forward ops (%.0f s)", n, len(bsyms), now - start)
            last = now
    log.info("thunder_remat: measured %d forward ops (%d new signatures, %d could not run alone) in %.2f s",
             len(bsyms), new, len(bsyms) - len(out), time.perf_counter() - start)
    return out
