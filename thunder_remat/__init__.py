"""thunder_remat: rematerialization for Lightning Thunder with min cuts on igraph flow networks.

Importing the package registers the ``remat`` plugin and compile options with Thunder.
"""

from __future__ import annotations

import logging

from thunder_remat.config import RematConfig
from thunder_remat.plugin import Remat, RematFusionExecutor, RematTransform, last_pair_pass, last_save_plan
from thunder_remat.executors.hooks.thunderfx import thunderfx_subgraphs
from thunder_remat.inspect.draw import draw
from thunder_remat.inspect.report import explain
from thunder_remat.inspect.tradeoff import plot_tradeoff, sweep_budgets
from thunder_remat.verify import VerificationError, verify
from thunder_remat.policies import (
    DEFAULT_POLICIES,
    KeepSmallReductions,
    NeverRecomputeContractions,
    NeverRecomputeMatmul,
    NeverRecomputeRandom,
    RespectThunderTags,
)

__all__ = [
    "RematConfig", "Remat", "RematTransform", "RematFusionExecutor", "last_pair_pass", "last_save_plan",
    "thunderfx_subgraphs",
    "DEFAULT_POLICIES", "NeverRecomputeRandom", "NeverRecomputeMatmul", "NeverRecomputeContractions",
    "KeepSmallReductions",
    "RespectThunderTags", "sweep_budgets", "plot_tradeoff", "explain", "draw", "verify", "VerificationError", "__version__",
]
__version__ = "0.2.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())


def _install() -> None:
    import thunder.plugins

    from thunder_remat.executors import nvfuser, torch_compile
    from thunder_remat.executors.hooks import pipeline, thunder_speedups
    from thunder_remat.plugin import executor_for_compilation, is_remat_executor, plan_joint_trace

    torch_compile.install()
    nvfuser.install()
    thunder_speedups.install()
    pipeline.install(executor_for_compilation, is_remat_executor, plan_joint_trace)
    thunder.plugins.register_plugin("remat", Remat)


_install()
