"""Rewrite: make the backward recompute the forward ops a ``SavePlan`` chose, just before first use.

Every backward bound symbol that reads a value produced by a recomputed forward op gets, right
before it, a copy of that op (and, first, of the recomputed ops it depends on), tagged
``BACKWARD`` and writing fresh names (``rc_<name>``); the reader is switched to the copies. The
forward's own op stays for the forward outputs that need it; when nothing forward needs it,
Thunder's dead-code elimination drops it, so the value is no longer saved for backward.
Recomputing at first use keeps each recomputed value alive for as short a time as possible.
"""

from __future__ import annotations

from thunder.core.proxies import variableify
from thunder.core.symbol import BoundSymbolTag
from thunder.core.trace import from_trace, tracectx

from thunder_remat.joint_analysis import is_backward, reads_forward_values

__all__ = ["insert_recomputation"]


def insert_recomputation(trace, recomputed_indices):
    """A new joint trace in which the backward recomputes the forward bsyms at ``recomputed_indices``."""
    recompute = {i: trace.bound_symbols[i] for i in recomputed_indices}
    if not recompute:
        return trace
    producer_index = {p.name: i for i, b in recompute.items() for p in b.flat_proxy_outs}
    new = from_trace(trace)
    new.bound_symbols = []
    swap: dict = {}  # variable of a forward value -> its recomputed copy
    done: set[int] = set()

    def emit(i: int) -> None:
        if i in done:
            return
        done.add(i)
        bsym = recompute[i]
        for p in bsym.flat_proxy_args:
            j = producer_index.get(p.name)
            if j is not None and j != i:
                emit(j)
        with tracectx(new):
            for out in bsym.flat_proxy_outs:
                swap[variableify(out)] = out.replace_name(f"rc_{out.name}", disambiguate=True)
        copy = bsym.from_bsym_swap_proxies(swap, skip_inputs=False, skip_output=False, skip_subsymbols=False)
        copy.tags.add(BoundSymbolTag.BACKWARD)
        copy.tags.discard(BoundSymbolTag.RECOMPUTE_IN_BACKWARD)
        new.bound_symbols.append(copy)

    for bsym in trace.bound_symbols:
        if is_backward(bsym) and reads_forward_values(bsym):
            for p in bsym.flat_proxy_args:
                j = producer_index.get(p.name)
                if j is not None:
                    emit(j)
            if any(variableify(p) in swap for p in bsym.flat_proxy_args):
                bsym = bsym.from_bsym_swap_proxies(swap, skip_inputs=False, skip_output=True, skip_subsymbols=False)
        new.bound_symbols.append(bsym)
    return new
