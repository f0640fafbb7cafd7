"""Executor adapters for thunder_remat (installed as ``thunder_remat.executors``).

One adapter per fusion executor says what the executor can fuse, how to re-emit a rewritten
region through it, and how its built-in rematerialization is switched off while thunder_remat
runs. Every private touch of Thunder lives in this package; each module names the Thunder
version it was written against (0.2.6). nvFuser is imported lazily, so CPU installs work.
"""

from __future__ import annotations

from thunder_remat.executors.base import FusionAdapter, adapter_for, register_adapter

__all__ = ["FusionAdapter", "adapter_for", "register_adapter"]
