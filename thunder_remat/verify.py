"""Invariants a rewritten trace must keep; checked after each pass (``remat_verify``, on by default).

``verify(before, after)`` returns the problems it finds (an empty list when the rewrite is sound)
or raises ``VerificationError`` with ``raise_on_error=True``:

* every value is produced before it is used (top level, and inside each fusion region);
* each fusion region's inputs and outputs match its body (reads are inputs or defined earlier in
  the body, each value defined once, every output defined);
* the trace returns the same values (forward outputs and gradients) as before;
* no random op (other than exactly replayed ones), collective, device sync or in-place op runs
  more often than before;
* no op reads a value after an in-place write (``copy_``) changed its storage, unless ``before``
  did the same (a write run again into a saved value, or before a read of what it overwrote);
* optionally (``saved=``), the backward reads from the forward only the values in ``saved``, and
  (``saved_bytes=``) the storages those values keep alive (a view keeps its base's, views of one
  base count it once, inputs' count nothing) add up to the bytes the plan reports. What the
  backward reads is what Thunder's forward/backward split of ``after`` saves.
"""

from __future__ import annotations

from collections import Counter

from thunder.core.proxies import Proxy
from thunder.core.pytree import tree_flatten

from thunder_remat.policies import REPLAYABLE_RANDOM_OPS, STRUCTURAL_HARD_BANS
from thunder_remat.storage import storage_map
from thunder_remat.trace_facts import (TagReader, forward_storages, in_place_destination, in_place_writes, leaf_ops,
                                       thunder_split)

__all__ = ["VerificationError", "verify", "region_problems"]

#: ops that name values without reading their data (``update_aliases`` names the storage's data
#: as it is now)
_BOOKKEEPING = frozenset({"del", "python_del", "unpack_sequence", "unpack_trivial", "unpack_tuple",
                          "clear_mutable_collection", "update_aliases"})


class VerificationError(RuntimeError):
    """A rewritten trace broke an invariant; the pass that made it is undone."""


def _names(tree) -> list[str]:
    flat, _ = tree_flatten(tree)
    return [p.name for p in flat if isinstance(p, Proxy)]


def _unsafe_counts(trace, tags_of: TagReader) -> Counter:
    """How often each op runs that may not run more often (regions read through their bodies)."""
    counts: Counter = Counter()
    for bsym in leaf_ops(trace.bound_symbols):
        tags = tags_of(bsym)
        if ("RANDOM_OP" in tags and bsym.sym.name not in REPLAYABLE_RANDOM_OPS) or tags & STRUCTURAL_HARD_BANS.keys():
            counts[bsym.sym.name] += 1
    return counts


def _stale_reads(trace) -> set[tuple[str, str]]:
    """(op, value) pairs where an op reads a value whose storage an in-place write changed after
    the value was made: it would see the new data. Regions are read through their bodies."""
    if not any(in_place_destination(b) is not None for top in trace.bound_symbols for b in (top, *top.subsymbols)):
        return set()
    storages = storage_map(trace.bound_symbols, [p for p in tree_flatten((trace.args, trace.kwargs))[0]
                                                 if isinstance(p, Proxy)])
    stale: set[str] = set()
    found: set[tuple[str, str]] = set()
    for bsym, overwritten in in_place_writes(trace.bound_symbols, storages):
        if bsym.sym.name not in _BOOKKEEPING:
            found.update((bsym.sym.name, n) for n in _names((bsym.args, bsym.kwargs)) if n in stale)
        stale |= overwritten
        stale.difference_update(_names(bsym.output))  # made (again: a region recomputing it) after the write
    return found


def region_problems(region) -> list[str]:
    """Why a fusion region is not closed: a read that is neither an input nor defined earlier in
    its body, a value defined twice, an output its body never defines (empty: closed)."""
    problems = []
    known = set(_names(region.args))
    for sub in region.subsymbols:
        reads = _names(sub.args) + _names(sub.kwargs)
        for name in reads:
            if name not in known:
                problems.append(f"region {region.sym.name} reads {name} before defining it")
        for name in _names(sub.output):
            if name in known and name not in reads:
                problems.append(f"region {region.sym.name} defines {name} twice")
            known.add(name)
    for name in _names(region.output):
        if name not in known:
            problems.append(f"region {region.sym.name} returns {name}, which its body never defines")
    return problems


def _saved_problems(after, saved, saved_bytes) -> list[str]:
    """What the forward of ``after`` hands to the backward (Thunder's split of it), against the plan:
    only values in ``saved``, and storages adding up to ``saved_bytes``."""
    problems = []
    handed = thunder_split(after).saved
    if saved is not None:
        allowed = set(saved)
        problems += [f"the backward reads {name}, which the plan does not save" for name in handed if name not in allowed]
    if saved_bytes is not None:
        storages = forward_storages(after)
        total = storages.bytes_held(handed)
        if total != saved_bytes:
            groups = storages.groups(n for n in handed if storages.owner_of(n) not in storages.held)
            held = ", ".join(
                f"{owner} ({storages.owner_bytes.get(owner, 0)} B" + (
                    f", kept alive by {', '.join(n for n in names if n != owner)})" if names != [owner] else ")")
                for owner, names in groups.items())
            problems.append(f"the backward holds {total} B of forward activations, the plan says {saved_bytes} B: "
                            f"storages {held}")
    return problems


def verify(before, after, *, saved=None, saved_bytes=None, replayed=(), raise_on_error: bool = False) -> list[str]:
    """Problems with ``after`` as a rewrite of ``before`` (both Thunder traces).

    ``replayed`` names ops that may run more often (FSDP ZeRO-3 re-gathers: all-gather and wait).
    ``saved_bytes``: the activation bytes the plan reports; the storages of the forward values
    the backward of ``after`` reads (inputs' left out) must add up to exactly that.
    """
    for label, trace in (("before", before), ("after", after)):
        bsyms = getattr(trace, "bound_symbols", None)
        if not bsyms or bsyms[-1].sym.name != "python_return":
            raise TypeError(f"thunder_remat.verify: {label!r} must be a Thunder trace ending in a return, "
                            f"got {type(trace).__name__}")
    problems: list[str] = []
    defined = set(_names((after.args, after.kwargs)))
    for bsym in after.bound_symbols:
        # the proxies of the flattened arguments and output, which Thunder caches per bound symbol
        for p in bsym.flat_proxy_args:
            if p.name not in defined:
                problems.append(f"{bsym.sym.name} reads {p.name} before it is produced")
        if bsym.sym.is_fusion:
            problems += region_problems(bsym)
        defined.update(p.name for p in bsym.flat_proxy_outs)

    ret_before, ret_after = before.bound_symbols[-1], after.bound_symbols[-1]
    if _names(ret_before.args) != _names(ret_after.args):
        problems.append("the trace no longer returns the same values")

    tags_of = TagReader()  # one cache for both: ``after`` keeps most of ``before``'s bound symbols
    was, now = _unsafe_counts(before, tags_of), _unsafe_counts(after, tags_of)
    for op, n in sorted(now.items()):
        if n > was.get(op, 0) and op not in replayed:
            problems.append(f"{op} runs {n} times, {was.get(op, 0)} before: random, in-place or collective ops "
                            "must not be duplicated")

    for op, name in sorted(_stale_reads(after) - _stale_reads(before)):
        problems.append(f"{op} reads {name} after an in-place write changed its storage: a write may run "
                        "again only into a value made again, and nothing may read what it overwrote")

    if saved is not None or saved_bytes is not None:
        problems += _saved_problems(after, saved, saved_bytes)

    if problems and raise_on_error:
        raise VerificationError("; ".join(problems))
    return problems
