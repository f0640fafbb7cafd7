"""ThunderFX (``thunder.dynamo.thunderfx``): the Thunder-compiled subgraphs of a compiled object.

Written against lightning-thunder 0.2.6, where ``thunderfx(fn, **options)`` hands the options to
``thunder.jit`` for every subgraph Dynamo passes to Thunder, so ``remat=True`` and the other
``remat_*`` options reach thunder_remat there, and the returned ``ThunderFXCompiledObject`` keeps
its ``ThunderCompiler`` backend as ``_backend``, whose ``subgraph_infos[i].thunder_compiled_fns``
are those jitted subgraphs.
"""

from __future__ import annotations

__all__ = ["thunderfx_subgraphs"]


def thunderfx_subgraphs(compiled) -> list:
    """The ``thunder.jit``-ed subgraphs of a ``thunderfx`` result, in the order Dynamo made them
    (after one call). Pass each to ``thunder_remat.last_save_plan`` or ``explain``."""
    backend = getattr(compiled, "_backend", None)
    infos = getattr(backend, "subgraph_infos", None)
    if infos is None:
        raise TypeError(f"thunder_remat.thunderfx_subgraphs needs the result of thunder.dynamo.thunderfx, "
                        f"got {type(compiled).__name__}")
    return [fn for info in infos for fn in (info.thunder_compiled_fns or ())]
