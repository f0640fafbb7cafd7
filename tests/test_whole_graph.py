"""The whole-graph pass end to end on the built-in models (light eager fusion executor).

At budgets 1.0, 0.5 and 0.0, with and without dropout: outputs bit-identical and gradients equal
to the same model compiled without thunder_remat; saved activation bytes (measured with
saved_tensors_hooks in a real forward) fall monotonically with the budget and never exceed the
plan; matmuls are never recomputed at 1.0; random ops never.
"""

from collections import Counter

import pytest
import thunder
import torch

import thunder_remat
from thunder_remat.executors.eager import eager_fusion_ex
from thunder_remat.inspect.tradeoff import frontier_of
from thunder_remat.whole_graph.planner import PlanSearch
from thunder_remat.models import build_model, example_batch
from thunder_remat.whole_graph.run import BudgetInfeasibleWarning
from helpers import joint_trace, most_copies_of_a_chained_op, train_built_in

pytestmark = pytest.mark.jit

BUDGETS = (1.0, 0.5, 0.0)


def train_step(name, dropout, **options):
    step = train_built_in(name, executors=[eager_fusion_ex], dropout=dropout, seed=1234, **options)
    return step.jitted, step.out, step.grads, step.saved


# Only the GPT model has dropout layers.
@pytest.fixture(scope="module", params=[("mlp", 0.0), ("gpt", 0.0), ("gpt", 0.1), ("llama", 0.0)], ids=str)
def runs(request):
    name, dropout = request.param
    base = train_step(name, dropout)
    by_budget = {b: train_step(name, dropout, remat=True, remat_memory_budget=b) for b in BUDGETS}
    return name, dropout, base, by_budget


@pytest.mark.slow
def test_outputs_bit_identical_and_gradients_equal(runs):
    _, _, (_, out0, grads0, _), by_budget = runs
    for b, (_, out, grads, _) in by_budget.items():
        assert torch.equal(out, out0), b
        for g, g0 in zip(grads, grads0):
            torch.testing.assert_close(g, g0, atol=1e-5, rtol=1e-4)


def test_gradients_equal_eager_pytorch_without_dropout(runs):
    name, dropout, _, by_budget = runs
    if dropout:
        pytest.skip("eager PyTorch draws different dropout masks than Thunder")
    model = build_model(name, "tiny")
    model(example_batch(model)).float().pow(2).mean().backward()
    for b, (_, _, grads, _) in by_budget.items():
        for g, p in zip(grads, model.parameters()):
            torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-4)


def test_saved_bytes_fall_with_the_budget_and_match_the_plan(runs):
    from thunder_remat.whole_graph.rewrite import MAX_CHEAP_COPIES

    name, _, (_, _, _, saved0), by_budget = runs
    measured = [by_budget[b][3].activation_bytes for b in BUDGETS]
    assert measured == sorted(measured, reverse=True), measured
    assert measured[0] <= saved0.activation_bytes
    for b in BUDGETS:
        jm, _, _, saved = by_budget[b]
        plan = thunder_remat.last_save_plan(jm)
        assert plan.failure is None and plan.choice.feasible
        assert saved.activation_bytes == plan.choice.plan.saved_bytes <= plan.choice.target_bytes
        # no op is copied into the backward more than the stated bound
        bound = max(MAX_CHEAP_COPIES, len(plan.checkpoint_levels) + 1)
        assert most_copies_of_a_chained_op(plan) <= bound


def recomputed_ops(jm) -> list[str]:
    plan = thunder_remat.last_save_plan(jm)
    ops = {op.index: op for op in plan.problem.ops}
    return [ops[i].op for i in plan.choice.plan.recomputed]


def test_matmuls_are_not_recomputed_at_full_budget_and_random_ops_never(runs):
    _, dropout, _, by_budget = runs
    assert not {"linear", "matmul"} & set(recomputed_ops(by_budget[1.0][0]))
    for b in BUDGETS:
        assert "uniform" not in recomputed_ops(by_budget[b][0])
    if dropout:
        ops = {op.op for op in thunder_remat.last_save_plan(by_budget[0.0][0]).problem.ops}
        assert "uniform" in ops


