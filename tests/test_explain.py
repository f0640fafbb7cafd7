"""explain(): report totals equal what a real forward saves; every saved value has a reason; draw()."""

import json
import re

import pytest
import thunder
import torch

import thunder_remat
from thunder_remat.executors.eager import eager_fusion_ex, make_eager_executor
from thunder_remat.inspect.measure import saved_for_backward
from thunder_remat.models import build_model, example_batch
from helpers import train_built_in

pytestmark = pytest.mark.jit


def jit_and_run(name, **options):
    step = train_built_in(name, executors=[eager_fusion_ex], dropout=0.1 if name == "gpt" else None, remat=True,
                          **options)
    return step.jitted, step.saved


@pytest.mark.parametrize("name,budget", [("gpt", 1.0), ("gpt", 0.3), ("llama", 0.5), ("mlp", 1.0)])
def test_report_totals_equal_the_bytes_really_saved(name, budget):
    jm, saved = jit_and_run(name, remat_memory_budget=budget)
    report = thunder_remat.explain(jm)
    assert report.activation_bytes == saved.activation_bytes
    assert report.activation_storages == saved.activation_count
    assert report.saved_bytes == saved.nbytes
    for v in report.saved:
        assert v.reason and v.nbytes >= 0
        if v.activation:
            assert v.op and not v.reason.startswith("input")
        else:
            assert v.reason.startswith("input")
    as_dict = json.loads(json.dumps(report.to_dict()))
    assert as_dict["activation_bytes"] == saved.activation_bytes
    text = str(report)
    assert "saved for backward" in text and f"{report.activation_bytes:,} B" in text


def test_random_values_are_explained_as_not_recomputable():
    jm, _ = jit_and_run("gpt", remat_memory_budget=0.0)
    reasons = [v.reason for v in thunder_remat.explain(jm).saved if v.activation]
    assert reasons and all("random op" in r or "minimum cut" in r for r in reasons)
    assert any("random op" in r for r in reasons)


def test_backward_checkpoints_and_repeated_recompute_are_reported():
    jm, _ = jit_and_run("gpt", remat_memory_budget=0.0, remat_checkpoint_budget=0.1)
    save, report = thunder_remat.last_save_plan(jm), thunder_remat.explain(jm)
    ops = {op.index: op for op in save.problem.ops}
    held = {name for i in save.checkpoint_ops for name in ops[i].outputs}
    assert held and {r.name for r in report.recomputed if r.where == "backward checkpoint"} == held
    assert report.rewritten_cost == save.rewritten_cost > report.recompute_cost
    assert "with the ops the backward runs more than once" in str(report)
    assert json.loads(json.dumps(report.to_dict()))["rewritten_cost"] == save.rewritten_cost
    # nested levels: the inner level's values are named as such
    jm, _ = jit_and_run("gpt", remat_memory_budget=0.0, remat_checkpoint_budget=(0.1, 0.2))
    save, report = thunder_remat.last_save_plan(jm), thunder_remat.explain(jm)
    outer, inner = ({name for i in level for name in ops[i].outputs} for level in save.checkpoint_levels)
    where = {r.name: r.where for r in report.recomputed}
    assert outer and inner and all(where[n] == "backward checkpoint" for n in outer)
    assert all(where[n] == "backward checkpoint, level 2 (made from level 1 where first needed)" for n in inner)


def test_draw_whole_graph_marks_the_cut(tmp_path):
    jm, _ = jit_and_run("mlp", remat_memory_budget=1.0)
    plan = thunder_remat.last_save_plan(jm).choice.plan
    dot = thunder_remat.draw(jm, path=tmp_path / "cut.dot")
    assert (tmp_path / "cut.dot").read_text() == dot
    red = [line for line in dot.splitlines() if 'color="red"' in line]
    saved_activations = [n for n in plan.saved if not thunder_remat.last_save_plan(jm).problem.values[n].is_input]
    assert len(red) >= len(saved_activations) >= 1
    for name in saved_activations:
        assert f'label="{name}:in"' in dot and f'label="{name}:out"' in dot
    assert "source" in dot and "sink" in dot and 'label="inf"' in dot


