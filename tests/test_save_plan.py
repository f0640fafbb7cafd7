"""The whole-graph planner on hand-made problems: exact saved sets, budgets, frontier invariants."""

import dataclasses
import itertools
import math
import random

import pytest

from thunder_remat.solvers.split_network import Side, Terminal, ValueNode
from thunder_remat.whole_graph.planner import PlanSearch, SaveNetworks, _fill, build_frontier, choose_fastest
from thunder_remat.whole_graph.problem import ForwardOp, ForwardValue, SaveProblem, nested_within
from thunder_remat.solvers.maxflow import min_cut

pytestmark = pytest.mark.unit


def problem(values, ops, needed) -> SaveProblem:
    p = SaveProblem()
    for name, nbytes, is_input in values:
        p.values[name] = ForwardValue(name, nbytes, is_input)
    p.ops = [ForwardOp(index=i, **op) for i, op in enumerate(ops)]
    p.needed_by_backward = tuple(needed)
    return p


def mlp_problem() -> SaveProblem:
    """x, w, w2 inputs; h = linear(x, w); g = gelu(h); o = linear(g, w2). Backward reads x, w, h, g, w2."""
    return problem(
        [("x", 64, True), ("w", 64, True), ("w2", 64, True), ("h", 128, False), ("g", 128, False), ("o", 64, False)],
        [
            dict(op="linear", outputs=("h",), inputs=("x", "w"), cost=1000.0, soft_ban="matmul"),
            dict(op="gelu", outputs=("g",), inputs=("h",), cost=32.0),
            dict(op="linear", outputs=("o",), inputs=("g", "w2"), cost=1000.0, soft_ban="matmul"),
        ],
        ["x", "w", "h", "g", "w2"],
    )


def valid(problem: SaveProblem, plan) -> bool:
    """Every value the backward reads is saved, an input, or recomputed from those."""
    available = set(plan.saved) | {n for n, v in problem.values.items() if v.is_input}
    ops = {op.index: op for op in problem.ops}
    for i in plan.recomputed:
        if not set(ops[i].inputs) <= available:
            return False
        available |= set(ops[i].outputs)
    return set(problem.needed_by_backward) <= available


def test_fastest_plan_keeps_the_matmul_output_and_recomputes_gelu():
    p = mlp_problem()
    frontier = build_frontier(p)
    fastest = frontier.fastest
    assert fastest.saved == ("h", "w", "w2", "x")
    assert fastest.recomputed == (1,)
    assert fastest.saved_bytes == 128 and fastest.recompute_cost == 32.0
    assert fastest.cut_value == 128


def test_smallest_plan_recomputes_the_matmul_from_inputs():
    smallest = build_frontier(mlp_problem()).smallest
    assert smallest.saved == ("w", "w2", "x")
    assert smallest.recomputed == (0, 1)
    assert smallest.saved_bytes == 0 and smallest.recompute_cost == 1032.0


@pytest.mark.parametrize(
    "budget,expected_bytes,feasible",
    [
        (None, 128, True),
        (("fraction", 1.0), 128, True),
        (("fraction", 0.5), 0, True),
        (("fraction", 0.0), 0, True),
        (("bytes", 200), 128, True),
        (("bytes", 100), 0, True),
    ],
)
def test_budget_picks_the_cheapest_plan_that_fits(budget, expected_bytes, feasible):
    choice = PlanSearch(build_frontier(mlp_problem())).choose(budget)
    assert choice.plan.saved_bytes == expected_bytes and choice.feasible is feasible


def random_op_problem() -> SaveProblem:
    """r = uniform() (random, hard ban); mask = r < p (bool, 64 B); y = x * mask. Backward reads mask."""
    return problem(
        [("x", 256, True), ("r", 256, False), ("mask", 64, False), ("y", 256, False)],
        [
            dict(op="uniform", outputs=("r",), inputs=(), cost=64.0, hard_ban="random op"),
            dict(op="lt", outputs=("mask",), inputs=("r",), cost=64.0),
            dict(op="mul", outputs=("y",), inputs=("x", "mask"), cost=64.0),
        ],
        ["mask"],
    )


