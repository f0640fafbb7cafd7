"""The adapter interface and the lookup from a Thunder executor to its adapter.

Written against lightning-thunder 0.2.6: ``FusionExecutor.can_fuse(bsym)`` and
``FusionExecutor.fuse(region, counter)``, where ``region`` needs ``inputs``/``outputs``
(Variables) and ``bound_symbols``, as ``thunder.executors.passes._update_fusion_call_ctx`` uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from thunder.core.proxies import variableify

__all__ = ["FusionAdapter", "adapter_for", "register_adapter", "cache_info_now", "cache_info_restored",
           "fusion_counter"]


def cache_info_now():
    """The cache info of the jit call in progress (``thunder._get_cache_info()`` in 0.2.6: the
    default dtype and other state a trace was made under), or None outside one."""
    import thunder

    try:
        return thunder._get_cache_info()
    except LookupError:
        return None


class cache_info_restored:
    """Re-enter a jit call's cache info, so that a region built after the call (on its first
    run) is lowered as it would have been during it; factory ops read the default dtype there."""

    def __init__(self, info) -> None:
        self.info, self.token = info, None

    def __enter__(self):
        import thunder

        if self.info is not None:
            self.token = thunder._cache_info_ctx.set(self.info)
        return self

    def __exit__(self, *exc):
        import thunder

        if self.token is not None:
            thunder._cache_info_ctx.reset(self.token)


@dataclass(frozen=True)
class _RegionView:
    inputs: tuple
    outputs: tuple
    bound_symbols: tuple


def _fusion_counter(name: str) -> int:
    digits = name[len(name.rstrip("0123456789")) :]
    return int(digits) if digits else 0


class FusionAdapter:
    """Works for any Thunder FusionExecutor; subclasses add what is specific to one executor."""

    #: the executor's compiler computes two ops of one region that compute the same value once
    #: (and may fuse the readers of one buffer into one kernel), so a value recomputed again for
    #: a far reader is held from the first computation unless a cut separates the two
    #: (``fusion_regions.to_keep_apart``; measured for Inductor, docs/whole-graph.md)
    merges_same_computations: bool = False
    #: a region of this executor that Thunder fused across the forward's end is cut there
    #: (``pairs.split.separate_forward_and_backward``; measured with torch.compile; with nvFuser the
    #: pieces would add backward regions and bytes crossing between them, not measured: left whole)
    separates_forward_end: bool = False

    def __init__(self, executor) -> None:
        self.executor = executor

    def can_fuse(self, bsym) -> bool:
        """Whether this executor could run ``bsym`` inside one of its regions."""
        return bool(self.executor.can_fuse(bsym))

    def kernel_model(self):
        """How the executor's compiler holds memory inside a region, where that differs from its
        ops freeing what they last read in order (``fusion_regions.KernelModel``); None: it does
        not (or is not modelled)."""
        return None

    def keep_plan_order(self, bsym) -> None:
        """Make the region ``bsym`` calls run its ops in the order they appear in it, where the
        executor's compiler would move them (the estimate walks that order). Nothing to do for
        executors that keep it."""

    def reemit(self, bsym):
        """Rebuild a rewritten region through its own executor, keeping its name."""
        region = _RegionView(
            inputs=tuple(variableify(p) for p in bsym.flat_proxy_args),
            outputs=tuple(variableify(p) for p in bsym.flat_proxy_outs),
            bound_symbols=tuple(bsym.subsymbols),
        )
        return self.executor.fuse(region, _fusion_counter(bsym.sym.name))


    def fuse_piece(self, inputs, outputs, bound_symbols, counter: int):
        """A new region of this executor running ``bound_symbols`` (one piece of a split region),
        named with ``counter``; ``inputs``/``outputs``: proxies."""
        region = _RegionView(
            inputs=tuple(variableify(p) for p in inputs),
            outputs=tuple(variableify(p) for p in outputs),
            bound_symbols=tuple(bound_symbols),
        )
        return self.executor.fuse(region, counter)


def fusion_counter(name: str) -> int:
    """The number in a region's name (``TorchCompile3`` -> 3)."""
    return _fusion_counter(name)


_ADAPTERS: list[tuple[Callable[[object], bool], type[FusionAdapter]]] = []


def register_adapter(matches: Callable[[object], bool], adapter_cls: type[FusionAdapter]) -> None:
    """Adapters registered later win, so a specific adapter can refine the generic one."""
    _ADAPTERS.insert(0, (matches, adapter_cls))


def adapter_for(executor) -> FusionAdapter:
    for matches, cls in _ADAPTERS:
        if matches(executor):
            return cls(executor)
    return FusionAdapter(executor)
