"""Executor adapters for thunder_remat (installed as ``thunder_remat.executors``).

One adapter per fusion executor says what the executor can fuse, how to re-emit a rewritten
region through it, and how its built-in rematerialization is switched off while thunder_remat
runs. Every private touch of Thunder lives in this package; each module names the Thunder
version it was written against (0.2.6). nvFuser is imported lazily, so CPU installs work.
"""

from __future__ import annotations

from thunder_remat.executors.base import FusionAdapter, adapter_for, register_adapter

__all__ = [
    "FusionAdapter",
    "adapter_for",
    "register_adapter",
    "EXECUTOR_NAMES",
    "fusion_executor_by_name",
    "attention_executor_for",
]

#: fusion executors the main job and the benchmarks can be asked for by name
EXECUTOR_NAMES = ("eager", "torchcompile", "nvfuser")


def fusion_executor_by_name(name: str):
    """The Thunder fusion executor called ``name`` (one of ``EXECUTOR_NAMES``)."""
    if name == "eager":
        from thunder_remat.executors.eager import eager_fusion_ex

        return eager_fusion_ex
    if name == "torchcompile":
        from thunder.executors.torch_compile import torch_compile_ex

        return torch_compile_ex
    if name == "nvfuser":
        import thunder

        executor = thunder.get_executor("nvfuser")
        if executor is None:  # Thunder registers it only with an nvFuser wheel and CUDA
            raise RuntimeError("the nvfuser executor needs an nvFuser wheel for this torch and a CUDA GPU")
        return executor
    raise ValueError(f"fusion executor must be one of {list(EXECUTOR_NAMES)}, got {name!r}")


def attention_executor_for(device):
    """The executor that runs attention as one op on ``device`` (saving output and log-sum-exp):
    Thunder's sdpa executor on CUDA, thunder_remat's CPU flash-attention executor on CPU."""
    if str(device).startswith("cuda"):
        import thunder

        return thunder.get_executor("sdpa")
    from thunder_remat.executors.cpu_attention import cpu_attention_ex

    return cpu_attention_ex
