"""The one options record of thunder_remat, validated once at the plugin boundary."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from thunder_remat.budget import Budget, parse_budget
from thunder_remat.policies import DEFAULT_POLICIES, check_policies
from thunder_remat.solvers.knapsack import KNAPSACK_SOLVERS

__all__ = ["RematConfig", "COMPILE_OPTIONS", "config_from_options", "option_name"]

_BOOLS = (True, False)
COST_MODELS = ("flops", "measured")


@dataclass(frozen=True)
class RematConfig:
    """What thunder_remat does for one compilation.

    Build it with keyword arguments or :func:`config_from_options`; both validate.
    """

    #: Master switch: with False nothing of thunder_remat runs and Thunder behaves as without the plugin.
    enabled: bool = True
    #: Run the producer/consumer fusion-pair pass (min cut per pair of fusion regions).
    fusion_pairs: bool = True
    #: Discount applied to the capacity of a producer *input* that the consumer would have to start
    #: reading: the tensor already lives in memory, passing it on only extends its lifetime.
    producer_input_discount: float = 0.5
    #: Run the whole-graph pass: a min cut over the joint trace chooses what the forward saves.
    whole_graph: bool = True
    #: Saved-activation budget for the whole-graph pass: a fraction in [0, 1] between the smallest
    #: plan (0.0) and the fastest (1.0), or bytes (int, or "2GiB"). See thunder_remat.budget.
    memory_budget: Any = 1.0
    #: Knapsack solver used when the budget is tight: "greedy", "dp" or "ilp" (scipy).
    solver: str = "dp"
    #: How the whole-graph pass prices recomputing an op: "flops" (estimated from shapes, free and
    #: deterministic) or "measured" (each distinct op timed once on its device; see docs/whole-graph.md).
    cost_model: str = "flops"
    #: Which forward ops may be recomputed (see thunder_remat.policies).
    policies: tuple = DEFAULT_POLICIES
    #: A recomputed pointwise value unread for more than this many backward ops is recomputed again
    #: where it is next needed instead of kept alive (lower peak, a little more recompute); False: off.
    recompute_window: Any = 30
    #: Backward checkpoints for plans that recompute matmuls: the values the plan at this budget
    #: fraction would save are recomputed once and held while the backward runs, the rest (matmuls
    #: too) again near its use. A tuple of fractions nests levels: the nearest anchor's values are
    #: held, the next one's recomputed from them where first needed. "auto": the anchor whose rewrite
    #: has the lowest estimated step peak, the nearest anchor nested under it if that is 2% lower
    #: again, used if 2% lower than without. Lower peak for up to ~2x recompute; needs the window.
    #: False: off.
    checkpoint_budget: Any = "auto"
    #: Cut backward fusion regions where the values they read from the forward can be freed early
    #: (a region holds what it reads until it returns; see thunder_remat.pairs.split).
    split_regions: bool = True
    #: Below the fastest plan, compile fusion regions so that the executor keeps the order the
    #: rewrite chose where it would otherwise move ops (torch.compile: no horizontal fusion, no
    #: reordering for locality or peak memory; they compute a value the plan computes again for a
    #: far reader with its first computation and hold it in between), unless the step-peak
    #: estimate walks the executor's own order lower for that plan. Regions with a convolution
    #: keep Inductor's order. False: the executor's own choices always.
    keep_plan_order: bool = True
    #: Run the backward in the order, of a few that compute the same values, with the lowest
    #: estimated step peak (the trace's own order included; see thunder_remat.whole_graph.reorder).
    reorder_backward: bool = True
    #: Check every rewritten trace with thunder_remat.verify; a rewrite that fails is undone (with a warning).
    verify: bool = True
    #: Under FSDP ZeRO-3, re-gather parameters in the backward instead of saving the gathered ones.
    fsdp_regather: bool = True
    #: Under FSDP ZeRO-3 with fsdp_regather: at most this many backward re-gathers in flight (int >= 1).
    fsdp_prefetch: int = 1

    def __post_init__(self) -> None:
        for name in ("enabled", "fusion_pairs", "whole_graph", "verify", "fsdp_regather", "split_regions",
                     "keep_plan_order", "reorder_backward"):
            _check_choice(name, getattr(self, name), _BOOLS)
        _check_choice("solver", self.solver, KNAPSACK_SOLVERS)
        _check_choice("cost_model", self.cost_model, COST_MODELS)
        n = self.fsdp_prefetch
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"thunder_remat option 'remat_fsdp_prefetch' must be an int >= 1, got {n!r}")
        w = self.recompute_window
        if not (w is False or (type(w) is int and w >= 1)):
            raise ValueError(
                f"thunder_remat option 'remat_recompute_window' must be an int >= 1 or False, got {w!r}"
            )
        c = self.checkpoint_budget
        if isinstance(c, (tuple, list)) and c and all(_is_fraction(f) for f in c):
            object.__setattr__(self, "checkpoint_budget", tuple(sorted({float(f) for f in c})))
        elif not (c is False or (isinstance(c, str) and c == "auto") or _is_fraction(c)):
            raise ValueError(
                "thunder_remat option 'remat_checkpoint_budget' must be 'auto', a fraction in [0, 1], "
                f"a non-empty tuple of fractions (nested levels) or False, got {c!r}"
            )
        parse_budget(self.memory_budget)
        object.__setattr__(self, "policies", check_policies(self.policies))
        d = self.producer_input_discount
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0.0 <= float(d) <= 1.0:
            raise ValueError(
                f"thunder_remat option 'remat_producer_input_discount' must be a number in [0, 1], got {d!r}"
            )


    @property
    def budget(self) -> Budget | None:
        """The parsed memory budget (None: no budget, the fastest plan)."""
        return parse_budget(self.memory_budget)


def _is_fraction(value: Any) -> bool:
    return type(value) in (int, float) and 0.0 <= value <= 1.0


def _check_choice(name: str, value: Any, allowed: tuple) -> None:
    if not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
        raise ValueError(
            f"thunder_remat option {option_name(name)!r} must be one of {list(allowed)}, got {value!r}"
        )


def option_name(field_name: str) -> str:
    """The compile option of a ``RematConfig`` field (``enabled`` is ``remat``)."""
    return "remat" if field_name == "enabled" else f"remat_{field_name}"


#: compile option name -> (config field, description shown by thunder.last_compile_options)
COMPILE_OPTIONS: dict[str, tuple[str, str]] = {
    option_name(f.name): (f.name, f"thunder_remat: {f.name.replace('_', ' ')}") for f in fields(RematConfig)
}
COMPILE_OPTIONS["remat"] = ("enabled", "thunder_remat: turn the rematerialization plugin on (True) or off (False)")


def config_from_options(base: RematConfig | None, options: dict[str, Any]) -> RematConfig:
    """Overlay compile options (``remat=...``, ``remat_*=...``) on ``base``.

    Options left at None keep the base value. Unknown ``remat_*`` names are rejected so a typo
    never silently does nothing.
    """
    base = base if base is not None else RematConfig(enabled=False)
    changes: dict[str, Any] = {}
    for option, value in options.items():
        if value is None:
            continue
        if option not in COMPILE_OPTIONS:
            raise ValueError(
                f"unknown thunder_remat option {option!r}; allowed options are {sorted(COMPILE_OPTIONS)}"
            )
        changes[COMPILE_OPTIONS[option][0]] = value
    return replace(base, **changes) if changes else base
