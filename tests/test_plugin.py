"""Turning the plugin on: compile option, transform, executor object, plugin name; option errors."""

import pytest
import thunder
import torch

import thunder_remat
from helpers import assert_same_numbers, last_pairs, run, train_built_in
from thunder_remat.config import RematConfig
from thunder_remat.executors.eager import eager_fusion_ex

pytestmark = pytest.mark.jit


def f(x, w):
    return torch.exp(torch.sin(x) * 2) @ w


def args():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 8, generator=g, requires_grad=True), torch.randn(8, 3, generator=g, requires_grad=True)


def test_compile_option_is_listed_as_used(capsys):
    r = run(f, args(), executors=[eager_fusion_ex], remat=True)
    last_pairs(r.jitted)
    thunder.last_compile_options(r.jitted)
    used = capsys.readouterr().out.split("Unused compile options")[0]
    assert "remat. thunder_remat" in used


def test_transform_and_executor_objects_turn_it_on():
    base = run(f, args(), executors=[eager_fusion_ex])
    r1 = run(f, args(), executors=[eager_fusion_ex], transforms=[thunder_remat.RematTransform()])
    r2 = run(f, args(), executors=[eager_fusion_ex, thunder_remat.RematFusionExecutor()])
    for r in (r1, r2):
        assert last_pairs(r.jitted) is not None
        plan = thunder_remat.last_save_plan(r.jitted)
        assert plan is not None and plan.failure is None and plan.choice.plan.recomputed
        assert_same_numbers(base, r)


def test_off_means_off():
    r = run(f, args(), executors=[eager_fusion_ex], transforms=[thunder_remat.RematTransform()], remat=False)
    assert thunder_remat.last_pair_pass(r.jitted) is None
    assert thunder_remat.last_save_plan(r.jitted) is None
    r = run(f, args(), executors=[eager_fusion_ex])
    assert thunder_remat.last_pair_pass(r.jitted) is None
    assert thunder_remat.last_save_plan(r.jitted) is None


def test_plugin_name_registered():
    import thunder.plugins

    assert thunder.plugins.get_plugin("remat") is thunder_remat.Remat
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    from thunder.recipes import BaseRecipe

    recipe = BaseRecipe(fuser="torch.compile")
    recipe.executor_names = []  # keep this CPU test light: only our eager fusion executor below
    recipe.setup_executors = lambda: [eager_fusion_ex]
    jm = thunder.compile(model, recipe=recipe, plugins="remat")
    x = torch.randn(2, 8)
    jm(x).sum().backward()
    assert last_pairs(jm).pairs


@pytest.mark.parametrize(
    "options, message",
    [
        ({"remat": "yes"}, "'remat' must be one of \\[True, False\\]"),
        ({"remat": True, "remat_fusion_pairs": 1}, "'remat_fusion_pairs' must be one of"),
        ({"remat": True, "remat_producer_input_discount": 2.0}, "number in \\[0, 1\\]"),
        ({"remat": True, "remat_memory_budget": -0.1}, "'remat_memory_budget' must be a fraction in \\[0, 1\\]"),
        ({"remat": True, "remat_memory_budget": 1.5}, "'remat_memory_budget' must be a fraction in \\[0, 1\\]"),
        ({"remat": True, "remat_memory_budget": "lots"}, "size string such as '2GiB'.*got 'lots'"),
        ({"remat": True, "remat_memory_budget": 1}, "ambiguous"),
        ({"remat": True, "remat_solver": "magic"}, "'remat_solver' must be one of \\['greedy', 'dp', 'ilp'\\]"),
        ({"remat": True, "remat_policies": "fast"}, "'remat_policies' must be a tuple of policies"),
        ({"remat": True, "remat_policies": (object(),)}, "has no judge"),
        ({"remat": True, "remat_whole_graph": "no"}, "'remat_whole_graph' must be one of"),
        ({"remat": True, "remat_fsdp_prefetch": 0}, "'remat_fsdp_prefetch' must be an int >= 1"),
        ({"remat": True, "remat_verify": 1}, "'remat_verify' must be one of"),
        ({"remat": True, "remat_keep_plan_order": "yes"}, "'remat_keep_plan_order' must be one of \\[True, False\\]"),
        ({"remat": True, "remat_reorder_backward": 1}, "'remat_reorder_backward' must be one of \\[True, False\\]"),
        ({"remat": True, "remat_recompute_window": 0}, "'remat_recompute_window' must be an int >= 1 or False"),
        ({"remat": True, "remat_recompute_window": True}, "'remat_recompute_window' must be an int >= 1 or False"),
        ({"remat": True, "remat_checkpoint_budget": 1.5}, "'remat_checkpoint_budget' must be 'auto', a fraction in"),
        ({"remat": True, "remat_checkpoint_budget": True}, "'remat_checkpoint_budget' must be 'auto', a fraction in"),
        ({"remat": True, "remat_checkpoint_budget": "sometimes"}, "'remat_checkpoint_budget' must be 'auto', a fraction in"),
        ({"remat": True, "remat_checkpoint_budget": ()}, "'remat_checkpoint_budget' must be .* tuple of fractions"),
        ({"remat": True, "remat_checkpoint_budget": (0.1, 1.5)}, "'remat_checkpoint_budget' must be .* tuple of fractions"),
        ({"remat": True, "remat_checkpoint_budget": [True]}, "'remat_checkpoint_budget' must be .* tuple of fractions"),
        ({"remat": True, "remat_cost_model": "timed"}, "'remat_cost_model' must be one of \\['flops', 'measured'\\]"),
    ],
)
def test_bad_compile_options_name_the_option(options, message):
    jm = thunder.jit(f, executors=[eager_fusion_ex], **options)
    with pytest.raises(ValueError, match=message):
        jm(*args())