def test_random_op_is_never_recomputed_even_at_budget_zero():
    frontier = build_frontier(random_op_problem())
    for plan in frontier.plans:
        assert 0 not in plan.recomputed
    assert frontier.smallest.saved == ("mask",) and frontier.smallest.saved_bytes == 64


def test_infeasible_byte_budget_returns_the_smallest_plan():
    choice = PlanSearch(build_frontier(random_op_problem())).choose(("bytes", 10))
    assert not choice.feasible and choice.target_bytes == 10
    assert choice.plan.saved_bytes == 64


def test_forced_recompute_is_never_saved():
    p = mlp_problem()
    p.ops[1] = ForwardOp(index=1, op="gelu", outputs=("g",), inputs=("h",), cost=32.0, force_recompute=True)
    p.needed_by_backward = ("g", "w2")
    plan = SaveNetworks(p).plan({0, 2})
    assert "g" not in plan.saved and 1 in plan.recomputed


def test_network_shape():
    net = SaveNetworks(mlp_problem()).network({0, 2})
    assert net.labels[net.network.source] is Terminal.SOURCE and net.labels[net.network.sink] is Terminal.SINK
    assert all(net.labels[net.network.edges[e][0]] == ValueNode(name, Side.IN) for name, e in net.value_edge.items())
    assert set(net.value_edge) == {"x", "w", "w2", "h", "g", "o"}
    caps = {name: net.network.capacities[e] for name, e in net.value_edge.items()}
    assert caps == {"x": 0.0, "w": 0.0, "w2": 0.0, "h": 128.0, "g": 128.0, "o": 64.0}


def random_problem(rng: random.Random) -> SaveProblem:
    n_inputs, n_ops = rng.randint(1, 3), rng.randint(2, 14)
    values = [(f"i{k}", rng.choice([0, 64, 256]), True) for k in range(n_inputs)]
    names = [v[0] for v in values]
    ops = []
    for k in range(n_ops):
        out = f"v{k}"
        ins = tuple(sorted(set(rng.sample(names, rng.randint(1, min(3, len(names)))))))
        values.append((out, rng.choice([16, 64, 128, 512]), False))
        kind = rng.random()
        ops.append(
            dict(
                op="op",
                outputs=(out,),
                inputs=ins,
                cost=float(rng.randint(1, 1000)),
                hard_ban="random op" if kind < 0.1 else None,
                soft_ban="matmul" if 0.1 <= kind < 0.45 else None,
            )
        )
        names.append(out)
    needed = rng.sample(names, rng.randint(1, len(names)))
    return problem(values, ops, needed)


@pytest.mark.parametrize("solver", ["greedy", "dp", "ilp"])
@pytest.mark.parametrize("seed", range(15))
def test_frontier_plans_are_valid_and_budgets_are_monotone(seed, solver):
    p = random_problem(random.Random(seed))
    frontier = build_frontier(p, solver)
    for plan in frontier.plans:
        assert valid(p, plan)
        assert plan.cut_value == pytest.approx(plan.saved_bytes + plan.price * plan.recompute_cost)
    assert frontier.smallest.saved_bytes == min(plan.saved_bytes for plan in frontier.plans)
    assert choose_fastest(p, ("fraction", 1.0)).plan == frontier.fastest
    search = PlanSearch(frontier)
    assert search.choose(("fraction", 1.0)).plan == frontier.fastest
    last_bytes, last_flops = float("inf"), -1.0
    for b in (1.0, 0.9, 0.7, 0.5, 0.3, 0.1, 0.0):
        choice = search.choose(("fraction", b))
        assert choice.feasible and choice.plan.saved_bytes <= choice.target_bytes
        assert choice.plan.saved_bytes <= last_bytes and choice.plan.recompute_cost >= last_flops
        last_bytes, last_flops = choice.plan.saved_bytes, choice.plan.recompute_cost


