"""Recognising FSDP ZeRO-3 in the compilation in progress.

Written against lightning-thunder 0.2.6: ``thunder.plugins.FSDP`` and
``thunder.jit(transforms=[FSDPTransform(...)])`` both put a
``thunder.distributed.transforms.fsdp_v2.FSDPTransform`` with a ``sharding_strategy`` attribute in
the compile data's ``transforms``. The traces themselves do not say ZeRO-2 from ZeRO-3 (both
all-gather parameters in the forward), so the transform is the only reliable signal.
"""

from __future__ import annotations

from thunder_remat.executors.hooks.compile_stash import transforms_now

__all__ = ["zero3_active"]


def zero3_active() -> bool:
    try:
        from thunder.distributed import FSDPType
        from thunder.distributed.transforms.fsdp_v2 import FSDPTransform
    except Exception:  # torch.distributed unavailable: no FSDP
        return False
    return any(
        isinstance(t, FSDPTransform) and t.sharding_strategy == FSDPType.ZERO3
        for t in transforms_now()
    )
