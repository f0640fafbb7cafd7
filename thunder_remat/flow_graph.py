"""Solve stage of the pair pass: a ``PairProblem`` becomes a flow network, its min cut a ``PairPlan``.

Every value ``v`` of the producer is split into two typed nodes, ``ValueNode(v, IN)`` and
``ValueNode(v, OUT)``, joined by an edge whose capacity is what it costs to hand ``v`` to the
consumer. Dataflow edges (input of an op -> output of that op) cannot be cut. The source feeds
what must be computed by the producer (its inputs, pinned values); the values the consumer reads
drain into the sink. A minimum cut then crosses exactly the value edges of the cheapest set of
values to hand over; values whose IN node lands on the sink side are recomputed by the consumer.
No thunder import here: this module works on names and numbers only.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from thunder_remat.pair_problem import PairProblem
from thunder_remat.solvers.maxflow import CutResult, FlowNetwork, min_cut

__all__ = ["Side", "ValueNode", "Terminal", "PairNetwork", "PairPlan", "build_network", "plan_from_cut", "solve_pair"]


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


@dataclass(frozen=True)
class PairNetwork:
    """A flow network plus the typed node behind every integer id."""

    network: FlowNetwork
    nodes: tuple[ValueNode | Terminal, ...]


@dataclass(frozen=True)
class PairPlan:
    """What the min cut decided for one pair."""

    producer: str
    consumer: str
    cut_value: float
    #: values handed from producer to consumer (producer-defined values and producer inputs)
    transferred: tuple[str, ...]
    #: producer-defined values the consumer computes itself
    recomputed: tuple[str, ...]

    @property
    def changes_anything(self) -> bool:
        return bool(self.recomputed)


def value_capacity(problem: PairProblem, name: str, size: int) -> float:
    """Cost of handing ``name`` to the consumer: the storage it keeps alive.

    A view does not cross (its base does, and the consumer makes the view again for free), so
    that handing over several views of one base never costs more than the base; a view that must
    cross (pinned), or a write's output (what its storage holds), costs what its base would.
    """
    if name in problem.frozen:
        return math.inf
    if name in problem.free:
        return 0.0
    owner = problem.views.get(name)
    if owner is not None and name not in problem.pinned and name not in problem.writes:
        return math.inf
    if owner is not None and owner != name:
        # priced as its storage; the base may be frozen (overwritten by the write making this)
        name, size = owner, problem.storage[owner][1]
    if name in problem.free:
        return 0.0
    if name in problem.producer_inputs:
        return size * problem.producer_input_discount
    return float(size)


def _in_node(k: int) -> int:
    """Node id of the IN side of the ``k``-th value (ids 0 and 1 are the source and the sink)."""
    return 2 + 2 * k


def build_network(problem: PairProblem) -> PairNetwork:
    nodes: list[ValueNode | Terminal] = [Terminal.SOURCE, Terminal.SINK]
    for name in problem.values:
        nodes.append(ValueNode(name, Side.IN))
        nodes.append(ValueNode(name, Side.OUT))
    at = {name: _in_node(k) for k, name in enumerate(problem.values)}
    source, sink = 0, 1

    edges: list[tuple[int, int]] = []
    caps: list[float] = []
    for name, size in zip(problem.values, problem.nbytes):
        edges.append((at[name], at[name] + 1))
        caps.append(value_capacity(problem, name, size))
    for name in problem.values:
        if name in problem.producer_inputs or name in problem.pinned:
            edges.append((source, at[name]))
            caps.append(math.inf)
    for ins, outs in problem.ops:
        for a in ins:
            for b in outs:
                edges.append((at[a] + 1, at[b]))
                caps.append(math.inf)
    for written, destination in problem.writes.items():  # the write runs again only with it
        edges.append((at[destination], at[written]))
        caps.append(math.inf)
    for name in problem.needed:
        edges.append((at[name] + 1, sink))
        caps.append(math.inf)

    network = FlowNetwork(len(nodes), tuple(edges), tuple(caps), source, sink)
    return PairNetwork(network, tuple(nodes))


def plan_from_cut(problem: PairProblem, pair_network: PairNetwork, cut: CutResult) -> PairPlan:
    transferred, recomputed = [], []
    for k, name in enumerate(problem.values):
        in_src = _in_node(k) in cut.source_side
        out_src = _in_node(k) + 1 in cut.source_side
        if in_src and not out_src:
            transferred.append(name)
        elif not in_src and name not in problem.producer_inputs:
            recomputed.append(name)
    return PairPlan(problem.producer, problem.consumer, cut.value, tuple(transferred), tuple(recomputed))


def solve_pair(problem: PairProblem) -> tuple[PairNetwork, CutResult, PairPlan]:
    """Build, cut and interpret; an infinite cut means the pair cannot be changed."""
    pair_network = build_network(problem)
    cut = min_cut(pair_network.network)
    if not cut.is_finite:
        plan = PairPlan(problem.producer, problem.consumer, cut.value, problem.needed, ())
    else:
        plan = plan_from_cut(problem, pair_network, cut)
    return pair_network, cut, plan
