"""Real model code (litgpt, transformers) through thunder_remat: gradients equal eager PyTorch and
the storages really saved are exactly the bytes the plan promised (benchmarks/zoo.py runs them all)."""

import gc
import warnings
from collections import Counter

import pytest

import thunder_remat
from thunder_remat.executors import fusion_executor_by_name
from thunder_remat.plugin import _collector_paused, thunder_alone_saved_bytes
from thunder_remat.whole_graph.run import BudgetInfeasibleWarning
from thunder_remat.zoo import ZOO, available, eager_gradients, run_zoo_model, same_gradients, zoo_model

pytestmark = pytest.mark.jit

PYTHIA, BERT, LLAMA = "litgpt pythia-14m", "transformers BERT", "transformers Llama"


@pytest.fixture(autouse=True)
def no_collection_while_tracing():
    """Once torch._dynamo is imported (earlier tests use torch.compile), it tags every module built
    in a weak-keyed dict, and Thunder 0.2.6's interpreter iterates that dict when a traced forward
    builds a module (transformers' Llama does): a garbage collection in between drops an entry and
    the trace fails with "dictionary changed size during iteration" (seen once in a full run; the
    test alone passes). Collected first, then paused for the test: a third-party race, not ours."""
    gc.collect()
    with _collector_paused():
        yield


def copy_bound(plan) -> int:
    """No forward op is copied into the backward more often than this (whole_graph.rewrite)."""
    from thunder_remat.whole_graph.rewrite import MAX_CHEAP_COPIES

    return max(MAX_CHEAP_COPIES, len(plan.checkpoint_levels) + 1)


def _needs(name):
    return pytest.mark.skipif(not available(zoo_model(name)), reason=f"{zoo_model(name).requires} is not installed")


@pytest.fixture(scope="module")
def references():
    return {}


def _reference(references, name):
    if name not in references:
        references[name] = eager_gradients(zoo_model(name), "tiny")
    return references[name]


CASES = [(name, executor) for name in (PYTHIA, BERT, LLAMA) for executor in ("eager", "torchcompile")
         if not (name == BERT and executor == "torchcompile")]


@pytest.mark.slow
@pytest.mark.parametrize("name,executor", [pytest.param(n, e, marks=_needs(n)) for n, e in CASES])
def test_zoo_model_saves_what_its_plan_promised_and_trains_like_eager(references, name, executor):
    entry, ref = zoo_model(name), _reference(references, name)
    executors = [fusion_executor_by_name(executor)]
    measured = []
    for budget in (1.0, 0.5, 0.0):
        run = run_zoo_model(entry, executors, "tiny", remat=True, remat_memory_budget=budget)
        plan = thunder_remat.last_save_plan(run.jitted)
        assert plan.failure is None, plan.failure
        assert same_gradients(ref, run.grads), (name, executor, budget)
        assert run.saved.activation_bytes == plan.choice.plan.saved_bytes, (name, executor, budget)
        assert max(Counter(plan.copied_ops).values(), default=0) <= copy_bound(plan)
        measured.append(run.saved.activation_bytes)
        if budget == 1.0:
            # never more than Thunder's own pass, on the same joint trace
            assert run.saved.activation_bytes <= thunder_alone_saved_bytes(run.jitted)
    assert measured == sorted(measured, reverse=True)


@_needs(PYTHIA)
def test_what_thunder_alone_saves_is_what_it_really_saves():
    """The static figure (explain()'s "before") equals a measured run without thunder_remat; on
    litgpt's Pythia (fused qkv split into heads) it is the figure thunder_remat must not exceed."""
    entry = zoo_model(PYTHIA)
    executors = [fusion_executor_by_name("eager")]
    alone = run_zoo_model(entry, executors, "tiny")
    ours = run_zoo_model(entry, executors, "tiny", remat=True)
    assert thunder_alone_saved_bytes(ours.jitted) == alone.saved.activation_bytes
    assert thunder_remat.explain(ours.jitted).activation_bytes_before == alone.saved.activation_bytes
    assert ours.saved.activation_bytes <= alone.saved.activation_bytes


@_needs(LLAMA)
def test_byte_budgets_are_never_exceeded_in_storage_bytes():
    entry = zoo_model(LLAMA)
    executors = [fusion_executor_by_name("eager")]
    first = run_zoo_model(entry, executors, "tiny", remat=True, remat_memory_budget=0.5)
    frontier = thunder_remat.last_save_plan(first.jitted).frontier()
    low, high = frontier.smallest.saved_bytes, frontier.fastest.saved_bytes
    assert low < high
    limits = [low + (high - low) // 3, low + 2 * (high - low) // 3] + ([low - 1] if low > 0 else [])
    for limit in limits:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run = run_zoo_model(entry, executors, "tiny", remat=True, remat_memory_budget=f"{limit}B")
        plan = thunder_remat.last_save_plan(run.jitted)
        infeasible = any(issubclass(w.category, BudgetInfeasibleWarning) for w in caught)
        assert run.saved.activation_bytes == plan.choice.plan.saved_bytes
        if limit >= low:
            assert not infeasible and run.saved.activation_bytes <= limit
        else:  # below the smallest plan: a warning, and the smallest plan
            assert infeasible and run.saved.activation_bytes == low


def test_the_zoo_names_its_models_and_rejects_unknown_ones():
    assert {e.family for e in ZOO} == {"litgpt", "transformers", "built-in"}
    assert sum(e.family == "litgpt" for e in ZOO) >= 4
    with pytest.raises(ValueError, match="zoo model must be one of"):
        zoo_model("resnet")
    with pytest.raises(ValueError, match="zoo size must be one of"):
        zoo_model(PYTHIA).make("huge")


@_needs(PYTHIA)
def test_availability_is_known_after_a_litgpt_model_was_built():
    """litgpt is imported without its ``__init__``: it has no module spec afterwards."""
    zoo_model(PYTHIA).make("tiny")
    assert available(zoo_model(PYTHIA))
