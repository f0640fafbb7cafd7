"""Adapter for Thunder's torch.compile (Inductor; Triton on CUDA) fusion executor.

Written against lightning-thunder 0.2.6 (``thunder.executors.torch_compile``). Regions are
re-emitted with ``TorchCompileExecutor.fuse``; Thunder's own pair pass is gated off.
"""

from __future__ import annotations

import thunder.executors.torch_compile as _tc

from thunder_remat.executors.base import FusionAdapter, register_adapter
from thunder_remat.executors.builtin_pass import gate_module

__all__ = ["TorchCompileAdapter", "install"]


class TorchCompileAdapter(FusionAdapter):
    pass


def install() -> None:
    gate_module(_tc)
    register_adapter(lambda ex: isinstance(ex, _tc.TorchCompileExecutor), TorchCompileAdapter)
