"""The backward orders of ``solvers.memory_order`` (plain data) and ``whole_graph.reorder`` (traces
built by hand): valid orders, the bytes they hold, and the estimate choosing between them."""

from __future__ import annotations

import random

import pytest

from thunder_remat.solvers.memory_order import (OrderProblem, least_peak_order, least_peak_order_from_the_end,
                                                locality_order, lowest_greedy_order, oldest_inputs_order, renumbered,
                                                smallest_first_depth_order, sunk_order, walk_peak)


ORDERS = (sunk_order, least_peak_order, least_peak_order_from_the_end, oldest_inputs_order,
          smallest_first_depth_order, lowest_greedy_order, locality_order)


def problem(nodes, sizes, kept=()):
    """``nodes``: (preds, reads, makes) per node."""
    return OrderProblem(tuple(frozenset(p) for p, _, _ in nodes), tuple(frozenset(r) for _, r, _ in nodes),
                        tuple(frozenset(m) for _, _, m in nodes), dict(sizes), frozenset(kept))


def early_partial_gradient():
    """Node 0 makes A (1000 B), read only at the end; nodes 1-3 make and free a 4000 B temporary
    in between (the T5 shape: a partial embedding gradient made early, summed last)."""
    return problem([
        ((), (), ("A",)),
        ((), (), ("M1",)),
        ((1,), ("M1",), ("M2",)),
        ((2,), ("M2",), ("M3",)),
        ((0, 3), ("A", "M3"), ("G",)),
    ], {"A": 1000, "M1": 128, "M2": 4000, "M3": 8, "G": 8}, kept=("G",))


def late_free():
    """In the given order a 2000 B value is made while a 1000 B value whose reader would free it
    is still waiting."""
    return problem([
        ((), (), ("A",)),
        ((), (), ("B",)),
        ((1,), ("B",), ("D",)),
        ((0,), ("A",), ("C",)),
        ((2, 3), ("C", "D"), ("E",)),
    ], {"A": 1000, "B": 10, "C": 10, "D": 2000, "E": 5}, kept=("E",))


@pytest.mark.unit
def test_walk_peak_counts_what_is_alive_at_each_node():
    p = early_partial_gradient()
    assert walk_peak(p, [0, 1, 2, 3, 4]) == 1000 + 128 + 4000
    assert walk_peak(p, [1, 2, 3, 0, 4]) == 128 + 4000
    # a storage read that no node makes is alive from the start and freed after its last reader
    q = problem([((), ("S",), ("X",)), ((0,), ("X",), ("Y",))], {"S": 50, "X": 7, "Y": 3}, kept=("Y",))
    assert walk_peak(q, [0, 1]) == 50 + 7


@pytest.mark.unit
def test_sunk_order_runs_a_node_that_allocates_more_than_it_frees_just_before_its_reader():
    p = early_partial_gradient()
    assert sunk_order(p) == [1, 2, 3, 0, 4]
    assert walk_peak(p, sunk_order(p)) == 4128
    # the greedy that looks one node ahead runs the small allocation first and misses it
    assert walk_peak(p, least_peak_order(p)) == 5128


@pytest.mark.unit
def test_least_peak_order_frees_before_it_allocates_more():
    p = late_free()
    assert walk_peak(p, range(5)) == 3010
    assert least_peak_order(p) == [1, 0, 3, 2, 4]
    assert walk_peak(p, least_peak_order(p)) == 2020


@pytest.mark.unit
def test_an_order_with_nothing_to_gain_is_kept():
    chain = problem([((), (), ("a",)), ((0,), ("a",), ("b",)), ((1,), ("b",), ("c",))],
                    {"a": 4, "b": 4, "c": 4}, kept=("c",))
    for make in ORDERS:
        assert make(chain) == [0, 1, 2]


@pytest.mark.unit
def test_least_peak_order_counts_what_the_run_leaves_alive_from_the_start():
    """Node 2 frees a 1000 B input as it makes a 1000 B kept output; nodes 0 and 1 make a 10 B
    value and a 10 B kept one. All kept outputs are alive at the end (1010 B with the input
    freed), so node 2 fits under that from the start and, freeing as much as it makes, goes first;
    counted from the input alone (1000 B) nothing fits and the smallest allocation would."""
    p = problem([((), (), ("t",)), ((0,), ("t",), ("K2",)), ((), ("S",), ("K",))],
                {"S": 1000, "t": 10, "K2": 10, "K": 1000}, kept=("K", "K2"))
    assert least_peak_order(p) == [2, 0, 1]
    assert walk_peak(p, [2, 0, 1]) == 2000 < walk_peak(p, [0, 1, 2]) == 2010


@pytest.mark.unit
def test_the_depth_first_order_visits_the_smallest_node_first_each_after_its_predecessors():
    p = problem([((), (), ("a",)), ((), (), ("b",)), ((0,), ("a",), ("c",)), ((1, 2), ("b", "c"), ("d",))],
                {"a": 100, "b": 1, "c": 1, "d": 1}, kept=("d",))
    # node 1 (1 B) first; node 2 (reads a: 101 B) after it; node 3 (3 B, but after all) last
    assert smallest_first_depth_order(p) == [1, 0, 2, 3]


