"""Minimum s-t cut of a directed flow network with python-igraph.

The network is plain data (node count, edge list, capacities) so the solver can be tested
against a second implementation without any trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import igraph

__all__ = ["FlowNetwork", "CutResult", "min_cut"]


@dataclass(frozen=True)
class FlowNetwork:
    """A directed graph with edge capacities; ``math.inf`` marks an edge that may not be cut."""

    num_nodes: int
    edges: tuple[tuple[int, int], ...]
    capacities: tuple[float, ...]
    source: int
    sink: int

    def __post_init__(self) -> None:
        if len(self.edges) != len(self.capacities):
            raise ValueError("FlowNetwork needs one capacity per edge")
        for u, v in self.edges:
            if not (0 <= u < self.num_nodes and 0 <= v < self.num_nodes):
                raise ValueError(f"FlowNetwork edge ({u}, {v}) names a node outside 0..{self.num_nodes - 1}")
        if any(c < 0 or math.isnan(c) for c in self.capacities):
            raise ValueError("FlowNetwork capacities must be non-negative numbers")
        if self.source == self.sink:
            raise ValueError("FlowNetwork source and sink must differ")


@dataclass(frozen=True)
class CutResult:
    """A minimum cut: its value, the nodes on the source side, and the cut edges (indices)."""

    value: float
    source_side: frozenset[int]
    cut_edges: tuple[int, ...]

    @property
    def is_finite(self) -> bool:
        return math.isfinite(self.value)


def min_cut(network: FlowNetwork) -> CutResult:
    """Solve the minimum cut; an infinite value means source and sink cannot be separated.

    Infinite capacities are replaced by a finite bound larger than every finite cut, so the
    solver never does arithmetic on ``inf``; a cut reaching that bound is reported as infinite.
    """
    finite_total = sum(c for c in network.capacities if math.isfinite(c))
    unbounded = 2.0 * finite_total + 1.0
    capacities = [c if math.isfinite(c) else unbounded for c in network.capacities]
    graph = igraph.Graph(n=network.num_nodes, edges=list(network.edges), directed=True)
    cut = graph.mincut(source=network.source, target=network.sink, capacity=capacities)
    value = float(cut.value)
    source_side = frozenset(cut.partition[0]) if network.source in cut.partition[0] else frozenset(cut.partition[1])
    if value >= unbounded:
        return CutResult(math.inf, source_side, tuple(sorted(cut.cut)))
    return CutResult(value, source_side, tuple(sorted(cut.cut)))