def test_recomputation_is_placed_in_the_backward_before_first_use(runs):
    _, _, _, by_budget = runs
    jm = by_budget[0.0][0]
    bw = thunder.last_backward_traces(jm)[-1]
    fw = thunder.last_traces(jm)[-1]
    assert any(p.name.startswith("rc_") for b in bw.bound_symbols for s in (b, *b.subsymbols) for p in s.flat_proxy_outs)
    assert not any(p.name.startswith("rc_") for b in fw.bound_symbols for p in b.flat_proxy_outs)


def test_provenance_names_the_budget():
    jm, *_ = train_step("mlp", 0.0, remat=True, remat_memory_budget=0.5)
    text = str(thunder.last_traces(jm)[-1].get_provenance())
    assert "whole-graph save planning" in text and "budget fraction 0.5" in text


def test_absolute_byte_budget_is_met():
    _, _, _, _ = base = train_step("gpt", 0.0, remat=True, remat_memory_budget=1.0)
    result = thunder_remat.last_save_plan(base[0])
    assert result.choice.frontier is None  # budget 1.0 needs one min cut, not the frontier
    frontier = frontier_of(result)  # solved on request: the result keeps none at 1.0
    assert frontier.fastest == result.choice.plan
    budget = (frontier.smallest.saved_bytes + frontier.fastest.saved_bytes) // 2
    jm, _, _, saved = train_step("gpt", 0.0, remat=True, remat_memory_budget=f"{budget}B")
    choice = thunder_remat.last_save_plan(jm).choice
    assert choice.feasible and choice.target_bytes == budget
    assert saved.activation_bytes <= budget


def test_infeasible_budget_warns_and_uses_the_smallest_plan():
    with pytest.warns(BudgetInfeasibleWarning, match="smallest plan"):
        jm, _, _, saved = train_step("gpt", 0.1, remat=True, remat_memory_budget="10B")
    choice = thunder_remat.last_save_plan(jm).choice
    assert not choice.feasible and choice.plan is choice.frontier.plans[0]
    assert saved.activation_bytes <= choice.plan.saved_bytes


@pytest.mark.parametrize("solver", ["greedy", "ilp"])  # "dp", the default, runs in every other test
def test_every_solver_gives_a_correct_plan(solver):
    base = train_step("mlp", 0.0)
    jm, out, grads, _ = train_step("mlp", 0.0, remat=True, remat_memory_budget=0.3, remat_solver=solver)
    assert torch.equal(out, base[1])
    for g, g0 in zip(grads, base[2]):
        torch.testing.assert_close(g, g0, atol=1e-5, rtol=1e-4)
    assert thunder_remat.last_save_plan(jm).choice.plan.saved_bytes <= thunder_remat.last_save_plan(jm).choice.target_bytes


def test_a_failing_solve_leaves_thunders_plan_and_warns(monkeypatch):
    import thunder_remat.whole_graph.run as wg

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(wg, "build_frontier", broken)
    monkeypatch.setattr(wg, "choose_fastest", broken)
    base = train_step("mlp", 0.0)
    with pytest.warns(UserWarning, match="whole-graph save planning failed.*injected"):
        jm, out, grads, saved = train_step("mlp", 0.0, remat=True)
    assert torch.equal(out, base[1])
    for g, g0 in zip(grads, base[2]):
        torch.testing.assert_close(g, g0, atol=1e-5, rtol=1e-4)
    assert thunder_remat.last_save_plan(jm).failure.startswith("RuntimeError")
    assert "save planning failed" in str(thunder.last_traces(jm)[-1].get_provenance())
    # the fusion-pair pass still ran on Thunder's plan
    assert saved.activation_bytes <= base[3].activation_bytes


def test_sweep_and_plot(tmp_path):
    jm, *_ = train_step("gpt", 0.1, remat=True, remat_memory_budget=0.5)
    points = thunder_remat.sweep_budgets(jm, [1.0, 0.7, 0.5, 0.3, 0.1, 0.0, "100B"])
    saved = [p.saved_bytes for p in points[:-1]]
    assert saved == sorted(saved, reverse=True)
    assert [p.recompute_cost for p in points[:-1]] == sorted(p.recompute_cost for p in points[:-1])
    assert points[2].saved_bytes == thunder_remat.last_save_plan(jm).choice.plan.saved_bytes
    assert not points[-1].feasible
    path = thunder_remat.plot_tradeoff(points, tmp_path / "tradeoff.png", chosen=points[2])
    import json

    import matplotlib.image
    from PIL import Image

    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    plotted = json.loads(Image.open(path).text["Description"])
    assert [(d["saved_bytes"], d["recompute_cost"]) for d in plotted[:-1]] == [
        (p.saved_bytes, p.recompute_cost) for p in points
    ]
    assert plotted[-1]["budget"] == "chosen 0.5" and plotted[-1]["saved_bytes"] == points[2].saved_bytes
    with pytest.raises(ValueError, match="needs a function jitted with remat=True"):
        thunder_remat.sweep_budgets(lambda x: x)


