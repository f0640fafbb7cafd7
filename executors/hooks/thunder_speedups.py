"""Linear-time stand-ins for two Thunder helpers that are quadratic in a fusion region's size.

Written against lightning-thunder 0.2.6. Its fusion stages spend most of their time, on a deep
model, in two places whose cost grows with the square of a region's size:

* ``thunder.core.transform_common._remove_noop_subsymbols`` (called by every ``dce``, also on the
  fused traces and in ``split_into_forward_and_backward``) asks ``has_tags(bsym, {DONT_DCE})`` once
  per subsymbol, and ``has_tags`` walks the whole subsymbol tree each time;
* ``thunder.executors.utils.Region.__init__`` (every fusion pass builds one per region) tests
  membership in the region's list of bound symbols once per produced and consumed proxy.

The whole backward of a transformer is one fusion region, so both are quadratic in depth, and the
recomputation thunder_remat adds to the backward makes that region larger still (see
docs/benchmarks.md, "Compile cost as the model grows"). The stand-ins give the same results:
the pruning asks ``has_tags`` again only after a subsymbol carrying the tag was removed, and the
region's membership test uses a hash set with the list's own equality (a bound symbol whose hash
falls back to its id is looked up in the list, as before). They act only in compilations
thunder_remat is on for (Thunder alone runs its own code), or inside ``forced()`` so that a
benchmark can time Thunder alone with them.
"""

from __future__ import annotations

import contextlib
import contextvars

import thunder.core.transform_common as _transform_common
import thunder.executors.utils as _executor_utils
from thunder.core.prims import OpTags
from thunder.core.symbol import has_tags

from thunder_remat.executors.hooks.compile_stash import mark_speedups, speedups_marked

__all__ = ["install", "enable_for_compilation", "forced", "active"]

_FORCED: contextvars.ContextVar[bool] = contextvars.ContextVar("thunder_remat_speedups_forced", default=False)
_DONT_DCE = {OpTags.DONT_DCE}


def enable_for_compilation() -> None:
    """Use the stand-ins for the rest of the compilation in progress (and later ones of it)."""
    mark_speedups()


@contextlib.contextmanager
def forced():
    """Use the stand-ins inside this block whatever the compilation (for benchmarks and tests)."""
    token = _FORCED.set(True)
    try:
        yield
    finally:
        _FORCED.reset(token)


def active() -> bool:
    return _FORCED.get() or speedups_marked()


def _carries_dont_dce(bsym) -> bool:
    return OpTags.DONT_DCE in (bsym.sym.tags or ()) or OpTags.DONT_DCE in bsym.tags


def _prune_noop_subsymbols(bsym) -> bool:
    """Thunder's pruning of no-op subsymbols, in place; True when a removed subsymbol carried
    DONT_DCE (the parent's cached ``has_tags`` answer is then stale). The parent's own list is
    replaced only at the end, as in Thunder, so its answer changes only through deeper removals."""
    kept, removed_tagged, tagged = [], False, None
    for sub in bsym.subsymbols:
        if not sub.subsymbols and not sub.sym.is_prim:
            removed_tagged = removed_tagged or _carries_dont_dce(sub)
            continue
        if not any(o is not None for o in sub.flat_proxy_outs):
            if tagged is None:
                tagged = has_tags(bsym, _DONT_DCE)
            if not tagged:
                continue
        if _prune_noop_subsymbols(sub):
            removed_tagged, tagged = True, None
        kept.append(sub)
    bsym.subsymbols = kept
    return removed_tagged


class _MemberList(list):
    """A list whose ``in`` is a hash lookup with the list's semantics (identity, then ``==``)."""

    def __init__(self, items) -> None:
        super().__init__(items)
        self._members = set(items)

    def __contains__(self, item) -> bool:
        if item in self._members:
            return True
        # a BoundSymbol with unhashable arguments hashes by id; equal ones then hash differently
        return hash(item) == id(item) and list.__contains__(self, item)


def install() -> None:
    """Route both helpers through the stand-ins (idempotent)."""
    original_prune = _transform_common._remove_noop_subsymbols
    if not getattr(original_prune, "_thunder_remat_speedup", False):

        def remove_noop_subsymbols(bsym) -> None:
            if active():
                _prune_noop_subsymbols(bsym)
            else:
                original_prune(bsym)

        remove_noop_subsymbols._thunder_remat_speedup = True
        remove_noop_subsymbols.__wrapped__ = original_prune
        _transform_common._remove_noop_subsymbols = remove_noop_subsymbols

    region = _executor_utils.Region
    original_init = region.__init__
    if not getattr(original_init, "_thunder_remat_speedup", False):

        def region_init(self, producers, consumers, bound_symbols) -> None:
            if not active():
                return original_init(self, producers, consumers, bound_symbols)
            original_init(self, producers, consumers, _MemberList(bound_symbols))
            self.bound_symbols = bound_symbols

        region_init._thunder_remat_speedup = True
        region_init.__wrapped__ = original_init
        region.__init__ = region_init
