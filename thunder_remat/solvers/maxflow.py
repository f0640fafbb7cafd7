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
        if self.edges and (min(map(min, self.edges)) < 0 or max(map(max, self.edges)) >= self.num_nodes):
            u, v = next((u, v) for u, v in self.edges if not (0 <= u < self.num_nodes and 0 <= v < self.num_nodes))
            raise ValueError(f"FlowNetwork edge ({u}, {v}) names a node outside 0..{self.num_nodes - 1}")
        # NaN first: with a NaN present, min() is not reliable
        if any(map(math.isnan, self.capacities)) or (self.capacities and min(self.capacities) < 0):
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

    Among equally cheap cuts this returns the one with the largest source side (every node that
    cannot reach the sink in the residual graph), so ties are broken toward handing values over
    rather than recomputing them, and the answer does not depend on the solver's internals.
    Infinite capacities become a finite bound larger than every finite cut, so the solver never
    does arithmetic on ``inf``; a cut reaching that bound is reported as infinite.
    """
    finite_total = sum(c for c in network.capacities if math.isfinite(c))
    unbounded = 2.0 * finite_total + 1.0
    capacities = [c if math.isfinite(c) else unbounded for c in network.capacities]
    graph = igraph.Graph(n=network.num_nodes, edges=list(network.edges), directed=True)
    flow = graph.maxflow(network.source, network.sink, capacity=capacities)
    value = float(flow.value)
    tolerance = 1e-9 * max(1.0, unbounded)

    # Nodes that can still reach the sink through edges with spare capacity (or flow to undo).
    residual = [e for e, cap, f in zip(network.edges, capacities, flow.flow) if cap - f > tolerance]
    residual += [(v, u) for (u, v), f in zip(network.edges, flow.flow) if f > tolerance]
    residual_graph = igraph.Graph(n=network.num_nodes, edges=residual, directed=True)
    reaches_sink = residual_graph.subcomponent(network.sink, mode="in")
    source_side = frozenset(range(network.num_nodes)).difference(reaches_sink)
    cut_edges = tuple(
        i for i, (u, v) in enumerate(network.edges) if u in source_side and v not in source_side
    )
    if value >= unbounded:
        return CutResult(math.inf, source_side, cut_edges)
    return CutResult(value, source_side, cut_edges)
