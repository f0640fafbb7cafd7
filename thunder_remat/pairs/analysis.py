"""Analysis stage of the pair pass: one producer/consumer pair of fusion regions becomes a plain
``PairProblem``.

This is the only stage of the pair pass that reads bound symbols; everything after it works on
names and byte counts. Which producer ops may run again in the consumer is the policies' call
(``thunder_remat.policies``), the same rules as the whole-graph pass's; the pair's structure adds
its own reasons to keep a value in the producer (``_pinned``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from thunder_remat.cost import value_bytes
from thunder_remat.pairs.problem import PairProblem
from thunder_remat.policies import judge_op
from thunder_remat.storage import StorageMap, storage_map
from thunder_remat.trace_facts import STALE_WRITE, TagReader, in_place_destination, op_facts

__all__ = ["build_pair_problem"]

CANNOT_FUSE = "consumer's executor cannot fuse it"
NEEDED_OUTSIDE = "needed outside this pair"


def build_pair_problem(
    producer,
    consumer,
    *,
    external_outputs: Collection[str],
    written: Mapping[str, int],
    consumer_can_fuse: Callable[[object], bool],
    same_executor: bool,
    producer_input_discount: float,
    policies: tuple,
    tags_of: TagReader | None = None,
) -> PairProblem:
    """Describe the pair ``producer -> consumer`` (two fusion bound symbols) as plain data.

    A producer op stays in the producer when the policies judge it hard or soft (the consumer
    recomputes only what the policies let run again freely), or when the consumer's executor
    cannot fuse it."""
    sizes = _producer_values(producer)
    names = tuple(sizes)
    producer_inputs = frozenset(p.name for p in producer.flat_proxy_args)
    storages = storage_map(producer.subsymbols, producer.flat_proxy_args)
    ops, writes = _producer_ops(producer.subsymbols, producer_inputs)
    consumer_reads = {p.name for p in consumer.flat_proxy_args}
    frozen = _overwritten(names, storages, written, writes)
    keep = _KeepRules(policies, tags_of or TagReader(), same_executor, consumer_can_fuse)
    producer_outputs = [p.name for p in producer.flat_proxy_outs]
    return PairProblem(
        producer=producer.sym.name,
        consumer=consumer.sym.name,
        values=names,
        nbytes=tuple(sizes.values()),
        ops=ops,
        producer_inputs=producer_inputs,
        pinned=_pinned(producer.subsymbols, keep, producer_outputs, external_outputs,
                       _stale_writes(writes, storages, consumer_reads, frozen)),
        free=_free(sizes, storages, external_outputs, producer_inputs, consumer_reads),
        frozen=frozen,
        needed=tuple(n for n in producer_outputs if n in consumer_reads),
        producer_input_discount=producer_input_discount,
        views={n: storages.owner_of(n) for n in names if n in storages.maybe_view},
        storage={n: (storages.owner_of(n), storages.owner_bytes.get(storages.owner_of(n), size))
                 for n, size in sizes.items()},
        writes=writes,
    )


@dataclass(frozen=True)
class _KeepRules:
    """Why a producer op stays in the producer, whatever the cut: the policies' hard or soft
    verdict, or a consumer executor that cannot fuse it."""

    policies: tuple
    tags_of: TagReader
    same_executor: bool
    consumer_can_fuse: Callable[[object], bool]

    def reason(self, bsym) -> str | None:
        facts = op_facts(bsym, self.tags_of(bsym), bsym.flat_proxy_outs, bsym.flat_proxy_args)
        reason = judge_op(facts, self.policies).keeps_in_producer
        if reason is None and not self.same_executor and not self.consumer_can_fuse(bsym):
            return CANNOT_FUSE
        return reason


def _producer_values(producer) -> dict[str, int]:
    """Every value of the producer, its inputs first then its ops' outputs in order -> its bytes."""
    sizes: dict[str, int] = {}
    for proxy in (*producer.flat_proxy_args, *(p for bsym in producer.subsymbols for p in bsym.flat_proxy_outs)):
        sizes.setdefault(proxy.name, value_bytes(proxy))
    return sizes


def _producer_ops(subsymbols, producer_inputs) -> tuple[tuple, dict[str, str]]:
    """(each op as (the values it reads, the values it makes); output -> the value an in-place op
    wrote it into, for writes into a value the producer already had)."""
    known = set(producer_inputs)
    ops = []
    writes: dict[str, str] = {}
    for bsym in subsymbols:
        outs = tuple(p.name for p in bsym.flat_proxy_outs)
        destination = getattr(in_place_destination(bsym), "name", None)
        if destination in known:
            writes.update((out, destination) for out in outs)
        known.update(outs)
        ops.append((tuple(dict.fromkeys(p.name for p in bsym.flat_proxy_args if p.name in known)), outs))
    return tuple(ops), writes


def _pinned(subsymbols, keep: _KeepRules, producer_outputs, external_outputs, stale_writes) -> dict[str, str]:
    """Values the consumer may not recompute -> why; the first reason found is kept: the op's own
    (policies, the consumer's executor), then the pair's (read outside the pair, a stale write)."""
    pinned: dict[str, str] = {}
    for bsym in subsymbols:
        reason = keep.reason(bsym)
        if reason is not None:
            for proxy in bsym.flat_proxy_outs:
                pinned.setdefault(proxy.name, reason)
    for name in producer_outputs:
        if name in external_outputs:
            pinned.setdefault(name, NEEDED_OUTSIDE)
    for name in stale_writes:
        pinned.setdefault(name, STALE_WRITE)
    return pinned


def _free(names: Mapping[str, int], storages: StorageMap, external_outputs, producer_inputs, consumer_reads) -> frozenset[str]:
    """Values that cost nothing to hand over: an external output (the producer emits it for others
    anyway), any value sharing its storage (its base, when it is a view), and a producer input the
    consumer reads anyway."""
    alive = {storages.owner_of(n) for n in external_outputs if n in names}
    return frozenset(n for n in names if n in external_outputs or (n in producer_inputs and n in consumer_reads)
                     or storages.owner_of(n) in alive)


def _stale_writes(writes: Mapping[str, str], storages: StorageMap, consumer_reads, frozen) -> list[str]:
    """Outputs of writes the consumer may not make again: that would change what the consumer reads
    from before the write."""
    stale_reads = {storages.owner_of(n) for n in consumer_reads if n in frozen}
    return [out for out, destination in writes.items() if storages.owner_of(destination) in stale_reads]


def _overwritten(names, storages, written: Mapping[str, int], made_by_write: Collection[str]) -> frozenset[str]:
    """Values whose storage receives an in-place write they did not come from.

    Writes are counted per storage over every name of it the producer knows; a value made by a
    write owns one of them (it is the data the storage holds afterwards).
    """
    names_of: dict[str, set[str]] = {}
    for n in names:
        names_of.setdefault(storages.owner_of(n), set()).add(n)
    writes = {owner: sum(written.get(n, 0) for n in group | {owner}) for owner, group in names_of.items()}
    return frozenset(n for n in names if writes[storages.owner_of(n)] > (1 if n in made_by_write else 0))
