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
* every storage receives a prefix of the in-place writes, in order, that the storage it copies
  received in ``before`` (values matched by what they compute, so a backward copy of a forward
  value is matched with it): no write runs twice into one storage;
* optionally (``saved=``), the backward reads from the forward only the values in ``saved``, and
  (``saved_bytes=``) the storages those values keep alive (a view keeps its base's, views of one
  base count it once, inputs' count nothing) add up to the bytes the plan reports. What the
  backward reads is what Thunder's forward/backward split of ``after`` saves.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field

from thunder.core.proxies import Proxy
from thunder.core.pytree import tree_flatten

from thunder_remat.policies import REPLAYABLE_RANDOM_OPS, STRUCTURAL_HARD_BANS
from thunder_remat.storage import storage_map
from thunder_remat.trace_facts import (TagReader, op_facts, forward_storages, in_place_destination, in_place_writes, leaf_ops,
                                       thunder_split)

__all__ = ["VerificationError", "verify", "region_problems", "kept_if_verified"]

#: ops that name values without reading their data (``update_aliases`` names the storage's data
#: as it is now)
_BOOKKEEPING = frozenset({"del", "python_del", "unpack_sequence", "unpack_trivial", "unpack_tuple",
                          "clear_mutable_collection", "update_aliases"})


class VerificationError(RuntimeError):
    """A rewritten trace broke an invariant; the pass that made it is undone."""


def kept_if_verified(result, before, after, rewrite: str, **expected) -> bool:
    """Verify a pass's rewrite and undo it if it broke an invariant: ``result`` (a
    ``records.PassResult``) then keeps ``before``, records the problems as its failure, and one
    warning, the same for every pass, names the rewrite (``rewrite``) and the problems. True when
    the rewrite is kept. ``expected``: ``verify``'s optional checks (``saved``, ...)."""
    problems = verify(before, after, **expected)
    if not problems:
        return True
    listed = "; ".join(problems)
    warnings.warn(f"thunder_remat: the {rewrite} failed verification and is undone: {listed}", stacklevel=3)
    result.fail(before, "verification failed: " + listed)
    return False


def _names(tree) -> list[str]:
    flat, _ = tree_flatten(tree)
    return [p.name for p in flat if isinstance(p, Proxy)]


def _unsafe_counts(trace, tags_of: TagReader) -> Counter:
    """How often each op runs that may not run more often (regions read through their bodies)."""
    counts: Counter = Counter()
    for bsym in leaf_ops(trace.bound_symbols):
        tags = op_facts(bsym, tags_of(bsym), (), ()).tags  # a write into a known destination: _in_place_facts
        if ("RANDOM_OP" in tags and bsym.sym.name not in REPLAYABLE_RANDOM_OPS) or tags & STRUCTURAL_HARD_BANS.keys():
            counts[bsym.sym.name] += 1
    return counts


@dataclass
class _InPlaceFacts:
    """What the in-place writes of one trace do, with values named by their value numbers.

    A value number names what a value computes, not what it is called: the op and the numbers of
    what it reads (an input is its name). So a copy the backward makes of a forward value has the
    forward value's number, a write's copy the write's, and two traces compare by numbers.
    """

    #: (op, value number) -> the value's name, where the op reads a value whose storage an in-place
    #: write changed after the value was made (it sees the new data)
    stale_reads: dict = field(default_factory=dict)
    #: every storage a write changes, as (its owner, which definition of the owner's name) -> (the
    #: owner's number, the writes' numbers in order)
    writes: dict = field(default_factory=dict)


def _in_place_facts(trace, numbers: dict) -> _InPlaceFacts:
    """One walk over ``trace``'s leaf ops (regions through their bodies); empty facts when nothing
    writes in place. ``numbers``: the value-number table, shared by the traces compared (a number
    is its key's index in it, so the same computation gets the same number in both)."""
    facts = _InPlaceFacts()
    if not any(in_place_destination(b) is not None for top in trace.bound_symbols for b in (top, *top.subsymbols)):
        return facts
    # the walk goes through regions' bodies, so a region's own values have their storages; a name
    # defined again (a consumer region recomputing it) is a new storage: ``made`` counts definitions
    leaves = list(leaf_ops(trace.bound_symbols))
    storages = storage_map(leaves, [p for p in tree_flatten((trace.args, trace.kwargs))[0] if isinstance(p, Proxy)])
    made: dict[str, int] = {}
    number_of: dict[str, int] = {}

    def number(key) -> int:
        return numbers.setdefault(key, len(numbers))

    def operand(a):
        return number_of.get(a.name, a.name) if isinstance(a, Proxy) else repr(a)

    for name in _names((trace.args, trace.kwargs)):
        number_of[name] = number(("input", name))
    stale: set[str] = set()
    writes: dict[tuple[str, int], list[int]] = {}
    for bsym, overwritten in in_place_writes(leaves, storages):
        if bsym.sym.name in ("del", "python_del"):
            continue
        if bsym.sym.name not in _BOOKKEEPING:
            for n in _names((bsym.args, bsym.kwargs)):
                if n in stale:
                    facts.stale_reads.setdefault((bsym.sym.name, number_of.get(n, n)), n)
        op = number((bsym.sym.name, tuple(operand(a) for a in bsym.flat_args)))
        for k, p in enumerate(bsym.flat_proxy_outs):
            number_of.setdefault(p.name, number((op, k)))
            made[p.name] = made.get(p.name, 0) + 1
        stale |= overwritten
        stale.difference_update(_names(bsym.output))  # made (again: a region recomputing it) after the write
        destination = in_place_destination(bsym)
        if destination is not None:
            owner = storages.owner_of(destination.name)
            writes.setdefault((owner, made.get(owner, 0)), []).append(op)
    facts.writes = {storage: (number_of.get(storage[0], -1), tuple(seq)) for storage, seq in writes.items()}
    return facts


def _write_problems(writes_before, writes_after) -> list[str]:
    """A storage of ``after`` that receives more writes than the storage it copies in ``before``,
    or the same writes in another order: each must receive a prefix of the original's writes."""
    original: dict[int, list[tuple[int, ...]]] = {}
    for key, seq in writes_before.values():
        original.setdefault(key, []).append(seq)
    problems = []
    for (owner, _), (key, seq) in sorted(writes_after.items()):
        if not any(seq == known[:len(seq)] for known in original.get(key, ())):
            most = max((len(known) for known in original.get(key, ())), default=0)
            problems.append(f"the storage of {owner} receives {len(seq)} in-place write(s) where the value it "
                            f"copies received {most}, or in another order: a write ran again into a storage "
                            "that already holds its result")
    return problems


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

    numbers: dict = {}
    writes_before, writes_after = _in_place_facts(before, numbers), _in_place_facts(after, numbers)
    for op, name in sorted((op, name) for (op, key), name in writes_after.stale_reads.items()
                           if (op, key) not in writes_before.stale_reads):
        problems.append(f"{op} reads {name} after an in-place write changed its storage: a write may run "
                        "again only into a value made again, and nothing may read what it overwrote")
    problems += _write_problems(writes_before.writes, writes_after.writes)

    if saved is not None or saved_bytes is not None:
        problems += _saved_problems(after, saved, saved_bytes)

    if problems and raise_on_error:
        raise VerificationError("; ".join(problems))
    return problems