def test_nested_checkpoint_budgets_are_kept_sorted():
    assert RematConfig(checkpoint_budget=[0.2, 0.1, 0.2]).checkpoint_budget == (0.1, 0.2)
    assert RematConfig(checkpoint_budget=0.3).checkpoint_budget == 0.3


def test_bad_plugin_arguments():
    with pytest.raises(ValueError, match="unknown thunder_remat option 'remat_budgett'"):
        thunder_remat.Remat(budgett=1)
    with pytest.raises(TypeError, match="RematConfig"):
        thunder_remat.RematTransform(config={"enabled": True})
    with pytest.raises(ValueError, match="'remat' must be one of"):
        RematConfig(enabled=None)


@pytest.mark.parametrize(
    "value,expected",
    [
        (0.5, ("fraction", 0.5)),
        ("50%", ("fraction", 0.5)),
        (0.0, ("fraction", 0.0)),
        (4096, ("bytes", 4096.0)),
        ("2GiB", ("bytes", 2.0 * 2**30)),
        ("1.5 MB", ("bytes", 1.5e6)),
        ("100B", ("bytes", 100.0)),
        ("0B", ("bytes", 0.0)),
        ("peak:6GiB", ("peak", 6.0 * 2**30)),
        ("PEAK: 1.5MB", ("peak", 1.5e6)),
        (None, None),
    ],
)
def test_budget_forms(value, expected):
    assert RematConfig(memory_budget=value).budget == expected


@pytest.mark.parametrize("value", ["peak:", "peak:12", "peak:0.5", "peak:-3MB", "peak:6 GiBs"])
def test_a_bad_peak_budget_names_the_option_and_the_forms(value):
    with pytest.raises(ValueError, match="remat_memory_budget.*'peak:6GiB'"):
        RematConfig(memory_budget=value)


def test_policies_compose_and_are_validated():
    strict = (thunder_remat.NeverRecomputeRandom(), thunder_remat.NeverRecomputeMatmul(hard=True))
    config = RematConfig(policies=list(strict))
    assert config.policies == strict and hash(config)
    with pytest.raises(ValueError, match="not hashable"):

        class Unhashable:
            __hash__ = None

            def judge(self, op):
                return None

        RematConfig(policies=(Unhashable(),))


def test_both_passes_run_with_the_garbage_collector_paused_and_restore_it():
    """A policy sees every op both passes judge: each saw the collector paused, and it runs again
    after the passes."""
    import gc

    import thunder_remat.plugin as plugin
    from thunder_remat.pairs.run import PairStatus

    class Witness:
        """Judges nothing; notes whether the collector ran while it was asked."""

        def __init__(self):
            self.collector_on = []

        def judge(self, op):
            self.collector_on.append(gc.isenabled())
            return None

        def __hash__(self):
            return id(self)

    assert gc.isenabled()
    # the whole-graph pass judges each forward op once
    whole_graph = Witness()
    r = run(f, args(), executors=[eager_fusion_ex], remat=True, remat_policies=(whole_graph,))
    assert len(whole_graph.collector_on) == len(thunder_remat.last_save_plan(r.jitted).problem.ops) > 0
    # alone (a pair's consumer reads nothing the save plan placed), the pair pass judges each producer op
    pairs = Witness()
    step = train_built_in("mlp", executors=[eager_fusion_ex], remat=True, remat_whole_graph=False,
                          remat_policies=(pairs,))
    assert [p.status for p in last_pairs(step.jitted).pairs] == [PairStatus.REWRITTEN] and pairs.collector_on
    assert not any(whole_graph.collector_on + pairs.collector_on) and gc.isenabled()
    gc.disable()
    try:
        with pytest.raises(RuntimeError), plugin._collector_paused():
            raise RuntimeError
        assert not gc.isenabled()  # a collector the caller paused stays paused
    finally:
        gc.enable()