def test_checkpointed_regions_are_recomputed_not_saved():
    def block(x, w):
        return torch.tanh(torch.sin(x) @ w).exp()

    def f(x, w):
        return torch.utils.checkpoint.checkpoint(block, x, w, use_reentrant=False).sum(-1)

    def grads(**options):
        g = torch.Generator().manual_seed(0)
        x, w = torch.randn(4, 8, generator=g, requires_grad=True), torch.randn(8, 8, generator=g, requires_grad=True)
        jm = thunder.jit(f, executors=[eager_fusion_ex], **options)
        jm(x, w).sum().backward()
        return jm, (x.grad, w.grad)

    _, base = grads()
    jm, ours = grads(remat=True)
    for a, b in zip(ours, base):
        torch.testing.assert_close(a, b)
    problem = thunder_remat.last_save_plan(jm).problem
    forced = {op.op for op in problem.ops if op.force_recompute}
    assert {"sin", "matmul", "tanh"} <= forced
    matmul = next(op for op in problem.ops if op.op == "matmul")
    assert matmul.soft_ban is None  # the checkpoint overrules the matmul policy
    saved = thunder_remat.last_save_plan(jm).choice.plan.saved
    assert not {o for op in problem.ops if op.force_recompute for o in op.outputs} & set(saved)


def test_plot_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    point = thunder_remat.inspect.tradeoff.SweepPoint(1.0, 10, 10, 1.0, True)
    with pytest.raises(ImportError, match=r"thunder-remat\[plot\]"):
        thunder_remat.plot_tradeoff([point], tmp_path / "t.png")


def test_a_user_policy_is_respected():
    from dataclasses import dataclass

    from thunder_remat.policies import Verdict

    @dataclass(frozen=True)
    class KeepSoftmax:
        def judge(self, op):
            return Verdict("hard", "softmax kept") if "softmax" in op.op else None

    policies = (*thunder_remat.DEFAULT_POLICIES, KeepSoftmax())
    base = train_step("gpt", 0.0)
    jm, out, grads, _ = train_step("gpt", 0.0, remat=True, remat_memory_budget=0.0, remat_policies=policies)
    for g, g0 in zip(grads, base[2]):
        torch.testing.assert_close(g, g0, atol=1e-5, rtol=1e-4)
    assert not any("softmax" in op for op in recomputed_ops(jm))
    default = train_step("gpt", 0.0, remat=True, remat_memory_budget=0.0)[0]
    assert any("softmax" in op for op in recomputed_ops(default))
    reasons = {v.name: v.reason for v in thunder_remat.explain(jm).saved}
    assert "cannot be recomputed: softmax kept" in reasons.values()


def test_recompute_window_copies_only_cheap_ops_again_and_keeps_gradients():
    results = {}
    for window in (30, False):
        jm, out, grads, _ = train_step("gpt", 0.1, remat=True, remat_memory_budget=0.0, remat_recompute_window=window,
                                       remat_checkpoint_budget=False)
        results[window] = (thunder_remat.last_save_plan(jm), out, grads)
    once, windowed = results[False][0], results[30][0]
    assert sorted(once.copied_ops) == list(once.choice.plan.recomputed)
    assert windowed.choice.plan == once.choice.plan
    assert windowed.copies > once.copies
    assert windowed.rewritten_cost > once.rewritten_cost
    assert "copies made" in windowed.provenance() and "copies made" not in once.provenance()
    ops = {op.index: op for op in windowed.problem.ops}
    for i, n in Counter(windowed.copied_ops).items():
        assert n == 1 or (ops[i].soft_ban is None and ops[i].hard_ban is None), ops[i]
    assert torch.equal(results[30][1], results[False][1])
    for g, g0 in zip(results[30][2], results[False][2]):
        torch.testing.assert_close(g, g0, atol=1e-5, rtol=1e-4)


