"""Knapsack solvers on case tables, against brute force on small random inputs."""

import itertools
import random

import pytest

from thunder_remat.solvers.knapsack import KNAPSACK_SOLVERS, solve_knapsack

pytestmark = pytest.mark.unit

EXACT = ("dp", "ilp")


def brute_force(values, weights, capacity) -> float:
    best = 0.0
    for r in range(len(values) + 1):
        for combo in itertools.combinations(range(len(values)), r):
            if sum(weights[i] for i in combo) <= capacity:
                best = max(best, sum(values[i] for i in combo))
    return best


CASES = [
    # values, weights, capacity, best value
    ((), (), 10, 0.0),
    ((5,), (3,), 2, 0.0),
    ((5,), (3,), 3, 5.0),
    ((60, 100, 120), (10, 20, 30), 50, 220.0),  # greedy by density takes 60+100 = 160
    ((1, 1, 1), (0, 0, 0), 0, 3.0),  # free items are always kept
    ((10, 7, 7), (10, 6, 6), 12, 14.0),
    ((3, 4, 5, 6), (2, 3, 4, 5), 5, 7.0),
]


@pytest.mark.parametrize("method", EXACT)
@pytest.mark.parametrize("values,weights,capacity,best", CASES)
def test_exact_solvers_on_case_table(method, values, weights, capacity, best):
    r = solve_knapsack(values, weights, capacity, method)
    assert r.value == pytest.approx(best)
    assert r.weight <= capacity
    assert r.method == method and r.solve_ms >= 0


@pytest.mark.parametrize("values,weights,capacity,best", CASES)
def test_greedy_is_feasible_and_never_better_than_optimal(values, weights, capacity, best):
    r = solve_knapsack(values, weights, capacity, "greedy")
    assert r.weight <= capacity and r.value <= best + 1e-9


def test_greedy_is_not_optimal_on_the_classic_case():
    assert solve_knapsack((60, 100, 120), (10, 20, 30), 50, "greedy").value == 160


@pytest.mark.parametrize("seed", range(40))
def test_exact_solvers_match_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    values = [rng.randint(0, 50) for _ in range(n)]
    weights = [rng.randint(0, 30) for _ in range(n)]
    capacity = rng.randint(0, sum(weights) + 1)
    best = brute_force(values, weights, capacity)
    for method in EXACT:
        r = solve_knapsack(values, weights, capacity, method)
        assert r.value == pytest.approx(best), method
        assert r.weight <= capacity


def test_dp_never_exceeds_capacity_with_large_weights():
    rng = random.Random(7)
    weights = [rng.randint(10_000, 5_000_000) for _ in range(30)]
    values = [rng.random() * 100 for _ in range(30)]
    capacity = sum(weights) // 3
    r = solve_knapsack(values, weights, capacity, "dp")
    assert r.weight <= capacity
    exact = solve_knapsack(values, weights, capacity, "ilp")
    assert r.value <= exact.value + 1e-6 and r.value >= 0.9 * exact.value


def test_bad_input():
    with pytest.raises(ValueError, match="knapsack method must be one of"):
        solve_knapsack([1], [1], 1, "magic")
    with pytest.raises(ValueError, match="1 values but 2 weights"):
        solve_knapsack([1], [1, 2], 1)
    with pytest.raises(ValueError, match="non-negative"):
        solve_knapsack([1], [-1], 1)
    assert set(KNAPSACK_SOLVERS) == {"greedy", "dp", "ilp"}
