"""Putting thunder_remat's fusion pass at the end of Thunder's fusion passes.

Written against lightning-thunder 0.2.6:

* ``thunder.jit`` calls the module-level name ``thunder.transform_for_execution`` (imported from
  ``thunder.common``) on the joint forward+backward trace with ``cd.executors_list``. The wrapper
  installed here asks thunder_remat for its executor for this compilation (None when it is off),
  appends it after every other executor, so its fusion pass sees the regions of all fusion
  executors, and marks thunder_remat active so Thunder's own pair pass is skipped (see
  ``builtin_pass``).
* Only the traces made after the forward/backward split reach ``thunder.last_traces`` and
  ``thunder.last_backward_traces``; jit makes them with
  ``thunder.executors.passes.del_last_used``. The second wrapper appends thunder_remat's
  provenance line (what the pass did to the joint trace) to those traces' provenance.
"""

from __future__ import annotations

from collections.abc import Callable

import thunder
import thunder.executors.passes as _passes
from thunder.core.compile_data import get_compile_data
from thunder.core.trace import TraceProvenance
from thunder.extend import FusionExecutor

from thunder_remat.executors.builtin_pass import activated, deferring_builds
from thunder_remat.executors.thunder_speedups import enable_for_compilation
from thunder_remat.trace_facts import is_joint_trace

__all__ = ["install", "record_provenance", "fuse_as_thunder_alone"]

_ATTR = "_thunder_remat_provenance"
#: the executors (thunder_remat's own left out) the joint trace of a compilation was fused with
_EXECUTORS = "_thunder_remat_executors"


def record_provenance(line: str) -> None:
    """Remember ``line`` for the compilation in progress, to stamp on the forward/backward traces."""
    cd = get_compile_data()
    if cd is not None:
        setattr(cd, _ATTR, (*getattr(cd, _ATTR, ()), line))


def _unwrap(fn, marker: str):
    return fn.__wrapped__ if getattr(fn, marker, False) else fn


def install(
    executor_for_compilation: Callable[[tuple], FusionExecutor | None],
    is_ours: Callable,
    plan_joint_trace: Callable,
) -> None:
    """``plan_joint_trace(trace, executor)`` runs the whole-graph pass on a joint trace before fusion."""
    original = _unwrap(thunder.transform_for_execution, "_thunder_remat_pipeline")

    def transform_for_execution(trace, executors_list, *args, **kwargs):
        executors_list = tuple(executors_list)
        fusing = any(isinstance(ex, FusionExecutor) and not is_ours(ex) for ex in executors_list)
        joint = is_joint_trace(trace)
        if not (fusing or joint):
            return original(trace, executors_list, *args, **kwargs)
        cd = get_compile_data()
        if cd is not None and hasattr(cd, _ATTR):
            delattr(cd, _ATTR)
        ours = executor_for_compilation(executors_list)
        others = tuple(ex for ex in executors_list if not is_ours(ex))
        if ours is None:
            return original(trace, others, *args, **kwargs)
        enable_for_compilation()
        if joint:
            if cd is not None:
                setattr(cd, _EXECUTORS, others)
            trace = plan_joint_trace(trace, ours)
        if not fusing:
            return original(trace, others, *args, **kwargs)
        with activated():
            return original(trace, (*others, ours), *args, **kwargs)

    transform_for_execution._thunder_remat_pipeline = True
    transform_for_execution.__wrapped__ = original
    thunder.transform_for_execution = transform_for_execution

    original_del = _unwrap(_passes.del_last_used, "_thunder_remat_pipeline")

    def del_last_used(trace, *args, **kwargs):
        result = original_del(trace, *args, **kwargs)
        lines = getattr(get_compile_data(), _ATTR, ())
        if lines:
            line = "; ".join(lines)
            previous = result.get_provenance()
            text = previous.pss if previous is not None else ""
            result.set_provenance(TraceProvenance(f"{text}; after {line}" if text else line))
        return result

    del_last_used._thunder_remat_pipeline = True
    del_last_used.__wrapped__ = original_del
    _passes.del_last_used = del_last_used


def fuse_as_thunder_alone(jitted, joint):
    """``joint`` (a joint trace of ``jitted``'s latest compilation) fused as Thunder does without
    thunder_remat: the same executors, Thunder's own fusion-pair rematerialization included.
    Region callables are not built; the trace is only read (what Thunder alone would save)."""
    from thunder.core.compile_data import compile_data_and_stats

    cd, cs = thunder.compile_data(jitted), thunder.compile_stats(jitted)
    executors = getattr(cd, _EXECUTORS, None)
    if executors is None:
        raise ValueError("thunder_remat: no joint trace of this function was fused with thunder_remat on")
    original = _unwrap(thunder.transform_for_execution, "_thunder_remat_pipeline")

    # jit runs this under a cache-info context (some fusion passes read it): a fresh one here
    @thunder._with_cache_info_ctx
    def fuse():
        return original(joint, executors, use_del_last_used=False)[-1]

    with compile_data_and_stats(cd, cs), deferring_builds():
        return fuse()
