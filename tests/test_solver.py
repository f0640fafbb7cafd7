"""The igraph min cut against networkx, and the pair network's decisions on hand-made problems."""

import dataclasses
import math
import random

import pytest

from helpers import networkx_cut_value, networkx_largest_source_side
from thunder_remat.pairs.solve import build_network, solve_pair
from thunder_remat.solvers.split_network import Side, Terminal, ValueNode
from thunder_remat.pairs.analysis import PairProblem
from thunder_remat.solvers import CutSolver, FlowNetwork, min_cut

pytestmark = pytest.mark.unit


def random_network(rng: random.Random) -> FlowNetwork:
    n = rng.randint(3, 12)
    edges, caps = [], []
    for _ in range(rng.randint(n, 4 * n)):
        u, v = rng.sample(range(n), 2)
        edges.append((u, v))
        caps.append(math.inf if rng.random() < 0.15 else float(rng.randint(0, 20)))
    return FlowNetwork(n, tuple(edges), tuple(caps), 0, n - 1)


@pytest.mark.parametrize("seed", range(60))
def test_cut_value_equals_networkx(seed):
    network = random_network(random.Random(seed))
    cut = min_cut(network)
    expected = networkx_cut_value(network)
    if math.isinf(expected):
        assert math.isinf(cut.value)
    else:
        assert cut.value == pytest.approx(expected)
        crossing = sum(
            network.capacities[i]
            for i, (u, v) in enumerate(network.edges)
            if u in cut.source_side and v not in cut.source_side
        )
        assert crossing == pytest.approx(cut.value)
    assert network.source in cut.source_side and network.sink not in cut.source_side


@pytest.mark.parametrize("seed", range(40))
def test_ties_go_to_the_largest_source_side(seed):
    """Among minimum cuts, the one whose source side is every node that cannot reach the sink in
    the residual graph (networkx's flow, finite integer capacities with many ties)."""
    rng = random.Random(1000 + seed)
    shape = random_network(rng)
    caps = tuple(float(rng.choice([0, 1, 1, 2, 3])) for _ in shape.edges)
    network = FlowNetwork(shape.num_nodes, shape.edges, caps, shape.source, shape.sink)
    assert min_cut(network).source_side == networkx_largest_source_side(network)


def test_flow_network_rejects_bad_input():
    with pytest.raises(ValueError, match="one capacity per edge"):
        FlowNetwork(2, ((0, 1),), (), 0, 1)
    with pytest.raises(ValueError, match="outside"):
        FlowNetwork(2, ((0, 5),), (1.0,), 0, 1)
    with pytest.raises(ValueError, match="non-negative"):
        FlowNetwork(2, ((0, 1),), (-1.0,), 0, 1)
    with pytest.raises(ValueError, match="differ"):
        FlowNetwork(2, ((0, 1),), (1.0,), 0, 0)


def chain_problem(**overrides) -> PairProblem:
    """x (input, 64 B) -> a (64 B) -> b (64 B) -> c (16 B, e.g. a narrowing cast); consumer reads b and c."""
    base = dict(
        producer="P",
        consumer="C",
        values=("x", "a", "b", "c"),
        nbytes=(64, 64, 64, 16),
        ops=((("x",), ("a",)), (("a",), ("b",)), (("b",), ("c",))),
        producer_inputs=frozenset({"x"}),
        pinned={},
        free=frozenset(),
        frozen=frozenset(),
        needed=("b", "c"),
    )
    base.update(overrides)
    return PairProblem(**base)


def test_pointwise_chain_is_recomputed_from_the_input():
    _, cut, plan = solve_pair(chain_problem())
    assert cut.value == 32  # x at half price beats b (64) or b + c (80)
    assert plan.transferred == ("x",)
    assert plan.recomputed == ("a", "b", "c")


def test_pinned_value_stays_in_producer():
    _, cut, plan = solve_pair(chain_problem(pinned={"a": "random op"}, nbytes=(64, 64, 128, 16)))
    assert plan.transferred == ("a",)
    assert plan.recomputed == ("b", "c")
    assert cut.value == 64


def test_ties_prefer_handing_over_to_recomputing():
    # a and b cost the same; handing b over recomputes only c
    _, cut, plan = solve_pair(chain_problem(pinned={"a": "random op"}))
    assert cut.value == 64
    assert plan.transferred == ("b",)
    assert plan.recomputed == ("c",)


def test_free_value_crosses_at_no_cost():
    _, cut, plan = solve_pair(chain_problem(free=frozenset({"b"}), pinned={"b": "needed outside this pair"}))
    assert cut.value == 0
    assert plan.transferred == ("b",)
    assert plan.recomputed == ("c",)


def test_mutated_input_cannot_be_reread():
    _, cut, plan = solve_pair(chain_problem(frozen=frozenset({"x"})))
    assert plan.transferred == ("b",)  # ties with a at 64 bytes; b recomputes less
    assert cut.value == 64