def test_priced_plans_find_cheaper_recompute_than_knapsack_plans_alone(monkeypatch):
    """With the priced min cuts switched off (no prices), some byte budgets get plans with more
    recompute; with them, never more, and every priced plan is valid."""
    import thunder_remat.whole_graph.planner as sp

    improved = 0
    for seed in range(30):
        p = random_problem(random.Random(seed))
        with_prices = build_frontier(p, "dp")
        monkeypatch.setattr(sp, "recompute_prices", lambda problem: [])
        without = build_frontier(p, "dp")
        monkeypatch.undo()
        for plan in with_prices.plans:
            assert valid(p, plan)
        targets = sorted({plan.saved_bytes for plan in with_prices.plans + without.plans})
        searches = PlanSearch(with_prices), PlanSearch(without)
        for t in targets:
            a, b = (search.choose(("bytes", t)).plan.recompute_cost for search in searches)
            assert a <= b
            improved += a < b
    assert improved > 0


def test_above_the_fastest_plan_the_gelu_output_is_saved_instead_of_recomputed():
    """The one plan that saves more than the fastest and recomputes less: g saved too, nothing made again."""
    search = PlanSearch(build_frontier(mlp_problem()))
    (above,) = search.plans_above_fastest()
    assert above.saved == ("g", "h", "w", "w2", "x") and above.recomputed == ()
    assert above.saved_bytes == 256 and above.recompute_cost == 0.0
    assert above.kept_bans == search.frontier.fastest.kept_bans


@pytest.mark.parametrize("seed", range(20))
def test_plans_above_the_fastest_save_more_recompute_less_and_end_recomputing_nothing(seed):
    """Each is valid, keeps the fastest plan's bans (and more), saves more and recomputes less than the
    fastest; by bytes they form a Pareto line; the last recomputes nothing, so it saves exactly
    the non-input values the backward reads (no views here); none when the fastest recomputes nothing."""
    p = random_problem(random.Random(seed))
    search = PlanSearch(build_frontier(p))
    fastest, above = search.frontier.fastest, search.plans_above_fastest()
    assert search.plans_above_fastest() is above  # solved once
    if fastest.recompute_cost == 0.0:
        assert above == ()
        return
    assert above
    soft = {op.index for op in p.ops if op.soft_ban}
    for plan in above:
        assert valid(p, plan) and plan.kept_bans >= fastest.kept_bans and not soft & set(plan.recomputed)
        assert plan.saved_bytes > fastest.saved_bytes and plan.recompute_cost < fastest.recompute_cost
    assert [q.saved_bytes for q in above] == sorted({q.saved_bytes for q in above})
    assert [q.recompute_cost for q in above] == sorted({q.recompute_cost for q in above}, reverse=True)
    needed = sorted({n for n in p.needed_by_backward if not p.values[n].is_input})
    assert above[-1].recomputed == () and above[-1].saved_bytes == p.storage_bytes(needed)


def test_a_value_saved_by_a_ban_above_the_fastest_is_explained_by_the_budgets_room():
    """A chain plan above the fastest bans ops the fastest plan recomputes: the values it saves for
    them are explained so, not as the cut's choice."""
    from thunder_remat.whole_graph.reasons import SAVED_FOR_ROOM, plan_reasons

    explained = 0
    for seed in range(20):
        p = random_problem(random.Random(seed))
        search = PlanSearch(build_frontier(p))
        extra_of = {q: q.kept_bans - search.frontier.fastest.kept_bans for q in search.plans_above_fastest()}
        producer = p.producer_of()
        for plan, extra in extra_of.items():
            reasons = plan_reasons(p, plan)
            for name in plan.saved:
                if name in producer and producer[name].index in extra and not producer[name].hard_ban:
                    assert reasons.saved[name] == SAVED_FOR_ROOM, (seed, name)
                    explained += 1
    assert explained > 0


