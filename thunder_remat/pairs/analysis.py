"""Analysis stage of the pair pass: one producer/consumer pair of fusion regions becomes a plain
``PairProblem``.

This is the only stage of the pair pass that reads bound symbols; everything after it works on
names and byte counts. Which producer ops may run again in the consumer is the policies' call
(``thunder_remat.policies``), the same rules as the whole-graph pass's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from thunder_remat.cost import value_bytes
from thunder_remat.pairs.problem import PairProblem
from thunder_remat.policies import judge_op
from thunder_remat.storage import storage_map
from thunder_remat.trace_facts import STALE_WRITE, TagReader, in_place_destination, op_facts

__all__ = ["build_pair_problem"]


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
    names: list[str] = []
    sizes: list[int] = []
    seen: set[str] = set()

    def add(proxy) -> None:
        if proxy.name not in seen:
            seen.add(proxy.name)
            names.append(proxy.name)
            sizes.append(value_bytes(proxy))

    for proxy in producer.flat_proxy_args:
        add(proxy)
    producer_inputs = frozenset(names)
    storages = storage_map(producer.subsymbols, producer.flat_proxy_args)

    tags = tags_of or TagReader()
    pinned: dict[str, str] = {}
    writes: dict[str, str] = {}
    ops = []
    for bsym in producer.subsymbols:
        outs = bsym.flat_proxy_outs
        destination = getattr(in_place_destination(bsym), "name", None)
        if destination in seen:
            writes.update((p.name, destination) for p in outs)
        for proxy in outs:
            add(proxy)
        ins = tuple(dict.fromkeys(p.name for p in bsym.flat_proxy_args if p.name in seen))
        ops.append((ins, tuple(p.name for p in outs)))
        reason = _keep_in_producer_reason(bsym, tags, policies)
        if reason is None and not same_executor and not consumer_can_fuse(bsym):
            reason = "consumer's executor cannot fuse it"
        if reason is not None:
            for proxy in outs:
                pinned.setdefault(proxy.name, reason)

    consumer_reads = {p.name for p in consumer.flat_proxy_args}
    producer_outputs = [p.name for p in producer.flat_proxy_outs]
    for name in producer_outputs:
        if name in external_outputs:
            pinned.setdefault(name, "needed outside this pair")
    needed = tuple(n for n in producer_outputs if n in consumer_reads)
    # Handing over an external output costs nothing (the producer emits it for others anyway),
    # and so does handing over any value sharing its storage (its base, when it is a view).
    alive = {storages.owner_of(n) for n in external_outputs if n in seen}
    free = frozenset(n for n in names if n in external_outputs or (n in producer_inputs and n in consumer_reads)
                     or storages.owner_of(n) in alive)
    frozen = _overwritten(names, storages, written, writes)
    # A write the consumer made again would change what the consumer reads from before it.
    stale_reads = {storages.owner_of(n) for n in consumer_reads if n in frozen}
    for out, destination in writes.items():
        if storages.owner_of(destination) in stale_reads:
            pinned.setdefault(out, STALE_WRITE)

    return PairProblem(
        producer=producer.sym.name,
        consumer=consumer.sym.name,
        values=tuple(names),
        nbytes=tuple(sizes),
        ops=tuple(ops),
        producer_inputs=producer_inputs,
        pinned=pinned,
        free=free,
        frozen=frozen,
        needed=needed,
        producer_input_discount=producer_input_discount,
        views={n: storages.owner_of(n) for n in names if n in storages.maybe_view},
        storage={n: (storages.owner_of(n), storages.owner_bytes.get(storages.owner_of(n), size))
                 for n, size in zip(names, sizes)},
        writes=writes,
    )


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


def _keep_in_producer_reason(bsym, tags_of: TagReader, policies) -> str | None:
    return judge_op(op_facts(bsym, tags_of(bsym), bsym.flat_proxy_outs, bsym.flat_proxy_args), policies).keeps_in_producer
