"""Solve stage of the pair pass: a ``PairProblem`` becomes a value network, its min cut a ``PairPlan``.

The network is the one both passes cut (``solvers.split_network``): a value's edge costs what
handing it to the consumer costs; the source feeds what must be computed by the producer (its
inputs, pinned values); the values the consumer reads drain into the sink. Values whose ``in``
node lands on the sink side are recomputed by the consumer. No thunder import here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from thunder_remat.pairs.problem import PairProblem
from thunder_remat.solvers.maxflow import CutResult, min_cut
from thunder_remat.solvers.split_network import SplitNetwork, ValueNetwork

__all__ = ["PairPlan", "build_network", "plan_from_cut", "solve_pair", "value_capacity"]


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


def build_network(problem: PairProblem) -> ValueNetwork:
    split = SplitNetwork(problem.values)
    for name, size in zip(problem.values, problem.nbytes):
        split.value(name, value_capacity(problem, name, size))
    for name in problem.values:
        if name in problem.producer_inputs or name in problem.pinned:
            split.available(name)
    for ins, outs in problem.ops:
        for out in outs:
            split.made_from(ins, out)
    for written, destination in problem.writes.items():
        split.made_with(destination, written)
    for name in problem.needed:
        split.needed(name)
    return split.record()


def plan_from_cut(problem: PairProblem, pair_network: ValueNetwork, cut: CutResult) -> PairPlan:
    decided = pair_network.decode(cut)
    transferred = tuple(problem.values[k] for k in np.flatnonzero(decided.crossing).tolist())
    recomputed = tuple(problem.values[k] for k in np.flatnonzero(decided.made_again).tolist()
                       if problem.values[k] not in problem.producer_inputs)
    return PairPlan(problem.producer, problem.consumer, cut.value, transferred, recomputed)


def solve_pair(problem: PairProblem) -> tuple[ValueNetwork, CutResult, PairPlan]:
    """Build, cut and interpret; an infinite cut means the pair cannot be changed."""
    pair_network = build_network(problem)
    cut = min_cut(pair_network.network)
    if not cut.is_finite:
        plan = PairPlan(problem.producer, problem.consumer, cut.value, problem.needed, ())
    else:
        plan = plan_from_cut(problem, pair_network, cut)
    return pair_network, cut, plan