def test_the_output_of_a_write_crosses_as_the_storage_it_wrote():
    """x <- copy_(a, x) makes w, a view of x; v is a view of w. x itself is overwritten (frozen),
    but w is what x's storage holds from then on: w crosses at x's price, v is made again. The
    write is not run again: its destination x is the producer's input, not made again."""
    problem = PairProblem(
        producer="P", consumer="C", values=("x", "a", "w", "v"), nbytes=(64, 64, 64, 64),
        ops=((("x",), ("a",)), (("a", "x"), ("w",)), (("w",), ("v",))), producer_inputs=frozenset({"x"}),
        pinned={}, free=frozenset(), frozen=frozenset({"x"}), needed=("v",),
        views={"w": "x", "v": "x"}, storage={n: ("x", 64) for n in ("x", "w", "v")} | {"a": ("a", 64)},
        writes={"w": "x"},
    )
    _, cut, plan = solve_pair(problem)
    assert plan.transferred == ("w",)
    assert plan.recomputed == ("v",)
    assert cut.value == 32  # x's storage, a producer input, at half price


def test_a_write_runs_again_with_its_destination():
    """x -> d -> (w <- copy_(e, d)) with e from d: the consumer may make d again and write into it."""
    problem = PairProblem(
        producer="P", consumer="C", values=("x", "d", "e", "w"), nbytes=(64, 64, 64, 64),
        ops=((("x",), ("d",)), (("d",), ("e",)), (("e", "d"), ("w",))), producer_inputs=frozenset({"x"}),
        pinned={}, free=frozenset({"x"}), frozen=frozenset({"d"}), needed=("w",),
        views={"w": "d"}, storage={"x": ("x", 64), "d": ("d", 64), "e": ("e", 64), "w": ("d", 64)},
        writes={"w": "d"},
    )
    _, cut, plan = solve_pair(problem)
    assert cut.value == 0 and plan.recomputed == ("d", "e", "w")
    # pin d in the producer: then the write may not run again, w crosses as d's storage
    _, cut, plan = solve_pair(dataclasses.replace(problem, pinned={"d": "matmul"}))
    assert plan.transferred == ("w",) and plan.recomputed == ()
    assert cut.value == 64


def test_infinite_cut_changes_nothing():
    problem = chain_problem(frozen=frozenset({"x", "a", "b", "c"}))
    _, cut, plan = solve_pair(problem)
    assert math.isinf(cut.value)
    assert not plan.changes_anything


def test_network_nodes_are_typed():
    net = build_network(chain_problem())
    assert net.labels[-2:] == (Terminal.SOURCE, Terminal.SINK)
    assert net.labels[net.network.source] is Terminal.SOURCE and net.labels[net.network.sink] is Terminal.SINK
    assert ValueNode("b", Side.OUT) in net.labels
    assert net.network.num_nodes == 2 + 2 * 4


def test_collectives_stay_in_the_producer():
    """A fusion pair never moves an all-gather or a wait into the consumer (they have no tags):
    the tag reader marks them, and the structural bans hold whatever the policies."""
    from types import SimpleNamespace

    from thunder_remat.policies import STRUCTURAL_HARD_BANS
    from thunder_remat.pairs.analysis import _KeepRules
    from thunder_remat.trace_facts import TagReader

    def bsym(name):
        return SimpleNamespace(sym=SimpleNamespace(name=name, tags=None, id=name), tags=set(), subsymbols=(),
                               flat_proxy_outs=(), flat_proxy_args=())

    keep = _KeepRules(policies=(), tags_of=TagReader(), same_executor=True, consumer_can_fuse=lambda bsym: True)
    for name in ("torch_all_gather_prim_impl", "torch_wait_prim_impl", "wait", "all_reduce"):
        assert keep.reason(bsym(name)) == STRUCTURAL_HARD_BANS["COLLECTIVE"]
    assert keep.reason(bsym("add")) is None


@pytest.mark.parametrize("seed", range(10))
def test_one_solver_many_capacities(seed):
    """A CutSolver reused for many capacity vectors (zeros included: edges a cut does not use)
    gives each the cut a fresh solve of that network gives, at networkx's value."""
    rng = random.Random(seed)
    shape = random_network(rng)
    solver = CutSolver(shape.num_nodes, shape.edges, shape.source, shape.sink)
    for _ in range(8):
        caps = tuple(rng.choice([0.0, 0.0, math.inf, float(rng.randint(1, 20))]) for _ in shape.edges)
        network = FlowNetwork(shape.num_nodes, shape.edges, caps, shape.source, shape.sink)
        cut, fresh = solver.cut(caps), min_cut(network)
        assert cut.source_side == fresh.source_side and cut.cut_edges == fresh.cut_edges
        expected = networkx_cut_value(network)
        assert cut.value == pytest.approx(expected) or (math.isinf(cut.value) and math.isinf(expected))


def test_cut_solver_rejects_bad_capacities():
    solver = CutSolver(3, ((0, 1), (1, 2)), 0, 2)
    with pytest.raises(ValueError, match="one capacity per edge"):
        solver.cut((1.0,))
    with pytest.raises(ValueError, match="non-negative"):
        solver.cut((1.0, math.nan))
