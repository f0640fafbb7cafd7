"""``thunder_remat.explain(jm)``: what the forward saves for backward, how many bytes, and why.

The saved values are read from the forward trace Thunder will run (``thunder.last_traces(jm)[-1]``
returns them as its second output), and counted in storages (a saved view keeps its base alive;
``thunder_remat.storage``), so the report's totals are what a real forward keeps. Each is
explained from the whole-graph plan and the fusion-pair records of the same compilation.

A jitted function has one compilation per cache entry (another input shape, a ``torch.no_grad``
call, ...). The report describes one of them, whole: by default the one whose computation last
ran, else ``explain(jm, compilation=i)``, the i-th entry of
``thunder.compile_stats(jm).interpreter_cache``. A compilation without a backward (an inference
one: a call under ``torch.no_grad``, or without inputs that require grad) saves nothing; its
report says so and lists the training compilations.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thunder_remat.pairs.run import PairRecord
    from thunder_remat.whole_graph.peak import PeakBreakdown

__all__ = ["SavedValue", "RecomputedValue", "RematReport", "explain"]


@dataclass(frozen=True)
class SavedValue:
    name: str
    shape: tuple
    dtype: str
    #: numel x itemsize of the value itself
    nbytes: int
    #: counted in the activation totals (False for inputs and parameters, which are held anyway)
    activation: bool
    op: str
    source: str
    reason: str
    #: the value owning the storage this one keeps alive (its own name unless it is a view)
    storage: str = ""
    #: bytes of that storage
    storage_bytes: int = 0


@dataclass(frozen=True)
class RecomputedValue:
    name: str
    op: str
    #: "backward" (whole-graph pass; "backward checkpoint" when held while the backward runs) or
    #: the consumer region that recomputes it (fusion-pair pass)
    where: str
    #: why, as the pass recorded it when it decided
    reason: str = ""


@dataclass
class RematReport:
    saved: list[SavedValue] = field(default_factory=list)
    recomputed: list[RecomputedValue] = field(default_factory=list)
    #: storage bytes of the activations Thunder without thunder_remat saves for the same joint trace
    #: (the same executors and Thunder's own fusion-pair pass, then its split)
    activation_bytes_before: int | None = None
    budget: str = ""
    budget_feasible: bool = True
    #: estimated cost of the whole-graph plan's recomputation, in ``recompute_unit``
    recompute_cost: float = 0.0
    #: "flops" (estimated from shapes) or "us" (measured, remat_cost_model="measured")
    recompute_unit: str = "flops"
    #: estimated cost of every copy the rewrite made (ops recomputed again for far uses count again)
    rewritten_cost: float = 0.0
    times_ms: dict = field(default_factory=dict)
    #: what the fusion-pair pass did with each pair of regions (its own records)
    pairs: list[PairRecord] = field(default_factory=list)
    #: the compilation described: its index in ``thunder.compile_stats(jm).interpreter_cache``
    #: (None when Thunder did not cache it)
    compilation: int | None = None
    #: how many compilations (cache entries) the function has
    compilations: int = 0
    #: the compilation has no backward (a call under ``torch.no_grad``): nothing is saved for backward
    inference: bool = False
    #: indexes of the compilations with a backward (pass one as ``explain(jm, compilation=i)``)
    training_compilations: list[int] = field(default_factory=list)
    #: the step's peak as thunder_remat estimated it (None: not estimated, e.g. at budget 1.0)
    peak_estimate: int | None = None
    #: the step's peak the allocator measured, when ``explain`` was given a step to run (bytes)
    peak_measured: int | None = None
    #: where the estimated peak is in the rewritten joint trace and what is alive there
    peak_at: PeakBreakdown | None = None
    #: the order the backward runs in (``remat_reorder_backward``): "trace" or a greedy order's name
    backward_order: str = "trace"

    @property
    def activation_bytes(self) -> int:
        """Storage bytes the saved activations keep alive (each storage once)."""
        return sum(dict((v.storage, v.storage_bytes) for v in self.saved if v.activation).values())

    @property
    def activation_storages(self) -> int:
        return len({v.storage for v in self.saved if v.activation})

    @property
    def saved_bytes(self) -> int:
        """Storage bytes of everything saved, inputs and parameters included."""
        return sum(dict((v.storage, v.storage_bytes) for v in self.saved).values())

    def to_dict(self) -> dict:
        return {
            "saved": [asdict(v) for v in self.saved],
            "recomputed": [asdict(v) for v in self.recomputed],
            "activation_bytes": self.activation_bytes,
            "activation_storages": self.activation_storages,
            "activation_bytes_before": self.activation_bytes_before,
            "saved_bytes": self.saved_bytes,
            "budget": self.budget,
            "budget_feasible": self.budget_feasible,
            "recompute_cost": self.recompute_cost,
            "recompute_unit": self.recompute_unit,
            "rewritten_cost": self.rewritten_cost,
            "times_ms": dict(self.times_ms),
            "pairs": [p.summary() for p in self.pairs],
            "compilation": self.compilation,
            "compilations": self.compilations,
            "inference": self.inference,
            "training_compilations": list(self.training_compilations),
            "peak_estimate": self.peak_estimate,
            "peak_measured": self.peak_measured,
            "peak_at": None if self.peak_at is None else asdict(self.peak_at),
            "backward_order": self.backward_order,
        }

    def __str__(self) -> str:
        lines = ["thunder_remat report"]
        if self.compilations > 1 and self.compilation is not None:
            lines[0] += (f", compilation {self.compilation} of {self.compilations} "
                         "(thunder_remat.explain(fn, compilation=i) for another)")
        if self.inference:
            others = ", ".join(map(str, self.training_compilations)) or "none"
            lines.append("  inference compilation (no backward: called under torch.no_grad or without inputs "
                         "that require grad), nothing saved for backward; training compilations: "
                         f"{others} (thunder_remat.explain(fn, compilation=i))")
        if self.budget:
            lines.append(f"  budget: {self.budget}{'' if self.budget_feasible else ' (infeasible: the smallest plan, or for a peak the lowest-peak plan, used)'}")
        before = "?" if self.activation_bytes_before is None else f"{self.activation_bytes_before:,}"
        lines.append(f"  activation bytes held for backward: {before} B without thunder_remat -> "
                     f"{self.activation_bytes:,} B ({sum(v.activation for v in self.saved)} tensors on "
                     f"{self.activation_storages} storages; {self.saved_bytes:,} B with parameters and inputs)")
        if self.recomputed:
            line = f"  estimated recompute: {self.recompute_cost:.3g} {self.recompute_unit}"
            if self.rewritten_cost > self.recompute_cost:
                line += f" ({self.rewritten_cost:.3g} with the ops the backward runs more than once)"
            lines.append(line)
        if self.peak_estimate is not None or self.peak_measured is not None:
            parts = []
            if self.peak_estimate is not None:
                parts.append(f"estimated {self.peak_estimate:,} B")
            if self.peak_measured is not None:
                parts.append(f"measured {self.peak_measured:,} B (the step given to explain, by the allocator)")
            lines.append("  step peak: " + "; ".join(parts))
        if self.peak_at is not None:
            largest = ", ".join(f"{name} {n:,} B ({kind})" for name, n, kind in self.peak_at.largest)
            lines.append(f"  at the estimated peak ({self.peak_at.where()}): {self.peak_at.kinds()}; "
                         f"largest: {largest}")
        if self.backward_order != "trace":
            lines.append(f"  backward run in the {self.backward_order!r} order (the lowest estimated step peak of "
                         "the trace's own and the greedy orders of whole_graph.reorder; remat_reorder_backward)")
        if self.times_ms:
            lines.append("  pass times: " + ", ".join(f"{k} {v:.1f} ms" for k, v in self.times_ms.items()))
        lines.append("  saved for backward:")
        width = max((len(v.name) for v in self.saved), default=4)
        if not self.saved:
            lines.append("    (nothing)")
        for v in sorted(self.saved, key=lambda v: (-v.nbytes, v.name)):
            shape = "x".join(str(d) for d in v.shape) or "scalar"
            where = f" at {v.source}" if v.source else ""
            view = f" (a view keeping {v.storage}'s {v.storage_bytes:,} B alive)" if v.storage != v.name else ""
            lines.append(f"    {v.name:<{width}} {shape:>14} {v.dtype:<14} {v.nbytes:>12,} B  {v.op}{where}: "
                         f"{v.reason}{view}")
        if self.recomputed:
            lines.append(f"  recomputed ({len(self.recomputed)}):")
            for r in self.recomputed:
                lines.append(f"    {r.name} ({r.op}) in {r.where}" + (f": {r.reason}" if r.reason else ""))
        for p in self.pairs:
            lines.append(f"  pair {p.producer} -> {p.consumer}: {p.status.value}, cut {p.cut_value:g} B, "
                         f"recomputes {len(p.recomputed)}")
        return "\n".join(lines)


def _times(pass_name: str, result) -> dict[str, float]:
    """Both passes' stages under the same names (each pass lists the stages it has)."""
    times = result.timings.as_dict()
    return {f"{pass_name} {stage}": times[stage] for stage in result.STAGES}


