"""Switching Thunder's own networkx fusion-pair rematerialization off while thunder_remat runs.

Written against lightning-thunder 0.2.6, where ``thunder.executors.torch_compile`` and
``thunder.executors.nvfuserex_impl`` each import ``rematerialize`` from
``thunder.core.rematerialization`` into their module namespace and call it at the end of their
``fusion_pass``. We replace that module-level name with a gate that skips the call whenever
thunder_remat is active for the compilation in progress, and calls Thunder's pass otherwise.
"""

from __future__ import annotations

import contextlib
import contextvars

__all__ = ["remat_active", "activated", "builds_deferred", "deferring_builds", "gate_module"]

_ACTIVE: contextvars.ContextVar[bool] = contextvars.ContextVar("thunder_remat_active", default=False)
_DEFER: contextvars.ContextVar[bool] = contextvars.ContextVar("thunder_remat_defer_builds", default=False)


def remat_active() -> bool:
    return _ACTIVE.get()


def builds_deferred() -> bool:
    """Region callables are built on first call (thunder_remat is active, or a trace is being
    fused only to be read, as for the figure of what Thunder alone saves)."""
    return _ACTIVE.get() or _DEFER.get()


@contextlib.contextmanager
def _setting(var):
    token = var.set(True)
    try:
        yield
    finally:
        var.reset(token)


def activated():
    return _setting(_ACTIVE)


def deferring_builds():
    return _setting(_DEFER)


def gate_module(module) -> None:
    """Route ``module.rematerialize`` through the gate (idempotent)."""
    original = getattr(module, "rematerialize", None)
    if original is None or getattr(original, "_thunder_remat_gate", False):
        return

    def rematerialize(trace):
        if remat_active():
            return trace
        return original(trace)

    rematerialize._thunder_remat_gate = True
    rematerialize.__wrapped__ = original
    module.rematerialize = rematerialize