@pytest.mark.unit
def test_the_lowest_greedy_order_is_the_lowest_of_the_orders_it_tries_the_current_one_on_a_tie():
    rng = random.Random(3)
    for _ in range(100):
        p = random_problem(rng, rng.randint(1, 25))
        tried = [list(range(len(p.preds))), least_peak_order(p), oldest_inputs_order(p), smallest_first_depth_order(p)]
        chosen = lowest_greedy_order(p)
        assert walk_peak(p, chosen) == min(walk_peak(p, order) for order in tried)
        if walk_peak(p, tried[0]) == walk_peak(p, chosen):
            assert chosen == tried[0]


@pytest.mark.unit
def test_the_locality_order_places_each_node_just_before_its_first_successor_from_the_end():
    """Inductor's FX pass, walking back from the end: the run's end reads the kept storages of
    node 1 (through node 2, a view, making nothing) and node 5, placed before it in that order, 2
    then 5; node 5's predecessor 3 just before it, and 3's predecessor 0 before 3; node 1 just
    before its view. Node 4 makes two storages and stays (first, now)."""
    p = problem([((), (), ("a",)), ((), (), ("k",)), ((1,), ("k",), ()), ((0,), ("a",), ("b",)),
                 ((), (), ("c", "d")), ((3, 4), ("b", "c", "d"), ("e",))],
                {"a": 1, "k": 1, "b": 1, "c": 1, "d": 1, "e": 1}, kept=("k", "e"))
    assert locality_order(p) == [4, 1, 2, 0, 3, 5]


@pytest.mark.unit
def test_a_renumbered_problem_walks_as_the_original():
    rng = random.Random(5)
    for _ in range(50):
        p = random_problem(rng, rng.randint(1, 20))
        base = oldest_inputs_order(p)
        q = renumbered(p, base)
        assert walk_peak(q, range(len(base))) == walk_peak(p, base)
        assert walk_peak(q, least_peak_order(q)) == walk_peak(p, [base[i] for i in least_peak_order(q)])


def random_problem(rng: random.Random, n: int) -> OrderProblem:
    nodes, sizes = [], {}
    for i in range(n):
        preds = set(rng.sample(range(i), rng.randint(0, min(i, 3)))) if i else set()
        reads = {f"v{j}" for j in preds} | ({f"in{rng.randint(0, 2)}"} if rng.random() < 0.3 else set())
        nodes.append((preds, reads, (f"v{i}",)))
        sizes[f"v{i}"] = rng.choice((4, 64, 1024))
    for k in range(3):
        sizes[f"in{k}"] = 256
    return problem(nodes, sizes, kept={f"v{n - 1}"})


@pytest.mark.unit
def test_every_order_is_a_deterministic_topological_order():
    rng = random.Random(7)
    for _ in range(200):
        p = random_problem(rng, rng.randint(1, 30))
        for make in ORDERS:
            order = make(p)
            assert sorted(order) == list(range(len(p.preds)))
            place = {node: k for k, node in enumerate(order)}
            assert all(place[j] < place[i] for i, before in enumerate(p.preds) for j in before)
            assert make(p) == order


@pytest.mark.unit
def test_a_bad_problem_is_refused():
    with pytest.raises(ValueError, match="one entry per node"):
        OrderProblem((frozenset(),), (), (), {})
    with pytest.raises(ValueError, match="node 0 must follow"):
        OrderProblem((frozenset({0}),), (frozenset(),), (frozenset(),), {})


def early_exp_joint_trace():
    """A joint trace whose backward first makes ``p = exp(w)`` (2048 B), read only by its last op,
    then a chain of three 4096 B values."""
    import thunder.torch as ltorch
    from builders import joint_trace

    made = {}

    def forward(x, w):
        return ltorch.mul(x, x)

    def backward(x, w, out, g):
        made["p"] = p = ltorch.exp(w)
        a = ltorch.mul(g, x)
        b = ltorch.mul(a, 2.0)
        gx = ltorch.mul(b, x)
        gw = ltorch.mul(p, 2.0)
        return gx, gw

    return joint_trace(forward, backward, [("x", 32, 32), ("w", 64, 8)]), made


@pytest.mark.unit
def test_the_backward_runs_in_the_order_of_lowest_estimated_peak():
    from thunder_remat.whole_graph.peak import estimate_peak_bytes
    from thunder_remat.whole_graph.reorder import lowest_peak_order

    trace, made = early_exp_joint_trace()
    before = estimate_peak_bytes(trace)
    new, peak, name = lowest_peak_order(trace, estimate_peak_bytes)
    assert name == "sunk"
    assert peak == estimate_peak_bytes(new) == before - 64 * 8 * 4  # exp's output no longer alive over the chain
    backward = [b.sym.name for b in new.bound_symbols if b.sym.name not in ("unpack_trivial",)]
    assert backward == ["mul", "get_grad", "mul", "mul", "mul", "exp", "mul", "python_return"]
    assert new.bound_symbols[-1] is trace.bound_symbols[-1]
    assert sorted(map(id, new.bound_symbols)) == sorted(map(id, trace.bound_symbols))


