"""Adapter for Thunder's nvFuser executor, imported lazily.

Written against lightning-thunder 0.2.6 (``thunder.executors.nvfuserex_impl``). nvFuser has no
wheel for torch 2.11, so on most machines this module only reports that nvFuser is absent.
Where it exists, regions are re-emitted with ``nvFuserExecutor.fuse`` (which flattens and
re-creates the FusionDefinition) and Thunder's own pair pass is gated off.
"""

from __future__ import annotations

import importlib.util

from thunder_remat.executors.base import FusionAdapter, register_adapter
from thunder_remat.executors.builtin_pass import gate_module

__all__ = ["NvFuserAdapter", "nvfuser_available", "install"]


def nvfuser_available() -> bool:
    return importlib.util.find_spec("nvfuser") is not None


class NvFuserAdapter(FusionAdapter):
    pass


def _is_nvfuser(executor) -> bool:
    return getattr(executor, "name", None) == "nvfuser"


def install() -> bool:
    """Gate nvFuser's built-in pass if nvFuser imports; return whether it did."""
    if not nvfuser_available():
        return False
    try:
        import thunder.executors.nvfuserex_impl as impl
    except Exception:  # nvFuser present but broken for this torch: nothing to gate
        return False
    gate_module(impl)
    register_adapter(_is_nvfuser, NvFuserAdapter)
    return True