def test_below_the_checkpoint_budget_the_backward_recomputes_from_checkpoints():
    """Budget 0.0 with checkpoints from the 0.1 plan: those ops are copied once and held, other
    protected ops (matmuls) at most twice (for the checkpoints, then near their use); same numbers."""
    base = train_step("gpt", 0.1)
    jm, out, grads, saved = train_step("gpt", 0.1, remat=True, remat_memory_budget=0.0, remat_checkpoint_budget=0.1)
    result = thunder_remat.last_save_plan(jm)
    jm_plan = result.choice.plan
    anchor = PlanSearch(result.frontier).choose(("fraction", 0.1)).plan
    held = set(anchor.saved) - set(jm_plan.saved)
    ops = {op.index: op for op in result.problem.ops}
    assert result.checkpoint_ops == tuple(sorted(i for i in jm_plan.recomputed if held & set(ops[i].outputs)))
    assert result.checkpoint_ops and result.checkpoint_anchor == 0.1 and "checkpoint ops" in result.provenance()
    counts = Counter(result.copied_ops)
    assert all(counts[i] == 1 for i in result.checkpoint_ops)
    protected = [i for i in jm_plan.recomputed if ops[i].soft_ban is not None]
    assert all(counts[i] <= 2 for i in protected) and any(counts[i] == 2 for i in protected)
    assert saved.activation_bytes == jm_plan.saved_bytes  # the forward is the same plan's
    torch.testing.assert_close(out, base[1], atol=0, rtol=0)
    for g, g0 in zip(grads, base[2]):
        torch.testing.assert_close(g, g0, atol=1e-5, rtol=1e-4)
    # At the checkpoint budget itself, and with the option off, there are none.
    for options in ({"remat_memory_budget": 0.1, "remat_checkpoint_budget": 0.1},
                    {"remat_memory_budget": 0.0, "remat_checkpoint_budget": False}):
        jm = train_step("gpt", 0.1, remat=True, **options)[0]
        assert thunder_remat.last_save_plan(jm).checkpoint_ops == ()


def test_nested_checkpoints_recompute_the_outer_level_from_the_inner():
    """Budget 0.0 with checkpoints nested at 0.1 then 0.3: the 0.1 plan's values are copied once
    and held; the 0.3 plan's, first made on the way to them, are made again from them where the
    backward needs them (at most two copies); other matmuls at most three; same numbers."""
    import thunder_remat.whole_graph.checkpoints as wg

    base = train_step("gpt", 0.1)
    jm, out, grads, _ = train_step("gpt", 0.1, remat=True, remat_memory_budget=0.0,
                                   remat_checkpoint_budget=(0.3, 0.1))
    result = thunder_remat.last_save_plan(jm)
    inner, outer = (frozenset(level) for level in result.checkpoint_levels)
    anchors = PlanSearch(result.frontier).anchor_plans((0.1, 0.3))
    assert ((0.1, inner), (0.3, outer)) == wg.backward_checkpoints(result.problem, result.choice, (0.1, 0.3), anchors)
    assert result.checkpoint_anchors == (0.1, 0.3) and result.checkpoint_anchor == 0.1
    assert "anchored at budget 0.1, 0.3" in result.provenance()
    plans = [PlanSearch(result.frontier).choose(("fraction", f)).plan for f in (0.1, 0.3)]
    ops = {op.index: op for op in result.problem.ops}
    assert all(set(ops[i].outputs) & set(plans[0].saved) for i in inner)
    assert all(set(ops[i].outputs) & (set(plans[1].saved) - set(plans[0].saved)) for i in outer)
    counts = Counter(result.copied_ops)
    assert all(counts[i] == 1 for i in inner)
    assert all(counts[i] <= 2 for i in outer) and any(counts[i] == 2 for i in outer)
    others = [i for i in result.choice.plan.recomputed if ops[i].soft_ban is not None and i not in inner | outer]
    assert all(counts[i] <= 3 for i in others) and any(counts[i] == 3 for i in others)
    torch.testing.assert_close(out, base[1], atol=0, rtol=0)
    for g, g0 in zip(grads, base[2]):
        torch.testing.assert_close(g, g0, atol=1e-5, rtol=1e-4)