def test_draw_shows_the_chosen_plan_even_when_it_was_priced():
    from thunder_remat.whole_graph.planner import SaveNetworks
    from thunder_remat.solvers.maxflow import min_cut

    jm, _ = jit_and_run("gpt", remat_memory_budget=0.1)
    # a byte budget equal to a priced frontier plan's bytes chooses that plan
    priced = [p for p in thunder_remat.last_save_plan(jm).frontier.plans if p.price > 0 and p.saved_bytes > 0]
    jm, _ = jit_and_run("gpt", remat_memory_budget=priced[0].saved_bytes)
    result = thunder_remat.last_save_plan(jm)
    plan = result.choice.plan
    assert plan.price > 0 and plan.saved_bytes == priced[0].saved_bytes
    networks = SaveNetworks(result.problem)  # the plan again, from a one-off cut of the drawn network
    net = networks.network(plan.kept_bans, plan.price)
    assert networks.plan_from_cut(min_cut(net.network), plan.kept_bans, plan.price) == plan
    dot = thunder_remat.draw(jm)
    labels = dict(re.findall(r'^  (n\d+) \[label="([^"]*)"', dot, re.M))
    red = re.findall(r'^  (n\d+) -> (n\d+) \[[^\]]*color="red"', dot, re.M)
    saved_in_drawing = {labels[u][: -len(":in")] for u, v in red
                        if labels[u].endswith(":in") and labels[v] == labels[u][: -len(":in")] + ":out"}
    assert saved_in_drawing == set(plan.saved)
    assert "x recompute" in dot



def test_values_a_priced_plan_keeps_are_explained_by_its_price():
    jm, _ = jit_and_run("gpt", remat_memory_budget=0.8)  # the tiny GPT's plan at 0.8 is a priced cut
    result = thunder_remat.last_save_plan(jm)
    assert result.choice.plan.price > 0
    producer = result.problem.producer_of()
    report = thunder_remat.explain(jm)
    soft = [v for v in report.saved if v.name in producer and producer[v.name].soft_ban and not producer[v.name].hard_ban]
    assert soft and all("at the plan's price" in v.reason for v in soft)


def test_draw_a_fusion_pair():
    ex = make_eager_executor("remat_eager_draw", exclude=("torch.matmul", "linear", thunder.prims.PrimIDs.LINEAR,
                                                          thunder.prims.PrimIDs.MATMUL, "torch.nn.functional.linear"))
    model = build_model("mlp", "tiny")
    jm = thunder.jit(model, executors=[ex], remat=True, remat_whole_graph=False)
    jm(example_batch(model)).sum().backward()
    pairs = thunder_remat.last_pair_pass(jm).pairs
    assert pairs
    dot = thunder_remat.draw(jm, pair=0)
    assert f"cut {pairs[0].cut_value:g} B" in dot
    with pytest.raises(ValueError, match="pair must be an index or one of"):
        thunder_remat.draw(jm, pair="nope")


def test_render_without_graphviz_says_how_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_graphviz(name, *args, **kwargs):
        if name == "graphviz":
            raise ImportError("no graphviz")
        return real_import(name, *args, **kwargs)

    jm, _ = jit_and_run("mlp")
    monkeypatch.setattr(builtins, "__import__", no_graphviz)
    with pytest.raises(ImportError, match=r"thunder-remat\[draw\]"):
        thunder_remat.draw(jm, path=tmp_path / "cut.png")


def test_explain_needs_a_called_function():
    with pytest.raises(ValueError, match="called once"):
        thunder_remat.explain(thunder.jit(lambda x: x))


# --- one compilation described whole (issue 25) -------------------------------------------------

def _tanh_chain(x, w1, w2):
    return torch.tanh(torch.tanh(x @ w1) @ w2).pow(2).sum()


def _weights():
    torch.manual_seed(0)
    return torch.randn(32, 48, requires_grad=True), torch.randn(48, 48, requires_grad=True)


