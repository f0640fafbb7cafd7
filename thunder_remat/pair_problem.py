"""Analysis: turn one producer/consumer pair of fusion regions into a plain ``PairProblem``.

This is the only stage of the pair pass that reads bound symbols; everything after it works on
names and byte counts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from thunder.core.prims import OpTags

from thunder_remat.cost import value_bytes
from thunder_remat.joint_analysis import STALE_WRITE, collective_name, in_place_destination, op_facts
from thunder_remat.policies import judge_op
from thunder_remat.storage import storage_map

__all__ = ["PairProblem", "build_pair_problem", "KEEP_IN_PRODUCER_TAGS", "TagCache"]


class TagCache:
    """Tags of a bound symbol and its whole decomposition, computed once per symbol in a pass."""

    def __init__(self) -> None:
        # id -> (the bound symbol, kept alive so its id is not reused while cached; its tags)
        self._tags: dict[int, tuple[object, set]] = {}

    def __call__(self, bsym) -> set:
        hit = self._tags.get(id(bsym))
        if hit is not None:
            return hit[1]
        tags = set(bsym.sym.tags or ()) | bsym.tags
        for sub in bsym.subsymbols:
            tags |= self(sub)
        self._tags[id(bsym)] = (bsym, tags)
        return tags


#: Ops whose outputs are never recomputed by a consumer region: recomputing a random op gives
#: different numbers, a reduction or matmul costs far more than reading its (smaller) result.
KEEP_IN_PRODUCER_TAGS = {
    OpTags.RANDOM_OP: "random op",
    OpTags.REDUCTION_OP: "reduction",
    OpTags.MATMUL_OP: "matmul",
    OpTags.DONT_RECOMPUTE_IN_BACKWARD: "tagged DONT_RECOMPUTE_IN_BACKWARD",
    OpTags.IN_PLACE: "in-place op",
    OpTags.DEVICE_SYNC_OP: "device sync op",
}


@dataclass(frozen=True)
class PairProblem:
    """The producer's dataflow and what the consumer needs from it, as names and bytes.

    ``values`` lists the producer's inputs first, then every value its body defines, in order.
    ``ops`` holds each body op as (input names, output names), restricted to ``values``.
    """

    producer: str
    consumer: str
    values: tuple[str, ...]
    nbytes: tuple[int, ...]
    ops: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]
    producer_inputs: frozenset[str]
    #: value -> why it must be computed by the producer (attached to the source)
    pinned: dict[str, str]
    #: values that may cross at no cost (the producer emits them, or a view of them, for others
    #: anyway, or the consumer reads them already)
    free: frozenset[str]
    #: values that may not cross at all: their storage is written in place after they were made
    #: (the output of the write itself may cross: it is what the storage holds from then on)
    frozen: frozenset[str]
    #: producer outputs the consumer reads today
    needed: tuple[str, ...]
    producer_input_discount: float = 0.5
    #: values an op may return as a view of one of its inputs -> the value owning the storage
    #: they share (best guess): such a value does not cross, its base does (see value_capacity)
    views: dict = field(default_factory=dict)
    #: value -> (owner of its storage, that storage's bytes), for every value
    storage: dict = field(default_factory=dict)
    #: output of an in-place write -> the value it writes: the consumer runs the write again only
    #: if it makes that value again too (a fresh tensor); the output may cross as that storage
    writes: dict = field(default_factory=dict)

    def crossing_bytes(self, names) -> int:
        """Bytes of the distinct storages that handing ``names`` over keeps alive."""
        owners = dict(self.storage[n] for n in names if n in self.storage)
        return sum(owners.values())


def build_pair_problem(
    producer,
    consumer,
    *,
    external_outputs: Collection[str],
    written: Mapping[str, int],
    consumer_can_fuse: Callable[[object], bool],
    same_executor: bool,
    producer_input_discount: float,
    tags_of: Callable[[object], set] | None = None,
    policies: tuple = (),
) -> PairProblem:
    """Describe the pair ``producer -> consumer`` (two fusion bound symbols) as plain data."""
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

    tags = tags_of or TagCache()
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


def _keep_in_producer_reason(bsym, tags_of, policies=()) -> str | None:
    # Collectives carry no tags under the torch executor's names; the same name rule as the
    # whole-graph pass keeps a consumer from issuing one again.
    if collective_name(bsym) is not None:
        return "collective"
    tags = tags_of(bsym)
    for tag, reason in KEEP_IN_PRODUCER_TAGS.items():
        if tag in tags:
            return reason
    # The whole-graph pass's policies (a user's included) hold here too: an op they would rather
    # save, hard or soft, is not recomputed by a consumer region either.
    if policies:
        names = frozenset(getattr(t, "name", str(t)) for t in tags)
        judgement = judge_op(op_facts(bsym, names, bsym.flat_proxy_outs, bsym.flat_proxy_args), policies)
        return judgement.hard or judgement.soft
    return None
