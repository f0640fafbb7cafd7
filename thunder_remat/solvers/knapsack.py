"""0/1 knapsack on plain lists: which values to keep saved when the memory budget is tight.

Item ``i`` has a ``weight`` (bytes it costs to keep saved) and a ``value`` (recompute time it saves
by being kept). A solver picks the items to keep so the kept weight fits ``capacity`` and the kept
value is as large as possible. No thunder import: the whole-graph pass hands plain numbers in.

* ``greedy``: by value per byte, then fills what still fits; fast, not always optimal.
* ``dp``: dynamic programming over weights rounded up to a grid of at most ``DP_GRID`` steps; exact
  when the weights are multiples of the grid step (always true for small integer inputs), and it
  never exceeds the capacity because weights are rounded up.
* ``ilp``: ``scipy.optimize.milp`` (optional dependency ``thunder-remat[ilp]``); exact.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["KNAPSACK_SOLVERS", "KnapsackResult", "solve_knapsack", "DP_GRID"]

KNAPSACK_SOLVERS = ("greedy", "dp", "ilp")
DP_GRID = 20_000


@dataclass(frozen=True)
class KnapsackResult:
    """The items to keep (indices, ascending), their total value and weight, and how it was solved."""

    kept: tuple[int, ...]
    value: float
    weight: float
    method: str
    solve_ms: float


def solve_knapsack(
    values: Sequence[float], weights: Sequence[float], capacity: float, method: str = "dp"
) -> KnapsackResult:
    if method not in KNAPSACK_SOLVERS:
        raise ValueError(f"knapsack method must be one of {list(KNAPSACK_SOLVERS)}, got {method!r}")
    if len(values) != len(weights):
        raise ValueError(f"knapsack: {len(values)} values but {len(weights)} weights")
    if any(w < 0 for w in weights) or any(v < 0 for v in values):
        raise ValueError("knapsack: values and weights must be non-negative")
    start = time.perf_counter()
    capacity = max(float(capacity), 0.0)
    solver = {"greedy": _greedy, "dp": _dynamic_programming, "ilp": _ilp}[method]
    kept = tuple(sorted(solver(list(values), list(weights), capacity)))
    return KnapsackResult(
        kept=kept,
        value=float(sum(values[i] for i in kept)),
        weight=float(sum(weights[i] for i in kept)),
        method=method,
        solve_ms=(time.perf_counter() - start) * 1e3,
    )


def _greedy(values, weights, capacity) -> list[int]:
    def density(i):
        return values[i] / weights[i] if weights[i] > 0 else math.inf

    order = sorted(range(len(values)), key=lambda i: (-density(i), weights[i], i))
    kept, used = [], 0.0
    for i in order:
        if used + weights[i] <= capacity:
            kept.append(i)
            used += weights[i]
    return kept


def _dynamic_programming(values, weights, capacity) -> list[int]:
    free = [i for i, w in enumerate(weights) if w == 0]
    items = [i for i, w in enumerate(weights) if w > 0 and w <= capacity]
    if not items:
        return free
    step = max(capacity / DP_GRID, 1.0) if capacity > DP_GRID else 1.0
    cap = int(math.floor(capacity / step + 1e-9))
    units = [int(math.ceil(weights[i] / step - 1e-9)) for i in items]
    best, scratch = np.zeros(cap + 1), np.empty(cap + 1)
    took = np.zeros((len(items), cap + 1), dtype=bool)
    for k, i in enumerate(items):
        u, v = units[k], values[i]
        # every capacity c >= u at once, from the previous row (the 0/1 recurrence)
        candidate = np.add(best[: cap + 1 - u], v, out=scratch[: cap + 1 - u])
        np.greater(candidate, best[u:], out=took[k, u:])
        np.maximum(best[u:], candidate, out=best[u:])  # candidate is a copy: no overlap
    kept, c = [], cap
    for k in range(len(items) - 1, -1, -1):
        if took[k, c]:
            kept.append(items[k])
            c -= units[k]
    return free + kept


def _ilp(values, weights, capacity) -> list[int]:
    try:
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError as exc:
        raise ImportError(
            "remat_solver='ilp' needs scipy: pip install 'thunder-remat[ilp]' (or use 'dp' or 'greedy')"
        ) from exc
    n = len(values)
    if n == 0:
        return []
    result = milp(
        c=-np.asarray(values, dtype=float),
        constraints=LinearConstraint(np.asarray([weights], dtype=float), -np.inf, capacity),
        integrality=np.ones(n),
        bounds=Bounds(0, 1),
    )
    if result.x is None:
        raise RuntimeError(f"knapsack ilp failed: {result.message}")
    return [i for i in range(n) if result.x[i] > 0.5]