def _train(jm, rows, w1, w2):
    """One forward (measuring what autograd keeps) and backward of ``jm`` on ``rows`` rows."""
    out, saved = saved_for_backward(jm, torch.randn(rows, 32, requires_grad=True), w1, w2)
    out.backward()
    return saved.activation_bytes


def test_explain_with_default_executors_and_a_factory_op():
    """torch.full reads the default dtype and device from the jit call's cache info; the "before"
    figure fuses the joint trace again under the cache info of the compilation it describes."""
    def f(x):
        return (x * torch.full((4, 4), 2.0) + torch.ones(4, 4)).sin().sum()

    x = torch.randn(4, 4, requires_grad=True)
    out, alone = saved_for_backward(thunder.jit(f), x)
    out.backward()
    jm = thunder.jit(f, remat=True)
    out, ours = saved_for_backward(jm, x)
    out.backward()
    report = thunder_remat.explain(jm)
    assert report.activation_bytes_before == alone.activation_bytes > 0
    assert report.activation_bytes == ours.activation_bytes
    assert "without thunder_remat" in str(report)


def test_explain_and_the_plan_describe_the_compilation_that_last_ran():
    w1, w2 = _weights()
    alone = thunder.jit(_tanh_chain, executors=[eager_fusion_ex])
    jm = thunder.jit(_tanh_chain, executors=[eager_fusion_ex], remat=True, remat_memory_budget=0.5)
    alone_bytes = {rows: _train(alone, rows, w1, w2) for rows in (16, 64)}
    ours = {rows: _train(jm, rows, w1, w2) for rows in (16, 64)}
    assert alone_bytes[64] == 4 * alone_bytes[16]
    assert _train(jm, 16, w1, w2) == ours[16]  # a cache hit: the 16-row computation runs again
    report = thunder_remat.explain(jm)
    assert report.activation_bytes_before == alone_bytes[16]
    assert report.activation_bytes == ours[16]
    plan = thunder_remat.last_save_plan(jm)
    assert plan.choice.plan.saved_bytes == ours[16]
    assert (report.compilation, report.compilations, report.inference) == (0, 2, False)
    assert plan is thunder_remat.last_save_plan(jm, compilation=0) is not thunder_remat.last_save_plan(jm, compilation=1)
    assert plan.choice.plan.saved_bytes == ours[16]
    assert thunder_remat.plugin.last_joint_trace(jm) is thunder_remat.plugin.last_joint_trace(jm, compilation=0)
    assert thunder_remat.last_pair_pass(jm) is thunder_remat.last_pair_pass(jm, compilation=0)
    ops = {op.index: op for op in plan.problem.ops}
    assert {r.name for r in report.recomputed if r.where.startswith("backward")} == {
        name for i in plan.choice.plan.recomputed for name in ops[i].outputs}
    # the other compilation, asked for by its cache entry
    other = thunder_remat.explain(jm, compilation=1)
    assert (other.activation_bytes_before, other.activation_bytes) == (alone_bytes[64], ours[64])
    assert thunder_remat.plugin.thunder_alone_saved_bytes(jm, compilation=1) == alone_bytes[64]
    assert json.loads(json.dumps(report.to_dict()))["compilation"] == 0


def test_a_no_grad_call_is_reported_as_an_inference_compilation():
    w1, w2 = _weights()
    alone = thunder.jit(_tanh_chain, executors=[eager_fusion_ex])
    jm = thunder.jit(_tanh_chain, executors=[eager_fusion_ex], remat=True, remat_memory_budget=0.5)
    alone_bytes, ours = _train(alone, 16, w1, w2), _train(jm, 16, w1, w2)
    training = thunder_remat.last_save_plan(jm)
    with torch.no_grad():
        jm(torch.randn(16, 32), w1, w2)
    report = thunder_remat.explain(jm)
    assert report.saved == [] and report.activation_bytes_before == 0 and report.recomputed == [
        r for r in report.recomputed if not r.where.startswith("backward")]
    assert report.inference and report.compilation == 1 and report.training_compilations == [0]
    assert "inference compilation" in str(report) and "training compilations: 0" in str(report)
    assert thunder_remat.last_save_plan(jm) is None and thunder_remat.plugin.last_joint_trace(jm) is None
    assert thunder_remat.plugin.thunder_alone_saved_bytes(jm) is None
    assert thunder_remat.last_pair_pass(jm) is not thunder_remat.last_pair_pass(jm, compilation=0)
    # the training compilation, asked for by index, and again by default once it runs again
    for report in (thunder_remat.explain(jm, compilation=0), None):
        if report is None:
            assert _train(jm, 16, w1, w2) == ours
            report = thunder_remat.explain(jm)
            assert thunder_remat.last_save_plan(jm) is training
        assert not report.inference and report.compilation == 0
        assert (report.activation_bytes_before, report.activation_bytes) == (alone_bytes, ours)


