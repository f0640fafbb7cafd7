"""The memory/recompute trade-off: saved bytes and estimated recompute for a list of budgets.

A sweep reuses the plan frontier solved when the function was compiled, so it costs no
recompilation; ``plot_tradeoff`` draws it (matplotlib, optional extra ``thunder-remat[plot]``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from thunder_remat.budget import parse_budget
from thunder_remat.whole_graph.planner import PlanSearch, build_frontier

__all__ = ["SweepPoint", "sweep_budgets", "plot_tradeoff", "frontier_of", "DEFAULT_SWEEP"]

DEFAULT_SWEEP = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0)


@dataclass(frozen=True)
class SweepPoint:
    budget: object
    target_bytes: int | None
    saved_bytes: int
    recompute_cost: float
    feasible: bool
    #: unit of recompute_cost: "flops" (estimated) or "us" (measured)
    unit: str = "flops"


def frontier_of(result):
    """The frontier of plans a whole-graph result chose from; for a result of budget 1.0, which
    needs none, one solved now (min cuts run here, on request, not when a record is read)."""
    if result.frontier is not None:
        return result.frontier
    return build_frontier(result.problem, result.solver)


def _frontier(source):
    """Accept a jitted function (after one call), a SavePassResult, or a Frontier (flops assumed)."""
    from thunder_remat.plugin import last_save_plan

    if hasattr(source, "plans") and hasattr(source, "fastest"):
        return source, "flops"
    result = source if hasattr(source, "choice") else last_save_plan(source)
    if result is None or result.choice is None:
        raise ValueError(
            "thunder_remat.sweep_budgets needs a function jitted with remat=True (and the whole-graph pass on) "
            "that has been called once, or a SavePassResult / Frontier"
        )
    return frontier_of(result), result.problem.cost_unit


def sweep_budgets(source, budgets=DEFAULT_SWEEP) -> list[SweepPoint]:
    """Saved bytes and estimated recompute of the plan each budget chooses from the frontier (it
    solves: min cuts for the budgets that fall between the frontier's plans, as the pass itself
    would). Below 1.0 the pass may instead take a plan nested within a lower-peak rewrite above it
    (``whole_graph.frontier_walk``; its ``choice.within`` is set), which saves less and recomputes
    more than this point: ``last_save_plan(fn).choice.plan`` is the plan taken."""
    frontier, unit = _frontier(source)
    points = []
    for b in budgets:
        choice = PlanSearch(frontier).choose(parse_budget(b))
        points.append(
            SweepPoint(b, choice.target_bytes, choice.plan.saved_bytes, choice.plan.recompute_cost, choice.feasible,
                       unit)
        )
    return points


def plot_tradeoff(points, path, *, chosen: SweepPoint | None = None, thunder_bytes: int | None = None,
                  title: str = "thunder_remat trade-off"):
    """Write a PNG of recompute (x) against saved bytes (y), one labelled point per budget.

    ``thunder_bytes``: the activation bytes Thunder without thunder_remat saves
    (``thunder_remat.plugin.thunder_alone_saved_bytes(jm)``), drawn as a dashed line. The points
    are also stored as JSON in the PNG's ``Description`` text chunk.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plot_tradeoff needs matplotlib: pip install 'thunder-remat[plot]'") from exc
    if not points:
        raise ValueError("plot_tradeoff needs at least one SweepPoint")
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [p.recompute_cost for p in points]
    ys = [p.saved_bytes for p in points]
    ax.plot(xs, ys, marker="o", linestyle="-", label="plan per budget")
    for p in points:
        ax.annotate(f"{p.budget}", (p.recompute_cost, p.saved_bytes), textcoords="offset points", xytext=(4, 4),
                    fontsize=7)
    if chosen is not None:
        ax.plot([chosen.recompute_cost], [chosen.saved_bytes], marker="*", markersize=14, color="red",
                linestyle="none", label=f"chosen ({chosen.budget})")
    if thunder_bytes is not None:
        ax.axhline(thunder_bytes, color="gray", linestyle="--", label=f"Thunder without thunder_remat ({thunder_bytes:,} B)")
    unit = {"us": "measured microseconds"}.get(points[0].unit, points[0].unit)
    ax.set_xlabel(f"estimated recompute ({unit})")
    ax.set_ylabel("saved activation bytes (storages)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    # The plotted points ride along in the PNG's text metadata, so a file can be checked (and
    # re-read) without image analysis.
    data = [{"budget": str(p.budget), "saved_bytes": p.saved_bytes, "recompute_cost": p.recompute_cost,
             "unit": p.unit, "feasible": p.feasible} for p in points]
    if chosen is not None:
        data.append({"budget": f"chosen {chosen.budget}", "saved_bytes": chosen.saved_bytes,
                     "recompute_cost": chosen.recompute_cost, "unit": chosen.unit, "feasible": chosen.feasible})
    if thunder_bytes is not None:
        data.append({"budget": "Thunder without thunder_remat", "saved_bytes": thunder_bytes})
    fig.savefig(path, format="png", metadata={"Description": json.dumps(data)})
    plt.close(fig)
    return path
