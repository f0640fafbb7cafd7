"""explain(): report totals equal what a real forward saves; every saved value has a reason; draw()."""

import json
import re

import pytest
import thunder

import thunder_remat
from thunder_remat.executors.eager import eager_fusion_ex, make_eager_executor
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
    priced = [p for p in thunder_remat.last_save_plan(jm).frontier().plans if p.price > 0 and p.saved_bytes > 0]
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