def test_given_a_step_explain_reports_the_measured_peak_beside_the_estimate():
    """explain(jm, step=...) runs the step once under the allocator and reports its peak beside
    thunder_remat's estimate (default executors: no fusion region, where the estimate is exact to a
    few bytes), and where the estimated peak is and what is alive there."""
    torch.manual_seed(0)
    model = build_model("llama", "tiny")
    x = example_batch(model)
    jm = thunder.jit(model, remat=True, remat_memory_budget=0.0)
    jm(x).float().pow(2).mean().backward()

    def step():
        jm(x).float().pow(2).mean().backward()

    model.zero_grad(set_to_none=True)
    report = thunder_remat.explain(jm, step=step)
    estimate = thunder_remat.last_save_plan(jm).peak_estimate
    assert report.peak_estimate == estimate and report.peak_measured is not None
    assert abs(report.peak_measured - estimate) <= 64, (report.peak_measured, estimate)
    assert f"step peak: estimated {estimate:,} B; measured {report.peak_measured:,} B" in str(report)
    assert json.loads(json.dumps(report.to_dict()))["peak_measured"] == report.peak_measured
    assert thunder_remat.explain(jm).peak_measured is None
    # and what the estimate holds there, kind by kind, adding up to it
    at = report.peak_at
    assert at is thunder_remat.last_save_plan(jm).peak_at and at.peak == estimate and at.in_backward
    assert sum(at.by_kind.values()) == estimate and "saved for backward" not in at.by_kind  # 0.0 saves nothing
    assert f"at the estimated peak (backward op {at.position} of the joint trace, {at.op}): " in str(report)
    assert json.loads(json.dumps(report.to_dict()))["peak_at"]["by_kind"] == at.by_kind


def test_explain_prints_the_reasons_the_passes_recorded():
    """Every reason ``explain`` gives is the one recorded when the plan was chosen (a changed rule
    shows up without the report knowing it), and the pair pass's records say why too."""
    from dataclasses import dataclass

    from thunder_remat.policies import DEFAULT_POLICIES, Verdict

    @dataclass(frozen=True)
    class KeepSoftmax:
        def judge(self, op):
            return Verdict("hard", "softmax stays, says the test") if "softmax" in op.op else None

    jm, _ = jit_and_run("gpt", remat_memory_budget=0.0, remat_policies=(*DEFAULT_POLICIES, KeepSoftmax()))
    report, result = thunder_remat.explain(jm), thunder_remat.last_save_plan(jm)
    recorded = result.reasons
    activations = [v for v in report.saved if v.activation]
    assert activations and all(v.reason == recorded.saved[v.name] for v in activations if v.name in recorded.saved)
    assert any(v.reason == "cannot be recomputed: softmax stays, says the test" for v in activations)
    by_name = {name: i for i in result.choice.plan.recomputed for op in result.problem.ops if op.index == i
               for name in op.outputs}
    whole_graph = [r for r in report.recomputed if r.where.startswith("backward")]
    assert whole_graph and all(r.reason == recorded.recomputed[by_name[r.name]] for r in whole_graph)
    for r in report.recomputed:
        assert r.reason and f"{r.name} ({r.op}) in {r.where}: {r.reason}" in str(report)
