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
* What a compilation did is kept per compilation (``compile_stash``), with the executors its joint
  trace was fused with and the jit call's cache info (``thunder._get_cache_info()``, live while
  Thunder compiles), so that ``fuse_as_thunder_alone`` can later fuse the joint trace again as
  Thunder alone would have, in the same state.
"""

from __future__ import annotations

from collections.abc import Callable

import thunder
import thunder.executors.passes as _passes
from thunder.core.trace import TraceProvenance
from thunder.extend import FusionExecutor

from thunder_remat.executors.base import cache_info_now, cache_info_restored
from thunder_remat.executors.hooks.builtin_pass import activated, deferring_builds
from thunder_remat.executors.hooks.compile_stash import compilation_of, context_of, entered, stash, stashed_now
from thunder_remat.executors.hooks.thunder_speedups import enable_for_compilation
from thunder_remat.trace_facts import is_joint_trace

__all__ = ["install", "record_provenance", "fuse_as_thunder_alone", "fuse_as_thunder_alone_now"]


def record_provenance(line: str) -> None:
    """Remember ``line`` for the compilation in progress, to stamp on the forward/backward traces."""
    stash("provenance", (*(stashed_now("provenance") or ()), line))


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
        if stashed_now("provenance"):
            stash("provenance", ())
        ours = executor_for_compilation(executors_list)
        others = tuple(ex for ex in executors_list if not is_ours(ex))
        if ours is None:
            return original(trace, others, *args, **kwargs)
        enable_for_compilation()
        if joint:
            # what fuse_as_thunder_alone needs to fuse this joint trace again as this compilation would
            stash("executors", others)
            info = cache_info_now()
            stash("cache_info", dict(info) if info is not None else None)
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
        lines = stashed_now("provenance")
        if lines:
            line = "; ".join(lines)
            previous = result.get_provenance()
            text = previous.pss if previous is not None else ""
            result.set_provenance(TraceProvenance(f"{text}; after {line}" if text else line))
        return result

    del_last_used._thunder_remat_pipeline = True
    del_last_used.__wrapped__ = original_del
    _passes.del_last_used = del_last_used


def fuse_as_thunder_alone(jitted, joint, compilation: int | None = None):
    """``joint`` (the joint trace of one compilation of ``jitted``: by default the one whose
    computation last ran, else the index of its cache entry; see ``compile_stash``) fused as
    Thunder does without thunder_remat: the same executors, Thunder's own fusion-pair
    rematerialization included. Region callables are not built; the trace is only read (what
    Thunder alone would save).

    It runs as that compilation ran (Thunder 0.2.6): inside the function's compile data and stats
    (``compile_data_and_stats``), its language context, and the cache info of the jit call that
    compiled it (``thunder._cache_info_ctx``, which ``ltorch.full``/``ones`` read for the default
    dtype and device when a fusion pass lowers them again)."""
    record = compilation_of(jitted, compilation)
    executors = None if record is None else record.get("executors")
    if executors is None:
        raise ValueError("thunder_remat: this compilation's joint trace was not fused with thunder_remat on")
    original = _unwrap(thunder.transform_for_execution, "_thunder_remat_pipeline")
    # a copy: the fusion passes must not change the recorded cache info
    info = record.get("cache_info")
    with entered(context_of(jitted), language=True), deferring_builds(), \
            cache_info_restored(dict(info) if info is not None else {}):
        return original(joint, executors, use_del_last_used=False)[-1]


def fuse_as_thunder_alone_now(joint):
    """``joint`` fused as Thunder alone would fuse it in the compilation in progress: the executors
    stashed for it, Thunder's own fusion-pair pass, a copy of the live cache info (the fusion
    passes must not change it). Region callables are not built (Thunder 0.2.6, as
    ``fuse_as_thunder_alone``)."""
    original = _unwrap(thunder.transform_for_execution, "_thunder_remat_pipeline")
    info = cache_info_now()
    with deferring_builds(), cache_info_restored(dict(info) if info is not None else {}):
        return original(joint, stashed_now("executors") or (), use_del_last_used=False)[-1]