def explain(jitted, compilation: int | None = None, *, step=None, device="cpu") -> RematReport:
    """The report for the compilation of ``jitted`` whose computation last ran (call it once
    first), or for the ``compilation``-th entry of ``thunder.compile_stats(jitted).interpreter_cache``.

    ``step``: a function running one training step with ``jitted`` (set gradients to None first):
    it is run once under ``inspect.measure.allocator_step_peak`` on ``device`` and the report gives
    the measured step peak beside thunder_remat's estimate."""
    measured = None
    if step is not None:
        from thunder_remat.inspect.measure import allocator_step_peak

        measured = allocator_step_peak(step, device).peak_bytes
    from thunder.core.proxies import TensorProxy
    from thunder.core.pytree import tree_flatten

    from thunder_remat.cost import value_bytes
    from thunder_remat.executors.hooks.compile_stash import (compilations, computation_traces_of, is_inference,
                                                       last_index, training_compilations)
    from thunder_remat.plugin import last_pair_pass, last_save_plan, thunder_alone_saved_bytes
    from thunder_remat.storage import storage_map
    from thunder_remat.whole_graph.run import LOSS_OUTSIDE

    try:
        fw = computation_traces_of(jitted, compilation)[-1]
    except IndexError:
        raise
    except Exception as exc:
        raise ValueError("thunder_remat.explain needs a thunder.jit-ed function that has been called once") from exc
    save = last_save_plan(jitted, compilation=compilation)
    pairs = last_pair_pass(jitted, compilation=compilation)
    count = len(compilations(jitted))
    report = RematReport(
        compilation=(compilation % count) if compilation is not None else last_index(jitted),
        compilations=count,
        training_compilations=training_compilations(jitted),
        inference=is_inference(jitted, compilation),
        peak_measured=measured,
    )
    problem = plan = reasons = None
    producer = {}
    if save is not None and save.choice is not None:
        reasons = save.reasons
        problem, plan = save.problem, save.choice.plan
        producer = problem.producer_of()
        report.budget = "none" if save.budget is None else f"{save.budget[0]} {save.budget[1]:g}"
        if save.choice.target_bytes is not None:
            report.budget += f" = {save.choice.target_bytes:,} B"
        if save.peak_budget:
            report.budget = f"step peak at most {int(save.budget[1]):,} B, estimated {save.peak_estimate:,} B"
            if save.above_fastest:
                report.budget += " (room to spare: a plan saving more than 1.0 and recomputing less)"
            if save.loss_outside:
                report.budget += f"; {LOSS_OUTSIDE}"
        if save.nested_within:
            report.budget += f"; {save.nested_within}"
        report.budget_feasible = save.choice.feasible
        report.recompute_cost, report.recompute_unit = plan.recompute_cost, problem.cost_unit
        report.rewritten_cost = save.rewritten_cost
        report.peak_estimate = save.peak_estimate
        report.peak_at = save.peak_at
        report.backward_order = save.backward_order
        report.times_ms.update(_times("whole-graph", save))
        ops = {op.index: op for op in problem.ops}
        level_of = {i: k for k, level in enumerate(save.checkpoint_levels, start=1) for i in level}
        for i in plan.recomputed:
            k = level_of.get(i)
            where = ("backward" if k is None else "backward checkpoint" if k == 1
                     else f"backward checkpoint, level {k} (made from level {k - 1} where first needed)")
            for name in ops[i].outputs:
                report.recomputed.append(RecomputedValue(name, ops[i].op, where, reasons.recomputed.get(i, "")))

    args = {p.name for p in tree_flatten((fw.args, fw.kwargs))[0] if hasattr(p, "name")}
    # a training forward returns (outputs, saved for backward); an inference one its outputs only
    saved_out = () if report.inference else fw.output[1] if isinstance(fw.output, tuple) and len(fw.output) > 1 else ()
    flat, _ = tree_flatten(saved_out)
    # Storages from the forward trace itself: its names are the saved values' (Thunder's torch
    # executor renames the values of ops it claims, so the joint trace's names may differ)
    storages = storage_map(fw.bound_symbols, tree_flatten((fw.args, fw.kwargs))[0])
    report.activation_bytes_before = 0 if report.inference else thunder_alone_saved_bytes(jitted, compilation=compilation)
    seen = set()
    for p in flat:
        if not isinstance(p, TensorProxy) or p.name in seen:
            continue
        seen.add(p.name)
        owner = storages.owner_of(p.name)
        is_input = (p.name in args or owner in storages.held
                    or (problem is not None and p.name in problem.values and problem.values[p.name].is_input))
        op = producer.get(p.name)
        if is_input:
            reason = "input (held in memory anyway)"
        elif reasons is None:
            reason = "read by the backward (whole-graph pass off)"
        else:
            reason = reasons.saved.get(p.name, "saved by Thunder's split (not a value of the analysed forward)")
        report.saved.append(SavedValue(
            name=p.name, shape=tuple(int(d) if isinstance(d, int) else str(d) for d in p.shape),
            dtype=str(p.dtype).replace("thunder.dtypes.", ""), nbytes=value_bytes(p), activation=not is_input,
            op=op.op if op else "", source=op.source if op else "", reason=reason, storage=owner,
            storage_bytes=storages.owner_bytes.get(owner, value_bytes(p)),
        ))
    if pairs is not None:
        report.times_ms.update(_times("fusion pairs", pairs))
        for rec in pairs.pairs:
            report.pairs.append(rec)
            for name in rec.recomputed:
                report.recomputed.append(RecomputedValue(name, "", rec.consumer, rec.recompute_reason))
    return report