def test_filling_between_the_corners_above_the_fastest_gets_closer_to_brute_force(monkeypatch):
    """Over random problems with at most 8 ops a plan may recompute and every byte target above the
    fastest plan, the least recompute among the plans above it that fit is more than the best over
    every set of extra bans less often with the chains between the priced corners than without
    (1,856 targets against 2,880), and never less."""
    import thunder_remat.whole_graph.planner as sp

    worse = worse_corners = 0
    for seed in range(40):
        p = random_problem(random.Random(seed))
        free = [op.index for op in p.ops if not op.soft_ban and not op.hard_ban]
        if len(free) > 8:
            continue
        frontier = build_frontier(p)
        fastest, networks = frontier.fastest, frontier.networks
        family = [networks.plan(fastest.kept_bans | set(extra))
                  for k in range(len(free) + 1) for extra in itertools.combinations(free, k)]
        filled = PlanSearch(frontier).plans_above_fastest()
        monkeypatch.setattr(sp, "_fill_above", lambda solved, lower, upper: [])
        corners = PlanSearch(frontier).plans_above_fastest()
        monkeypatch.undo()
        for q in corners:  # each corner is kept, or a filled plan saves no more and recomputes less
            assert q in filled or any(f.saved_bytes <= q.saved_bytes and f.recompute_cost < q.recompute_cost
                                      for f in filled)
        for target in range(fastest.saved_bytes, max(q.saved_bytes for q in family) + 1):
            best = min(q.recompute_cost for q in family if q.saved_bytes <= target)
            for plans, count in ((filled, "filled"), (corners, "corners")):
                got = min([fastest.recompute_cost] + [q.recompute_cost for q in plans if q.saved_bytes <= target])
                assert got >= best - 1e-9
                if got > best + 1e-9:
                    worse += count == "filled"
                    worse_corners += count == "corners"
    assert worse < worse_corners, (worse, worse_corners)


def two_layer_problem() -> SaveProblem:
    """Two matmuls h1, h2 (100 B each) and a small reduction of each (r1, r2: 4 B), all soft-banned."""
    return problem(
        [("x", 64, True), ("h1", 100, False), ("r1", 4, False), ("h2", 100, False), ("r2", 4, False)],
        [
            dict(op="linear", outputs=("h1",), inputs=("x",), cost=1000.0, soft_ban="matmul"),
            dict(op="sum", outputs=("r1",), inputs=("h1",), cost=100.0, soft_ban="small reduction"),
            dict(op="linear", outputs=("h2",), inputs=("h1",), cost=1000.0, soft_ban="matmul"),
            dict(op="sum", outputs=("r2",), inputs=("h2",), cost=100.0, soft_ban="small reduction"),
        ],
        ["h1", "r1", "h2", "r2"],
    )


def kept_ban_family(p: SaveProblem):
    """Second solver: the min cut for every subset of soft bans kept."""
    soft = [op.index for op in p.ops if op.soft_ban and not op.hard_ban]
    # a fresh network per subset: no capacities shared with the search it checks
    return [SaveNetworks(p).plan(set(kept)) for r in range(len(soft) + 1) for kept in itertools.combinations(soft, r)]


def without_gap_filling(frontier):
    return dataclasses.replace(frontier, networks=None)


def test_a_budget_between_frontier_plans_gets_a_plan_in_the_gap():
    """With 4 knapsack steps the frontier jumps from 108 B to 208 B; budgets of 204 and 200 B
    recompute one or both small reductions instead of a matmul."""
    frontier = build_frontier(two_layer_problem(), steps=4)
    search = PlanSearch(frontier)
    assert [p.saved_bytes for p in frontier.plans] == [0, 8, 104, 108, 208]
    at_204 = search.choose(("bytes", 204)).plan
    assert at_204.saved == ("h1", "h2", "r1") and at_204.recompute_cost == 100.0
    at_200 = search.choose(("bytes", 200)).plan
    assert at_200.saved == ("h1", "h2") and at_200.recompute_cost == 200.0
    assert search.gap_plans(200) is search.gap_plans(150)  # one filling per gap
    unfilled = PlanSearch(without_gap_filling(frontier)).choose(("bytes", 200)).plan
    assert unfilled.saved == ("h1", "r1", "r2") and unfilled.recompute_cost == 1000.0
    family = kept_ban_family(two_layer_problem())
    for target in range(209):
        best = min(p.recompute_cost for p in family if p.saved_bytes <= target)
        assert search.choose(("bytes", target)).plan.recompute_cost == best, target


def test_a_budget_a_frontier_plan_meets_exactly_fills_no_gap():
    """Plans in a gap save more than the plan below it, so a budget equal to that plan's bytes
    (0.0: the smallest plan) cannot use them: no cut is solved for them."""
    frontier = build_frontier(two_layer_problem(), steps=4)
    search = PlanSearch(frontier)
    for target in (0, 8, 104, 108):
        assert search.choose(("bytes", target)).plan.saved_bytes == target
    assert search.choose(("fraction", 0.0)).plan is frontier.smallest
    assert search.gaps == {}
    search.choose(("bytes", 200))
    assert list(search.gaps) == [4]


