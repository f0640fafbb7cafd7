"""The value network both passes cut: every value split into an ``in`` and an ``out`` node.

The edge ``in -> out`` of a value is what a cut crosses to hand that value over (the whole-graph
pass: save it for the backward; the pair pass: pass it from the producer region to the consumer);
its capacity is what that costs. ``out(a) -> in(b)`` edges (``b`` is made from ``a``) may not be
cut. The source feeds the ``in`` of every value available without running anything again
(inputs, values whose op may not run again); the ``out`` of every value the other side reads
drains into the sink. After a minimum cut, a value whose ``in`` is on the source side and whose
``out`` is not crosses; a value whose ``in`` is on the sink side is made again by the other side.

Node ids: value ``k`` has ``in`` 2k and ``out`` 2k + 1; the source is 2n, the sink 2n + 1. Plain
data only (no thunder import); each pass reads ``SplitCut`` in its own words.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from thunder_remat.solvers.maxflow import CutResult, CutSolver, FlowNetwork

__all__ = ["Side", "Terminal", "ValueNode", "SplitNetwork", "SplitCut", "ValueNetwork"]


class Side(enum.Enum):
    IN = "in"
    OUT = "out"


class Terminal(enum.Enum):
    SOURCE = "source"
    SINK = "sink"


@dataclass(frozen=True)
class ValueNode:
    value: str
    side: Side

    def __str__(self) -> str:
        return f"{self.value}:{self.side.value}"


@dataclass(frozen=True)
class SplitCut:
    """What a cut of a ``SplitNetwork`` decided, per value (in the network's value order)."""

    #: the value is handed over: its ``in`` node is on the source side, its ``out`` node is not
    crossing: np.ndarray
    #: the other side makes the value again: its ``in`` node is on the sink side
    made_again: np.ndarray


def _decode(num_values: int, cut: CutResult) -> SplitCut:
    ins, outs = cut.source_mask[0:2 * num_values:2], cut.source_mask[1:2 * num_values:2]
    return SplitCut(crossing=ins & ~outs, made_again=~ins)


@dataclass(frozen=True)
class ValueNetwork:
    """One value network as plain data, the record both passes keep and draw: the flow network,
    what each node stands for (``ValueNode`` or ``Terminal``, by id) and each value's edge."""

    network: FlowNetwork
    labels: tuple
    value_edge: dict

    def decode(self, cut: CutResult) -> SplitCut:
        return _decode((self.network.num_nodes - 2) // 2, cut)


class SplitNetwork:
    """Builds one value network edge by edge; ``edges`` and ``capacities`` grow in call order."""

    def __init__(self, values) -> None:
        self.values = tuple(values)
        self._index = {name: k for k, name in enumerate(self.values)}
        if len(self._index) != len(self.values):
            raise ValueError("SplitNetwork values must be distinct")
        self.source, self.sink = 2 * len(self.values), 2 * len(self.values) + 1
        self.edges: list[tuple[int, int]] = []
        self.capacities: list[float] = []
        #: value -> index of its in -> out edge
        self.value_edge: dict[str, int] = {}

    @property
    def num_nodes(self) -> int:
        return 2 * len(self.values) + 2

    def in_node(self, name: str) -> int:
        return 2 * self._index[name]

    def out_node(self, name: str) -> int:
        return 2 * self._index[name] + 1

    def edge(self, u: int, v: int, capacity: float) -> int:
        self.edges.append((u, v))
        self.capacities.append(capacity)
        return len(self.edges) - 1

    def value(self, name: str, capacity: float) -> int:
        """The edge a cut crosses to hand ``name`` over, at ``capacity``."""
        self.value_edge[name] = self.edge(self.in_node(name), self.out_node(name), capacity)
        return self.value_edge[name]

    def available(self, name: str, capacity: float = math.inf) -> int:
        """``name`` is there without running anything again (an input, an op that may not run again)."""
        return self.edge(self.source, self.in_node(name), capacity)

    def made_from(self, inputs, output: str) -> None:
        """``output`` is made from ``inputs``: making it again needs them."""
        for name in inputs:
            self.edge(self.out_node(name), self.in_node(output), math.inf)

    def made_with(self, destination: str, written: str) -> int:
        """``written`` comes from an in-place write into ``destination``: the write runs again only
        into a destination made again (a fresh tensor), never into the one the other side holds."""
        return self.edge(self.in_node(destination), self.in_node(written), math.inf)

    def needed(self, name: str) -> int:
        """The other side reads ``name``."""
        return self.edge(self.out_node(name), self.sink, math.inf)

    def labels(self) -> tuple:
        """What each node stands for, by id."""
        nodes: list = []
        for name in self.values:
            nodes += [ValueNode(name, Side.IN), ValueNode(name, Side.OUT)]
        return (*nodes, Terminal.SOURCE, Terminal.SINK)

    def record(self) -> ValueNetwork:
        """The plain record, with the capacities given so far."""
        network = FlowNetwork(self.num_nodes, tuple(self.edges), tuple(float(c) for c in self.capacities),
                              self.source, self.sink)
        return ValueNetwork(network, self.labels(), dict(self.value_edge))

    def cut_solver(self) -> CutSolver:
        return CutSolver(self.num_nodes, self.edges, self.source, self.sink)

    def decode(self, cut: CutResult) -> SplitCut:
        return _decode(len(self.values), cut)
