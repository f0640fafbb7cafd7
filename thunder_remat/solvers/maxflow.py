"""Minimum s-t cut of a directed flow network with python-igraph.

The network is plain data (node count, edge list, capacities) so the solver can be tested
against a second implementation without any trace. ``CutSolver`` holds one network's edges and
solves a cut for each capacity vector it is given: the whole-graph pass solves hundreds of cuts
on edges that never change, so the graph is built once and each cut is array work around
igraph's s-t min cut.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import igraph
import numpy as np

__all__ = ["FlowNetwork", "CutResult", "CutSolver", "min_cut", "cut_from_source_side"]


def _check_edges(num_nodes: int, edges, source: int, sink: int) -> None:
    if edges and (min(map(min, edges)) < 0 or max(map(max, edges)) >= num_nodes):
        u, v = next((u, v) for u, v in edges if not (0 <= u < num_nodes and 0 <= v < num_nodes))
        raise ValueError(f"FlowNetwork edge ({u}, {v}) names a node outside 0..{num_nodes - 1}")
    if source == sink:
        raise ValueError("FlowNetwork source and sink must differ")


def _check_capacities(num_edges: int, capacities: np.ndarray) -> None:
    if len(capacities) != num_edges:
        raise ValueError("FlowNetwork needs one capacity per edge")
    # NaN first: with a NaN present, min() is not reliable
    if np.isnan(capacities).any() or (len(capacities) and capacities.min() < 0):
        raise ValueError("FlowNetwork capacities must be non-negative numbers")


@dataclass(frozen=True)
class FlowNetwork:
    """A directed graph with edge capacities; ``math.inf`` marks an edge that may not be cut."""

    num_nodes: int
    edges: tuple[tuple[int, int], ...]
    capacities: tuple[float, ...]
    source: int
    sink: int

    def __post_init__(self) -> None:
        _check_edges(self.num_nodes, self.edges, self.source, self.sink)
        _check_capacities(len(self.edges), np.asarray(self.capacities, dtype=float))


@dataclass(frozen=True)
class CutResult:
    """A minimum cut: its value, the nodes on the source side, and the cut edges (indices)."""

    value: float
    #: per node: on the source side
    source_mask: np.ndarray = field(repr=False, compare=False)
    cut_edges: tuple[int, ...]

    @cached_property
    def source_side(self) -> frozenset[int]:
        return frozenset(np.flatnonzero(self.source_mask).tolist())

    @property
    def is_finite(self) -> bool:
        return math.isfinite(self.value)


class CutSolver:
    """Minimum cuts of one network's edges, for any capacities.

    Among equally cheap cuts ``cut`` returns the one with the largest source side (every node that
    cannot reach the sink in the residual graph), so ties are broken toward handing values over
    rather than recomputing them, and the answer does not depend on the solver's internals.
    Infinite capacities become a finite bound larger than every finite cut, so the solver never
    does arithmetic on ``inf``; a cut reaching that bound is reported as infinite.
    """

    def __init__(self, num_nodes: int, edges, source: int, sink: int) -> None:
        edges = tuple(edges)
        _check_edges(num_nodes, edges, source, sink)
        self.num_nodes, self.edges, self.source, self.sink = num_nodes, edges, source, sink
        pairs = np.asarray(edges, dtype=np.int64).reshape(len(edges), 2)
        self.tails, self.heads = pairs[:, 0], pairs[:, 1]
        self.graph = igraph.Graph(n=num_nodes, edges=list(edges), directed=True)

    @property
    def num_edges(self) -> int:
        return len(self.tails)

    def network(self, capacities) -> FlowNetwork:
        """The plain record of this network with ``capacities`` (for drawings and checks)."""
        return FlowNetwork(self.num_nodes, self.edges, tuple(float(c) for c in capacities), self.source, self.sink)

    def cut(self, capacities) -> CutResult:
        caps = np.array(capacities, dtype=float)
        _check_capacities(self.num_edges, caps)
        finite = np.isfinite(caps)
        unbounded = 2.0 * float(caps[finite].sum()) + 1.0
        caps[~finite] = unbounded
        # igraph's s-t min cut (push-relabel without its flow-recovery phase) marks every node that
        # reaches the sink in the residual graph and returns the others as the first partition:
        # the largest source side of a minimum cut, the tie-break this class promises
        value, _, source_side, _ = igraph.GraphBase.mincut(self.graph, self.source, self.sink, caps.tolist())
        source_mask = np.zeros(self.num_nodes, dtype=bool)
        source_mask[source_side] = True
        crossing = source_mask[self.tails] & ~source_mask[self.heads]
        cut_edges = tuple(np.flatnonzero(crossing).tolist())
        value = float(value)
        return CutResult(math.inf if value >= unbounded else value, source_mask, cut_edges)


def min_cut(network: FlowNetwork) -> CutResult:
    """Solve the minimum cut of one network (see ``CutSolver.cut``); an infinite value means
    source and sink cannot be separated."""
    return CutSolver(network.num_nodes, network.edges, network.source, network.sink).cut(network.capacities)


def cut_from_source_side(network: FlowNetwork, source_mask) -> CutResult:
    """The cut of ``network`` that a stored source side describes (no solve): its crossing edges
    and their capacities' sum."""
    mask = np.asarray(source_mask, dtype=bool)
    if mask.shape != (network.num_nodes,) or not mask[network.source] or mask[network.sink]:
        raise ValueError("a cut's source side must hold the source and not the sink, one flag per node")
    crossing = tuple(k for k, (u, v) in enumerate(network.edges) if mask[u] and not mask[v])
    return CutResult(float(sum(network.capacities[k] for k in crossing)), mask, crossing)