@pytest.mark.jit
@pytest.mark.parametrize("budget", [1.0, 0.0])
def test_the_estimate_cuts_the_regions_of_the_rewrite_as_the_split_will(budget):
    """The step-peak estimate of a schedule predicts the backward regions of the trace the schedule
    builds, cut where ``pairs.split`` will cut them: equal to the built trace's estimate, cuts
    included (tiny LLaMA, the light fusion executor, the pass's own checkpoint search). The cuts
    are the rewrite's: at 1.0 they free saved values early."""
    from thunder_remat.records import Timings
    from thunder_remat.whole_graph.checkpoints import AUTO_ANCHORS, checkpointed_schedule
    from thunder_remat.whole_graph.peak import estimate_peak_bytes, estimate_schedule_peak, predict_regions
    from thunder_remat.whole_graph.rewrite import build

    torch.manual_seed(0)
    model = build_model("llama", "tiny")
    trace, result = joint_trace(model, (example_batch(model),), executors=[eager_fusion_ex],
                                remat_memory_budget=budget)
    regions = predict_regions(trace, eager_fusion_ex.can_fuse)
    direct = checkpointed_schedule(trace, result.problem, result.choice, window=30, setting="auto",
                                   anchors=PlanSearch(result.frontier).anchor_plans(AUTO_ANCHORS) if result.frontier
                                   else None, timings=Timings(), regions=regions)
    built = build(direct.schedule)
    cut = estimate_peak_bytes(built, predict_regions(built, eager_fusion_ex.can_fuse))
    assert estimate_schedule_peak(direct.schedule, regions=regions) == cut
    assert direct.peak_estimate in (None, cut)  # None: no checkpoint search ran
    uncut = estimate_peak_bytes(built, predict_regions(built, eager_fusion_ex.can_fuse, split=False))
    assert cut < uncut


