"""The plain record of one producer/consumer pair of fusion regions (no thunder import)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PairProblem"]


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
