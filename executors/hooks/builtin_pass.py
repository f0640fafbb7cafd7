"""Switching Thunder's own networkx fusion-pair rematerialization off while thunder_remat runs.

Written against lightning-thunder 0.2.6, where ``thunder.executors.torch_compile`` and
``thunder.executors.nvfuserex_impl`` each import ``rematerialize`` from
``thunder.core.rematerialization`` into their module namespace and call it at the end of their
``fusion_pass``. We replace that module-level name with a gate that skips the call whenever
thunder_remat is active for the compilation in progress, and calls Thunder's pass otherwise.
A module Thunder imports only under conditions (``nvfuserex_impl``, when CUDA is available) is
gated when it is imported, or, if that happens after thunder_remat installs, at the start of the
next compilation thunder_remat is active in (``gate_when_imported``).
"""

from __future__ import annotations

import contextlib
import contextvars
import sys

__all__ = ["remat_active", "activated", "builds_deferred", "deferring_builds", "gate_module", "gate_when_imported"]

_ACTIVE: contextvars.ContextVar[bool] = contextvars.ContextVar("thunder_remat_active", default=False)
_DEFER: contextvars.ContextVar[bool] = contextvars.ContextVar("thunder_remat_defer_builds", default=False)
#: names of executor modules to gate once they are imported (see ``gate_when_imported``)
_PENDING: set[str] = set()


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
    if _PENDING:
        _gate_pending()
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


def gate_when_imported(module_name: str) -> bool:
    """Gate ``module_name`` now if it is imported (return True), else at the start of the first
    compilation thunder_remat is active in after it is. Thunder imports some executor modules only
    under conditions (nvFuser's when CUDA is available at ``import thunder``), and importing one
    ourselves could fail or change what Thunder registers."""
    module = sys.modules.get(module_name)
    if module is not None and hasattr(module, "rematerialize"):
        gate_module(module)
        _PENDING.discard(module_name)
        return True
    _PENDING.add(module_name)
    return False


def _gate_pending() -> None:
    for name in tuple(_PENDING):
        gate_when_imported(name)