@pytest.mark.slow
def test_auto_checkpoints_take_the_anchor_with_the_lowest_estimated_peak(monkeypatch):
    """The default ("auto") estimates the step peak of the rewrite without checkpoints and with each
    anchor; the lowest (up to AUTO_TIE, the largest anchor winning ties) is nested with nearer
    anchors while each nesting lowers the estimate by AUTO_MIN_GAIN, and kept only if it is
    AUTO_MIN_GAIN below the estimate without checkpoints (1-layer GPT at 0.0, the stage run on
    the pass's joint trace). The pass itself walks the frontier down to the plan: its rewrite is
    never above the plan's own search."""
    import thunder_remat.whole_graph.checkpoints as wg

    from thunder_remat.records import Timings
    from thunder_remat.whole_graph.peak import estimate_peak_bytes, predict_regions
    from thunder_remat.whole_graph.rewrite import build

    torch.manual_seed(0)
    model = build_model("gpt", "tiny", dropout=0.1)
    # regions not cut here (test_the_estimate_cuts_the_regions_of_the_rewrite_as_the_split_will: cut)
    trace, result = joint_trace(model, (example_batch(model),), executors=[eager_fusion_ex], remat_memory_budget=0.0,
                                remat_split_regions=False)
    # the regions the eager fusion executor is expected to form, as the pass predicted them
    regions = predict_regions(trace, eager_fusion_ex.can_fuse, split=False)

    anchors = PlanSearch(result.frontier).anchor_plans(wg.AUTO_ANCHORS)

    def search():
        return wg.checkpointed_schedule(trace, result.problem, result.choice, window=30, setting="auto",
                                        anchors=anchors, timings=Timings(), regions=regions)

    direct = search()
    est, plain = direct.anchor_estimates, direct.peak_estimate_without_checkpoints
    assert plain is not None and len(est) >= 2
    assert all(chain == tuple(sorted(chain)) and set(chain) <= set(wg.AUTO_ANCHORS) for chain in est)
    singles = {chain[0]: peak for chain, peak in est.items() if len(chain) == 1
               and peak <= (1 - wg.AUTO_MIN_GAIN) * plain}
    lowest = min(singles.values())
    chosen = tuple(f for f, _ in direct.levels)
    assert len(chosen) >= 2  # on this model a nesting lowers the estimate: the path below is exercised
    # the tie among single anchors that gain enough goes to the largest (least recompute); nesting
    # adds nearer ones
    assert chosen[-1] == max(f for f, e in singles.items() if e <= (1 + wg.AUTO_TIE) * lowest)
    for k in range(len(chosen) - 1):
        assert est[chosen[k:]] <= (1 - wg.AUTO_MIN_GAIN) * est[chosen[k + 1:]]
    nearer = [chain for chain in est if len(chain) == len(chosen) + 1 and chain[1:] == chosen]
    assert all(est[chain] > (1 - wg.AUTO_MIN_GAIN) * est[chosen] for chain in nearer)
    # estimated from the schedule, without building it: the built trace's estimate is the same
    built = build(direct.schedule)
    assert direct.peak_estimate == est[chosen] \
        == estimate_peak_bytes(built, predict_regions(built, eager_fusion_ex.can_fuse, split=False)) \
        <= (1 - wg.AUTO_MIN_GAIN) * plain
    assert direct.levels == wg.backward_checkpoints(result.problem, result.choice, chosen, anchors)
    assert tuple(a for a, _ in direct.anchors) == chosen
    # the pass walked the frontier down to this plan: never above the plan's own search
    assert result.peak_estimate <= direct.peak_estimate and "est. step peak" in result.provenance()

    # A threshold just above the chosen rewrite's gain keeps the rewrite without checkpoints.
    monkeypatch.setattr(wg, "AUTO_MIN_GAIN", 1 - est[chosen] / plain + 0.01)
    direct = search()
    assert direct.levels == () and direct.peak_estimate == direct.peak_estimate_without_checkpoints == plain
    # Budget 1.0 recomputes no matmul and has no frontier: no checkpoint search runs; the plan's
    # estimate is the walk of its rewrite
    at_one = thunder_remat.last_save_plan(train_step("gpt", 0.1, remat=True)[0])
    assert at_one.peak_estimate_without_checkpoints is None and not at_one.anchor_estimates
    assert at_one.peak_estimate == at_one.peak_at.peak > 0 and "est. step peak" in at_one.provenance()


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_a_schedule_is_estimated_as_the_trace_it_builds(name):
    """"auto" estimates every candidate's step peak from its copy schedule, building only the one
    it keeps; each estimate the pass recorded equals the estimate of the trace its schedule builds
    (the schedules made again by the stage's own functions from the pass's records)."""
    import thunder_remat.whole_graph.checkpoints as wg
    from thunder_remat.plugin import last_joint_trace
    from thunder_remat.whole_graph.peak import estimate_peak_bytes, estimate_schedule_peak, predict_regions
    from thunder_remat.whole_graph.rewrite import build

    jm = train_step(name, None, remat=True, remat_memory_budget=0.0)[0]
    result = thunder_remat.last_save_plan(jm)
    trace, window = last_joint_trace(jm), thunder_remat.RematConfig().recompute_window
    regions = predict_regions(trace, eager_fusion_ex.can_fuse)  # the backward regions the pass modelled
    anchors = PlanSearch(result.frontier).anchor_plans(wg.AUTO_ANCHORS)
    # the chains of the pass's own anchors (a chain inherited from a plan that saves more, found
    # by the frontier walk, holds that plan's anchors instead)
    chains = {chain: peak for chain, peak in result.anchor_estimates.items() if set(chain) <= set(wg.AUTO_ANCHORS)}
    assert len(chains) >= 2
    for chain, recorded in chains.items():
        levels = wg.backward_checkpoints(result.problem, result.choice, chain, anchors)
        schedule = wg.copy_schedule(trace, result.problem, result.choice.plan, window, tuple(ops for _, ops in levels))
        built = build(schedule)
        assert estimate_schedule_peak(schedule) == estimate_peak_bytes(built), chain
        assert recorded == estimate_schedule_peak(schedule, regions=regions) \
            == estimate_peak_bytes(built, predict_regions(built, eager_fusion_ex.can_fuse)), chain


def test_a_dropped_copy_schedule_is_freed_without_a_garbage_collection():
    """The passes run with the cyclic collector paused, so "auto" can let go of a candidate's
    schedule only if nothing in it refers back to itself: dropped, it is freed at once."""
    import gc
    import weakref

    from thunder_remat.plugin import last_joint_trace
    from thunder_remat.whole_graph.rewrite import schedule_copies

    jm = train_step("gpt", None, remat=True, remat_memory_budget=0.0)[0]
    result = thunder_remat.last_save_plan(jm)
    recomputed = result.choice.plan.recomputed
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        schedule = schedule_copies(last_joint_trace(jm), recomputed, window=4, checkpoints=(frozenset(recomputed[:3]),))
        assert schedule.copies
        freed = weakref.ref(schedule)
        del schedule
        assert freed() is None
    finally:
        if was_enabled:
            gc.enable()