@pytest.mark.jit
@pytest.mark.parametrize("budget", [1.0, 0.0])
def test_every_order_of_the_backward_has_the_traces_storages(budget):
    """The pass estimates each order of a rewritten backward with the storages of the trace's own
    order: on the built-in GPT (reshapes, transposes, views of recomputed values) each order's own
    storage map is the same."""
    from helpers import joint_trace as jit_joint_trace

    from thunder_remat.models import build_model, example_batch
    from thunder_remat.trace_facts import forward_storages
    from thunder_remat.whole_graph.reorder import ORDERS, backward_order_problem, reordered

    model = build_model("gpt", "small")
    _, result = jit_joint_trace(model, (example_batch(model),), remat_memory_budget=budget)
    start, problem = backward_order_problem(result.trace, result.prologue)
    own = forward_storages(result.trace, with_backward=True)
    assert len(own.maybe_view) > 0
    for name, make in ORDERS:
        order = make(problem)
        assert order != list(range(len(problem.preds))), name
        other = forward_storages(reordered(result.trace, start, order), with_backward=True)
        assert (other.owner, other.owner_bytes, other.maybe_view, other.held) == \
            (own.owner, own.owner_bytes, own.maybe_view, own.held), name


@pytest.mark.unit
def test_a_prologue_op_keeps_its_place():
    from thunder_remat.whole_graph.peak import estimate_peak_bytes
    from thunder_remat.whole_graph.reorder import lowest_peak_order

    trace, made = early_exp_joint_trace()
    new, peak, name = lowest_peak_order(trace, estimate_peak_bytes, prologue=frozenset({made["p"].name}))
    assert (new, peak, name) == (trace, estimate_peak_bytes(trace), "trace")


def partial_gradient_made_early(x, w):
    """The backward makes the gradient of ``(a * a).sum()`` first and adds it to the one through
    the wide tanh only at the end: the first is held over the wide weight gradient unless sunk."""
    import torch

    a = x * 2
    m = torch.tanh(a @ w)
    return m.sum() + (a * a).sum()


@pytest.mark.jit
@pytest.mark.parametrize("executor", ["default", "eager fusion"])
def test_a_sunk_backward_computes_the_same_gradients_and_holds_less(executor):
    """Unfused the backward is sunk, holds exactly the partial gradient's bytes less and computes
    the same gradients; with the eager fusion executor (regions the estimate walks as unfused) it
    keeps the trace's order."""
    import thunder
    import torch

    import thunder_remat
    from thunder_remat.executors.eager import eager_fusion_ex
    from thunder_remat.inspect.measure import allocator_step_peak

    executors = list(thunder.get_default_executors())
    if executor == "eager fusion":
        executors = [eager_fusion_ex, *executors]
    torch.manual_seed(0)
    x, w = torch.randn(8, 32, requires_grad=True), torch.randn(32, 64, requires_grad=True)
    partial_gradient_made_early(x, w).backward()
    expected = (x.grad.clone(), w.grad.clone())
    peaks, orders = {}, {}
    for reorder in (True, False):
        jitted = thunder.jit(partial_gradient_made_early, executors=executors, remat=True,
                             remat_reorder_backward=reorder)

        def step():
            jitted(x, w).backward()

        x.grad = w.grad = None
        step()
        assert torch.allclose(x.grad, expected[0], atol=1e-5) and torch.allclose(w.grad, expected[1], atol=1e-5)
        x.grad = w.grad = None
        peaks[reorder] = allocator_step_peak(step).peak_bytes
        orders[reorder] = thunder_remat.last_save_plan(jitted).backward_order
        sunk = orders[reorder] == "sunk"
        assert ("backward run in the 'sunk' order" in thunder_remat.last_save_plan(jitted).provenance()) == sunk
        report = thunder_remat.explain(jitted)
        assert report.backward_order == orders[reorder]
        assert ("backward run in the 'sunk' order" in str(report)) == sunk
    if executor == "default":
        assert orders == {True: "sunk", False: "trace"}
        # unfused, the walk is the allocator: the [8, 32] float32 partial gradient is no longer
        # alive at the weight gradient's matmul, where the step peaks
        assert peaks[False] - peaks[True] == 8 * 32 * 4
    else:
        # regions whose kernels the estimate does not model keep the trace's order
        assert orders == {True: "trace", False: "trace"} and peaks[True] == peaks[False]


@pytest.mark.unit
def test_an_order_the_estimate_barely_prefers_is_not_taken():
    from thunder_remat.whole_graph.peak import estimate_peak_bytes
    from thunder_remat.whole_graph.reorder import lowest_peak_order

    trace, _ = early_exp_joint_trace()
    own = estimate_peak_bytes(trace)
    gain = 64 * 8 * 4 / own  # what sinking exp's output saves, as a fraction of the peak
    assert lowest_peak_order(trace, estimate_peak_bytes, min_gain=gain)[2] == "sunk"
    assert lowest_peak_order(trace, estimate_peak_bytes, min_gain=gain * 1.01) == (trace, own, "trace")
