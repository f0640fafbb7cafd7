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

__all__ = ["remat_active", "activated", "gate_module"]

_ACTIVE: contextvars.ContextVar[bool] = contextvars.ContextVar("thunder_remat_active", default=False)


def remat_active() -> bool:
    return _ACTIVE.get()


@contextlib.contextmanager
def activated():
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


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