@pytest.mark.parametrize("seed", range(12))
def test_gap_filling_never_costs_recompute_and_keeps_the_budget_monotone(seed):
    p = random_problem(random.Random(seed))
    frontier = build_frontier(p)
    search = PlanSearch(frontier)
    unfilled = without_gap_filling(frontier)
    last_bytes, last_cost = math.inf, -math.inf
    for target in range(frontier.fastest.saved_bytes, frontier.smallest.saved_bytes - 1, -1):
        choice = search.choose(("bytes", target))
        assert valid(p, choice.plan) and choice.plan.saved_bytes <= target
        assert choice.plan.recompute_cost <= PlanSearch(unfilled).choose(("bytes", target)).plan.recompute_cost  # no gaps
        assert choice.plan.saved_bytes <= last_bytes and choice.plan.recompute_cost >= last_cost
        last_bytes, last_cost = choice.plan.saved_bytes, choice.plan.recompute_cost
    for upper, plans in search.gaps.items():
        low, high = frontier.plans[upper - 1].saved_bytes, frontier.plans[upper].saved_bytes
        assert all(low < plan.saved_bytes < high for plan in plans)


@pytest.mark.parametrize("seed", range(20))
def test_a_gap_keeps_its_pareto_plans_and_budgets_choose_as_from_all_it_found(seed):
    """A filled gap keeps only plans no other of its plans beats on both bytes and recompute, and
    every byte budget chooses the plan it would choose from everything the filling found (with 4
    knapsack steps the gaps are wide: seeds 0, 14 and 16 find plans others beat)."""
    p = random_problem(random.Random(seed))
    frontier = build_frontier(p, steps=4)
    search = PlanSearch(frontier)
    found = {}  # everything a gap's filling finds, by the index of the plan above the gap
    for target in range(frontier.fastest.saved_bytes, frontier.smallest.saved_bytes - 1, -1):
        chosen = search.choose(("bytes", target)).plan
        fitting = [q for q in frontier.plans if q.saved_bytes <= target]
        upper = next((k for k, q in enumerate(frontier.plans) if q.saved_bytes > target), None)
        if upper is not None and fitting:
            low, least = frontier.plans[upper - 1].saved_bytes, frontier.plans[upper].recompute_cost
            if upper not in found:
                found[upper] = _fill(frontier.networks, frontier.plans[upper], low, frontier.solver)
            fitting += [q for q in found[upper] if low < q.saved_bytes <= target and q.recompute_cost >= least]
        assert chosen == min(fitting, key=lambda q: (q.recompute_cost, q.saved_bytes, q.key)), target
    for plans in search.gaps.values():
        for a in plans:
            assert not any(b is not a and b.saved_bytes <= a.saved_bytes and b.recompute_cost <= a.recompute_cost
                           for b in plans)


def test_gap_filling_gets_closer_to_brute_force():
    """Over random problems with at most 6 soft bans and every byte target, the chosen plan
    recomputes more than the best kept-ban subset less often with gap filling than without
    (64 targets against 128 of 8,982; priced plans beat the subsets elsewhere)."""
    worse = worse_unfilled = 0
    for seed in range(40):
        p = random_problem(random.Random(seed))
        if sum(1 for op in p.ops if op.soft_ban and not op.hard_ban) > 6:
            continue
        family = kept_ban_family(p)
        frontier = build_frontier(p)
        filled, unfilled = PlanSearch(frontier), PlanSearch(without_gap_filling(frontier))
        for target in range(frontier.smallest.saved_bytes, frontier.fastest.saved_bytes + 1):
            best = min(q.recompute_cost for q in family if q.saved_bytes <= target)
            worse += filled.choose(("bytes", target)).plan.recompute_cost > best + 1e-9
            worse_unfilled += unfilled.choose(("bytes", target)).plan.recompute_cost > best + 1e-9
    assert worse < worse_unfilled


