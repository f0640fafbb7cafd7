"""The result record both passes return (a status, why a pass failed, where its time went), and
the session record of one compilation that both passes read.

``explain()``, the notebook and the tests read the whole-graph result (``SavePassResult``) and
the fusion-pair result (``PairPassResult``) through these same fields.
"""

from __future__ import annotations

import enum
import time
from typing import ClassVar
from dataclasses import dataclass, field, fields

__all__ = ["PassStatus", "Timings", "PassResult", "RematSession"]


class PassStatus(enum.Enum):
    #: the pass changed the trace
    REWRITTEN = "rewritten"
    #: the pass ran and found nothing to change (or was not asked to change anything)
    UNCHANGED = "unchanged"
    #: the pass gave up; the trace is the one Thunder made (``failure`` says why)
    FAILED = "failed"


@dataclass
class Timings:
    """Milliseconds per stage; they add up to the pass (a stage a pass does not have stays 0).

    analysis: reading the trace into a problem; solve: every min cut and knapsack, wherever it
    runs; rewrite: building the new trace (and verifying it); estimate: the step-peak estimates of
    "auto" checkpoints; reemit: rebuilding changed fusion regions through their executors.
    """

    analysis_ms: float = 0.0
    solve_ms: float = 0.0
    rewrite_ms: float = 0.0
    estimate_ms: float = 0.0
    reemit_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def stage(self, name: str) -> _Stage:
        """A context manager adding the time spent in its block to ``<name>_ms``."""
        if name not in _STAGE_NAMES:
            raise ValueError(f"Timings has no stage {name!r}; stages are {sorted(_STAGE_NAMES)}")
        return _Stage(self, f"{name}_ms")

    def as_dict(self) -> dict[str, float]:
        """Stage name -> milliseconds, every stage."""
        return {f.name.removesuffix("_ms"): getattr(self, f.name) for f in fields(self)}


_STAGE_NAMES = frozenset(f.name.removesuffix("_ms") for f in fields(Timings))


class _Stage:
    def __init__(self, timings: Timings, attribute: str) -> None:
        self.timings, self.attribute = timings, attribute

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        elapsed = (time.perf_counter() - self.start) * 1e3
        setattr(self.timings, self.attribute, getattr(self.timings, self.attribute) + elapsed)


@dataclass
class PassResult:
    """What one pass did to one trace."""

    #: the stages of ``Timings`` this pass has, in order
    STAGES: ClassVar[tuple[str, ...]] = ("analysis", "solve", "rewrite")

    trace: object
    status: PassStatus = PassStatus.UNCHANGED
    #: why the pass failed (``status`` FAILED), else None
    failure: str | None = None
    timings: Timings = field(default_factory=Timings)

    def fail(self, trace, reason: str) -> None:
        """Give up: keep ``trace`` (the one Thunder made) and say why."""
        self.trace, self.status, self.failure = trace, PassStatus.FAILED, reason


@dataclass(frozen=True)
class RematSession:
    """One compilation as both passes see it, kept with the compilation (``compile_stash``).

    The plugin makes it before the whole-graph pass and completes it with what that pass decided;
    the fusion-pair pass, which runs later on the fused trace, reads it.
    """

    #: the compilation runs under FSDP ZeRO-3 (parameters are re-gathered in the backward)
    zero3: bool = False
    #: the whole-graph pass chose what the forward saves, and its rewrite was kept: pairs from a
    #: forward region into a backward region must hand over exactly the plan's values
    saved_set_planned: bool = False
    #: that plan is below the fastest (a fraction under 1.0 or a peak budget): it also placed where
    #: the backward computes each value and was chosen by its estimated peak with the backward's
    #: regions as they are, so pairs between backward regions are left as they are
    planned_below_fastest: bool = False
    #: the regions run in the rewritten order (the plan's ``SavePassResult.plan_order_kept``)
    plan_order_kept: bool = False
    #: names the rewritten backward makes when it starts (checkpoints made early: the plan's
    #: ``SavePassResult.prologue``): a backward region is cut after the last of them, so that
    #: the regions after hold them as inputs, as they would hold the saved values they stand for
    prologue: frozenset[str] = frozenset()
    #: backward regions running a convolution are cut before their first gradient convolution
    #: (the plan's ``SavePassResult.cut_before_gradient_convolutions``)
    cut_before_gradient_convolutions: bool = False
