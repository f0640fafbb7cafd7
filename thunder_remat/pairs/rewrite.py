"""Rewrite stage of the pair pass: the only module that builds new bound symbols.

Given a ``PairPlan``, the producer emits what the consumer is handed plus what others need, and
the consumer gets the producer ops it must recompute, each just before its first reader.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from thunder_remat.cost import value_bytes
from thunder_remat.pairs.solve import PairPlan
from thunder_remat.trace_facts import TagReader, in_place_destination
from thunder_remat.storage import storage_map
from thunder_remat.verify import region_problems

__all__ = ["RewriteError", "RewrittenPair", "rewrite_pair", "check_region_closed"]


class RewriteError(RuntimeError):
    """A plan could not be applied; the pair is left as it was."""


@dataclass(frozen=True)
class RewrittenPair:
    producer: object
    consumer: object
    #: bytes the consumer read from the producer before and after (outputs and newly read inputs)
    bytes_before: int
    bytes_after: int
    handed_over: tuple[str, ...]
    recomputed: tuple[str, ...]


#: ops a region keeps although nothing reads their outputs (they have effects, or must not be
#: dropped): tag names as ``TagReader`` reads them
_NEVER_DROP = frozenset({"DONT_DCE", "IN_PLACE", "RANDOM_OP"})


def rewrite_pair(producer, consumer, plan: PairPlan, *, external_outputs: Collection[str], pinned: Collection[str],
                 crossing_bytes: Callable[[Iterable[str]], int] | None = None):
    """Apply ``plan`` to the fusion bound symbols ``producer`` and ``consumer``.

    ``crossing_bytes(names)``: the storage bytes handing ``names`` over keeps alive (by default
    each value's own size).
    """
    proxies = {p.name: p for p in producer.flat_proxy_args}
    defined_by: dict[str, int] = {}
    for i, bsym in enumerate(producer.subsymbols):
        for p in bsym.flat_proxy_outs:
            proxies.setdefault(p.name, p)
            defined_by.setdefault(p.name, i)
    producer_inputs = {p.name for p in producer.flat_proxy_args}
    producer_outputs = [p.name for p in producer.flat_proxy_outs]
    consumer_args = [p.name for p in consumer.flat_proxy_args]
    needed = [n for n in producer_outputs if n in set(consumer_args)]
    needed_set = set(needed)

    available = set(plan.transferred) | producer_inputs
    recompute_ops: set[int] = set()
    handed: set[str] = set()
    stack = list(needed)
    visited: set[str] = set()
    while stack:
        name = stack.pop()
        if name in visited:
            continue
        visited.add(name)
        if name in available:
            handed.add(name)
            continue
        if name not in defined_by:
            raise RewriteError(f"{name} is neither handed over nor defined by {producer.sym.name}")
        if name in pinned:
            raise RewriteError(f"plan would recompute {name}, which must stay in {producer.sym.name}")
        op = defined_by[name]
        if op not in recompute_ops:
            recompute_ops.add(op)
            stack.extend(p.name for p in producer.subsymbols[op].flat_proxy_args)

    if crossing_bytes is None:
        def crossing_bytes(names):
            return sum(value_bytes(proxies[n]) for n in names)

    if not recompute_ops:
        size = crossing_bytes(needed)
        return RewrittenPair(producer, consumer, size, size, tuple(needed), ())

    recomputed_ops = [producer.subsymbols[i] for i in sorted(recompute_ops)]
    consumer_names = set(consumer_args)
    order = {n: i for i, n in enumerate(proxies)}
    new_inputs = sorted(handed - consumer_names, key=order.__getitem__)
    new_args = [p for p in consumer.flat_proxy_args if p.name in handed or p.name not in needed_set]
    new_args += [proxies[n] for n in new_inputs]
    new_consumer = consumer.from_bsym(args=tuple(new_args),
                                      subsymbols=tuple(placed_before_first_use(recomputed_ops, consumer.subsymbols,
                                                                               new_args)))

    keep = [n for n in producer_outputs if n in external_outputs]
    keep += sorted((handed - producer_inputs) - set(keep), key=order.__getitem__)
    new_producer = producer.from_bsym(
        output=tuple(proxies[n] for n in keep),
        subsymbols=_live_subsymbols(producer.subsymbols, keep),
    )

    before = crossing_bytes(needed)
    after = crossing_bytes([*new_inputs, *(n for n in needed if n in handed)])
    check_region_closed(new_producer)
    check_region_closed(new_consumer)
    return RewrittenPair(
        new_producer,
        new_consumer,
        before,
        after,
        tuple(sorted(handed, key=order.__getitem__)),
        tuple(n for i in sorted(recompute_ops) for n in (p.name for p in producer.subsymbols[i].flat_proxy_outs)),
    )


def placed_before_first_use(recomputed: list, body, inputs: list) -> list:
    """``body`` (a consumer region's ops, reading ``inputs``) with each of ``recomputed`` (producer
    ops, in producer order) just before the first op that reads what it makes, directly or through
    a later recomputed op. At the region's start a recomputed value would be made early and held
    to its last reader, across every cut ``pairs.split`` could make before it.

    None is moved past an in-place write into a storage it reads; if one of them writes in place,
    they all stay at the start, in order."""
    body = list(body)
    if any(in_place_destination(op) is not None for op in recomputed):
        return [*recomputed, *body]
    made_by = {p.name: k for k, op in enumerate(recomputed) for p in op.flat_proxy_outs}
    storages = storage_map([*recomputed, *body], inputs)
    written_at: dict[str, int] = {}  # storage -> first op of the body writing into it
    for j, op in enumerate(body):
        destination = in_place_destination(op)
        if destination is not None:
            written_at.setdefault(storages.owner_of(destination.name), j)
    place = [min((written_at.get(storages.owner_of(p.name), len(body)) for p in op.flat_proxy_args),
                 default=len(body)) for op in recomputed]
    for j, op in enumerate(body):
        for p in op.flat_proxy_args:
            k = made_by.get(p.name)
            if k is not None and place[k] > j:
                place[k] = j
    for k in reversed(range(len(recomputed))):  # before the recomputed ops that read what it makes
        for p in recomputed[k].flat_proxy_args:
            d = made_by.get(p.name)
            if d is not None and place[d] > place[k]:
                place[d] = place[k]
    at: dict[int, list] = {}
    for k, j in enumerate(place):
        at.setdefault(j, []).append(recomputed[k])
    out = []
    for j, op in enumerate(body):
        out.extend(at.get(j, ()))
        out.append(op)
    out.extend(at.get(len(body), ()))
    return out


def _live_subsymbols(subsymbols, outputs: Collection[str]) -> tuple:
    """Drop body ops whose results nothing in ``outputs`` depends on (ops with effects stay)."""
    live = set(outputs)
    kept = []
    tags_of = TagReader()
    for bsym in reversed(subsymbols):
        outs = {p.name for p in bsym.flat_proxy_outs}
        if outs & live or not outs or tags_of(bsym) & _NEVER_DROP:
            kept.append(bsym)
            live.update(p.name for p in bsym.flat_proxy_args)
    return tuple(reversed(kept))


def check_region_closed(region) -> None:
    """Raise ``RewriteError`` unless ``region`` is closed (``verify.region_problems``)."""
    problems = region_problems(region)
    if problems:
        raise RewriteError("; ".join(problems))