@pytest.mark.parametrize("seed", range(12))
def test_shared_networks_give_each_plan_a_one_off_cut_gives(seed):
    """``SaveNetworks`` solves every (kept bans, price) on one set of edges, each cut only setting
    capacities: its plans equal those decoded from a one-off cut of the plain network record, in
    any order of asking (multi-output ops, whose price edge is tied, included)."""
    rng = random.Random(seed)
    p = random_problem(rng)
    last = p.ops[-1]
    p.values["extra"] = ForwardValue("extra", 64, False)
    p.ops[-1] = dataclasses.replace(last, outputs=(*last.outputs, "extra"), soft_ban="matmul", hard_ban=None)
    p.needed_by_backward = (*p.needed_by_backward, "extra")
    networks = SaveNetworks(p)
    soft = sorted(op.index for op in p.ops if op.soft_ban and not op.hard_ban)
    asks = [(frozenset(rng.sample(soft, rng.randint(0, len(soft)))), rng.choice([0.0, 0.0, 0.05, 1.0, 20.0]))
            for _ in range(10)]
    for kept, price in asks + asks[::-1]:
        plan = networks.plan(kept, price)
        net = networks.network(kept, price)
        assert networks.plan_from_cut(min_cut(net.network), kept, price) == plan
        assert valid(p, plan)


def test_a_nested_problem_saves_only_what_the_outer_plan_saves():
    """Nested within a plan saving h2, r1 and r2 (h1 recomputed): h1's matmul ban is dropped (its
    output may not be saved), the others hold; every byte target gets the least recompute of
    the plans saving only those values (h1 always recomputed, 1,000 flops)."""
    p = two_layer_problem()
    nested = nested_within(p, ("h2", "r1", "r2", "x"))
    assert [op.soft_ban for op in nested.ops] == [None, "small reduction", "matmul", "small reduction"]
    assert not nested.may_save("h1") and nested.may_save("h2") and p.may_save("h1")
    search = PlanSearch(build_frontier(nested))
    chosen = {t: search.choose(("bytes", t)).plan for t in (208, 108, 104, 100, 8, 4, 0)}
    assert {t: (q.saved, q.recompute_cost) for t, q in chosen.items()} == {
        208: (("h2", "r1", "r2", "x"), 1000.0), 108: (("h2", "r1", "r2", "x"), 1000.0),
        104: (("h2", "r1", "x"), 1100.0), 100: (("h2", "x"), 1200.0), 8: (("r1", "r2", "x"), 2000.0),
        4: (("r1", "x"), 2100.0), 0: (("x",), 2200.0)}
    assert all(valid(p, q) for q in chosen.values())


def _least_bytes_within(p: SaveProblem, savable) -> int:
    """Second solver: the fewest bytes of any subset of ``savable`` from which (with the inputs)
    the backward's values can be made again, trying every subset."""
    ops = [op for op in p.ops if op.hard_ban is None]
    inputs = {n for n, v in p.values.items() if v.is_input}
    best = math.inf
    for k in range(len(savable) + 1):
        for subset in itertools.combinations(savable, k):
            made, grew = inputs | set(subset), True
            while grew:
                grew = False
                for op in ops:
                    if not set(op.outputs) <= made and set(op.inputs) <= made:
                        made |= set(op.outputs)
                        grew = True
            if set(p.needed_by_backward) <= made:
                best = min(best, p.storage_bytes(subset))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_plans_nested_within_a_frontier_plan_fit_its_bytes_and_the_smallest_is_the_least(seed):
    """Nested within each plan of a random problem's frontier: every plan saves only what that plan
    saves (and inputs) and is valid; a budget of that plan's bytes always has a plan; the smallest
    saves as few bytes as every subset tried one by one allows."""
    p = random_problem(random.Random(seed))
    inputs = {n for n, v in p.values.items() if v.is_input}
    for outer in build_frontier(p).plans:
        nested = nested_within(p, outer.saved)
        frontier = build_frontier(nested)
        for q in frontier.plans:
            assert set(q.saved) <= set(outer.saved) | inputs and valid(p, q)
        assert PlanSearch(frontier).choose(("bytes", outer.saved_bytes)).feasible
        savable = sorted(set(outer.saved) - inputs)
        assert frontier.smallest.saved_bytes == _least_bytes_within(p, savable)
