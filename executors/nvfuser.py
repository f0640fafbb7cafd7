"""Adapter for Thunder's nvFuser executor, imported lazily.

Written against lightning-thunder 0.2.6 (``thunder.executors.nvfuserex`` and
``thunder.executors.nvfuserex_impl``). nvFuser has no wheel for torch 2.11, so on most machines this
module only reports that nvFuser is absent. Where it exists, regions are re-emitted with
``nvFuserExecutor.fuse`` (which flattens and re-creates the FusionDefinition) and Thunder's own pair
pass is gated off.

nvFuser wheels ship one of two layouts: ``nvfuser_direct`` alone (0.2.36 and later) or ``nvfuser``
beside ``nvfuser_direct`` (0.2.35 and earlier). Thunder 0.2.6 tries ``nvfuser_direct`` first, then
``nvfuser``, and only when ``torch.cuda.is_available()``; when it finds one, ``import thunder`` imports
``nvfuserex_impl`` (which registers the executor), and otherwise nothing imports it. Thunder
therefore has nvFuser regions only if that module was imported, and it normally is by the time
thunder_remat (which imports Thunder first) installs: the gate goes on then. Should it be imported
later (explicitly, after thunder_remat), the gate goes on at the first compilation thunder_remat is
active in (``builtin_pass.gate_when_imported``). Importing it here instead would run its version checks
without CUDA, which fail.
"""

from __future__ import annotations

import importlib.util
import logging

from thunder_remat.executors.base import FusionAdapter, register_adapter
from thunder_remat.executors.hooks.builtin_pass import gate_when_imported

__all__ = ["NvFuserAdapter", "nvfuser_module", "nvfuser_available", "nvfuser_runs_regions", "install"]

log = logging.getLogger(__name__)

#: Thunder's nvFuser executor module: imported by ``import thunder`` only when it found nvFuser
IMPL_MODULE = "thunder.executors.nvfuserex_impl"
#: the module names nvFuser wheels install, in the order Thunder 0.2.6 tries them
MODULE_NAMES = ("nvfuser_direct", "nvfuser")


def nvfuser_module() -> str | None:
    """The nvFuser module Thunder would import here (installed, not imported: a wheel whose module
    needs a CUDA driver to import is still found), or None."""
    for name in MODULE_NAMES:
        if importlib.util.find_spec(name) is not None:
            return name
    return None


def nvfuser_available() -> bool:
    """Whether an nvFuser package is installed (either layout); Thunder uses it only with CUDA."""
    return nvfuser_module() is not None


def nvfuser_runs_regions() -> bool:
    """Whether Thunder 0.2.6 can execute nvFuser regions here: a CUDA device, Thunder's nvFuser
    executor registered, and the ``nvfuser`` module, because a region's first call imports
    ``compute_tensor_descriptor`` from ``nvfuser`` whichever module defined the fusion
    (``nvfuserex_impl.compute_contiguity``). Wheels with ``nvfuser_direct`` alone build traces
    and FusionDefinitions but cannot run a region under Thunder 0.2.6."""
    import torch

    if not (torch.cuda.is_available() and importlib.util.find_spec("nvfuser") is not None):
        return False
    import thunder

    try:
        return thunder.get_executor("nvfuser") is not None
    except Exception:  # a broken nvFuser install: the executor cannot be looked up
        return False


class NvFuserAdapter(FusionAdapter):
    def can_fuse(self, bsym) -> bool:
        """nvFuser's fusion pass puts an op in a region only if the executor claims it *and* it
        reads or writes a CUDA tensor; an op the consumer region takes over must pass both."""
        return bool(self.executor.can_fuse(bsym)) and bool(self.executor.has_cuda_input_or_output(bsym))


def _is_nvfuser(executor) -> bool:
    return getattr(executor, "name", None) == "nvfuser"


def install() -> bool:
    """Register the adapter and gate Thunder's nvFuser pair pass where nvFuser is installed; return
    whether it is. The gate goes on now if Thunder imported its nvFuser executor, else when it is."""
    module = nvfuser_module()
    if module is None:
        return False
    register_adapter(_is_nvfuser, NvFuserAdapter)
    gated_now = gate_when_imported(IMPL_MODULE)
    log.debug("nvFuser module %s found; Thunder's nvFuser pass %s", module,
              "gated" if gated_now else "gated once Thunder imports its nvFuser executor")
    return True
