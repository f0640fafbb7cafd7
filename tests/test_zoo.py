"""Real model code (litgpt, transformers) through thunder_remat: gradients equal eager PyTorch and
the storages really saved are exactly the bytes the plan promised (benchmarks/zoo.py runs them all)."""

import gc
import warnings
from dataclasses import dataclass

import pytest

import thunder_remat
from thunder_remat.executors import fusion_executor_by_name
from thunder_remat.plugin import _collector_paused, thunder_alone_saved_bytes
from thunder_remat.policies import contraction_kind
from thunder_remat.records import PassStatus
from thunder_remat.whole_graph.run import BudgetInfeasibleWarning
from helpers import most_copies_of_a_chained_op
from model_zoo import ZOO, available, eager_gradients, run_zoo_model, same_gradients, zoo_model

pytestmark = pytest.mark.jit

PYTHIA, BERT, LLAMA = "litgpt pythia-14m", "transformers BERT", "transformers Llama"
#: the module fixtures (references, family sweeps) are keyed by these: each case's checks run in one
#: xdist worker, different cases in either (tests/conftest.py)
WORKER_GROUP_BY = ("name", "executor")


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
    """No forward op that reads a recomputed value is copied into the backward more often than this
    (whole_graph.rewrite)."""
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
        assert most_copies_of_a_chained_op(plan) <= copy_bound(plan)
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
    frontier = thunder_remat.last_save_plan(first.jitted).frontier
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


# The families issue 25 added (Gemma-2's sliding window, an encoder-decoder, ALiBi, shifted windows,
# learned positions from the mask, eval() mode, convolutions and batch norm). Each runs with the
# light executor at 1.0, 0.5 and 0.0 (one sweep per model and executor, shared by the checks below
# through a module fixture, so that each check passes or fails on its own); TORCH_COMPILE_FAMILIES
# also with Thunder's torch.compile executor: Inductor builds every region, minutes per compilation
# on 2 cores, so only OPT in eval() mode (the setup issue 25 saw fail with gradients taken).
GEMMA2, T5, BLOOM, OPT, OPT_EVAL = ("litgpt Gemma-2-2b", "transformers T5", "transformers BLOOM", "transformers OPT",
                                    "transformers OPT eval")
DISTILBERT, ROBERTA, SWIN, RESNET, CONVNEXT = ("transformers DistilBERT", "transformers RoBERTa", "transformers Swin",
                                               "transformers ResNet", "transformers ConvNeXt")
FAMILIES = (GEMMA2, T5, BLOOM, OPT, OPT_EVAL, DISTILBERT, ROBERTA, SWIN, RESNET, CONVNEXT)
#: T5 writes in place into values its backward recomputes: cutting its torch.compile regions
#: between such a value and the write gave wrong gradients once (CHANGELOG)
TORCH_COMPILE_FAMILIES = (OPT_EVAL, T5)
BUDGETS = (1.0, 0.5, 0.0)


@dataclass
class BudgetRun:
    """What one compilation of a zoo model at one budget did (the compiled model is not kept)."""

    status: PassStatus
    failure: str | None
    grads_equal: bool
    measured: int
    planned: int | None
    #: what Thunder's own pass saves on the same joint trace (at 1.0 only)
    alone: int | None
    copies_within_bound: bool
    #: each contraction (matmul, convolution, attention) the policies keep that the backward runs
    #: again (a contraction with a constant operand, Thunder's pooling, is a gather they leave)
    copied_contractions: list
    #: None when explain() ran, else its exception
    explain_error: Exception | None
    #: Thunder alone saves less than the fastest plan (its fusion pass recomputes convolutions in
    #: backward regions): the fraction scale's top is Thunder alone's figure
    capped: bool = False


@pytest.fixture(scope="module")
def family_sweeps():
    return {}


def _sweep(sweeps, references, name, executor) -> dict:
    """``name`` with ``executor`` at each of BUDGETS, once per module; a failure to compile or run is
    kept and raised again by every check that asks."""
    key = (name, executor)
    if key not in sweeps:
        try:
            sweeps[key] = _run_sweep(zoo_model(name), _reference(references, name), executor)
        except Exception as exc:
            sweeps[key] = exc
    if isinstance(sweeps[key], Exception):
        raise sweeps[key]
    return sweeps[key]


def _run_sweep(entry, ref, executor) -> dict:
    runs = {}
    for budget in BUDGETS:
        run = run_zoo_model(entry, [fusion_executor_by_name(executor)], "tiny", remat=True,
                            remat_memory_budget=budget)
        plan = thunder_remat.last_save_plan(run.jitted)
        ops = {op.index: op for op in plan.problem.ops} if plan.problem is not None else {}
        try:
            thunder_remat.explain(run.jitted)
            explain_error = None
        except Exception as exc:
            explain_error = exc
        runs[budget] = BudgetRun(
            status=plan.status, failure=plan.failure, grads_equal=same_gradients(ref, run.grads),
            measured=run.saved.activation_bytes,
            planned=plan.choice.plan.saved_bytes if plan.choice is not None else None,
            alone=thunder_alone_saved_bytes(run.jitted) if budget == 1.0 else None,
            copies_within_bound=most_copies_of_a_chained_op(plan) <= copy_bound(plan),
            copied_contractions=[ops[i].op for i in plan.copied_ops
                                 if contraction_kind(ops[i].op) and ops[i].soft_ban is not None],
            explain_error=explain_error, capped=plan.capped)
        del run
    return runs


# every sweep takes more than 30 s on 2 cores (three compilations); the first check of a case pays it.
# A model Thunder 0.2.6 alone cannot run with an executor (ZooModel.thunder_fails) is left out here
# and checked below to fail as recorded.
FAMILY_CASES = [pytest.param(name, executor, marks=[_needs(name), pytest.mark.slow]
                             + ([pytest.mark.inductor] if executor == "torchcompile" else []))
                for executor in ("eager", "torchcompile") for name in FAMILIES
                if (executor == "eager" or name in TORCH_COMPILE_FAMILIES)
                and zoo_model(name).thunder_error(executor) is None]


@pytest.mark.parametrize("name,executor", FAMILY_CASES)
def test_zoo_family_plan_never_fails(family_sweeps, references, name, executor):
    runs = _sweep(family_sweeps, references, name, executor)
    failed = {b: r.failure for b, r in runs.items() if r.status is PassStatus.FAILED or r.failure is not None}
    assert not failed, failed


@pytest.mark.parametrize("name,executor", FAMILY_CASES)
def test_zoo_family_trains_like_eager(family_sweeps, references, name, executor):
    runs = _sweep(family_sweeps, references, name, executor)
    assert [b for b, r in runs.items() if not r.grads_equal] == []


@pytest.mark.parametrize("name,executor", FAMILY_CASES)
def test_zoo_family_saves_what_its_plan_promised(family_sweeps, references, name, executor):
    runs = _sweep(family_sweeps, references, name, executor)
    assert {b: r.measured for b, r in runs.items()} == {b: r.planned for b, r in runs.items()}
    assert all(r.copies_within_bound for r in runs.values())


@pytest.mark.parametrize("name,executor", FAMILY_CASES)
def test_zoo_family_saves_no_more_than_thunder_alone_and_less_as_the_budget_falls(
        family_sweeps, references, name, executor):
    """At 1.0 no more than Thunder alone (where its fusion pass recomputes convolutions, 1.0 is
    capped at its figure: docs/whole-graph.md)."""
    runs = _sweep(family_sweeps, references, name, executor)
    fastest = runs[1.0]
    assert fastest.measured <= fastest.alone, (fastest.measured, fastest.alone)
    measured = [runs[b].measured for b in BUDGETS]
    assert measured == sorted(measured, reverse=True), measured


@pytest.mark.parametrize("name,executor", FAMILY_CASES)
def test_zoo_family_recomputes_no_contraction_at_the_fastest_budget(family_sweeps, references, name, executor):
    """At 1.0 (the fastest plan) no matmul, convolution or attention the policies keep runs again in
    the backward, unless Thunder alone saves less (its fusion pass recomputes them): then 1.0 is
    the fastest plan saving no more than Thunder alone, and only then may one run again."""
    runs = _sweep(family_sweeps, references, name, executor)
    assert runs[1.0].copied_contractions == [] or runs[1.0].capped, runs[1.0].copied_contractions


@pytest.mark.parametrize("name,executor", FAMILY_CASES)
def test_zoo_family_explain_runs(family_sweeps, references, name, executor):
    runs = _sweep(family_sweeps, references, name, executor)
    errors = {b: f"{type(r.explain_error).__name__}: {r.explain_error}" for b, r in runs.items()
              if r.explain_error is not None}
    assert not errors, errors


@pytest.mark.parametrize("name", [pytest.param(n, marks=_needs(n)) for n in FAMILIES
                                  if zoo_model(n).thunder_error("eager") is not None])
def test_zoo_models_thunder_alone_cannot_run_fail_as_recorded(name):
    """Thunder 0.2.6 itself fails on these (with or without thunder_remat), as the entry records:
    if a Thunder or transformers change lets them run, move them to the checks above."""
    entry = zoo_model(name)
    with pytest.raises(Exception) as raised:
        run_zoo_model(entry, [fusion_executor_by_name("eager")], "tiny")
    assert f"{raised.type.__name__}: {raised.value}".startswith(entry.thunder_error("eager"))


def test_the_zoo_names_its_models_and_rejects_unknown_ones():
    assert {e.family for e in ZOO} == {"litgpt", "transformers", "built-in"}
    assert sum(e.family == "litgpt" for e in ZOO) >= 5
    assert set(FAMILIES) <= {e.name for e in ZOO}
    with pytest.raises(ValueError, match="zoo model must be one of"):
        zoo_model("no such model")
    with pytest.raises(ValueError, match="zoo size must be one of"):
        zoo_model(PYTHIA).make("huge")


@_needs(PYTHIA)
def test_availability_is_known_after_a_litgpt_model_was_built():
    """litgpt is imported without its ``__init__``: it has no module spec afterwards."""
    zoo_model(PYTHIA).make("tiny")
    assert available(zoo_model(PYTHIA))


def _fresh_with_eager_gradients(entry, shape):
    """A zoo model at ``shape`` and its inputs, seeded, with the gradients of one eager step of
    another copy built the same way (the model returned has none)."""
    import torch

    def built():
        torch.manual_seed(0)
        return entry.build(shape), entry.inputs(shape, torch.Generator().manual_seed(1))

    model, inputs = built()
    entry.output(model(**inputs)).float().pow(2).mean().backward()
    reference = [p.grad for p in model.parameters()]
    return (*built(), reference)


@pytest.mark.inductor
@_needs(PYTHIA)
def test_a_concatenation_in_a_kept_order_region_peaks_no_higher_than_estimated():
    """Below the fastest plan a torch.compile region writes a concatenation as one kernel where the
    trace puts it (``KEEP_ORDER_OPTIONS``), as the estimate has it. pythia's backward concatenates
    the query, key and value gradients; written into slices of the output instead (Inductor's CPU
    default), the output was allocated with the first slice, early, and this step measured 416520 B
    against an estimate of 348160 B. Gradients equal eager."""
    import thunder
    import torch
    from thunder.executors.torch_compile import torch_compile_ex

    from model_zoo import ZooShape
    from thunder_remat.inspect.measure import allocator_step_peak

    entry = zoo_model(PYTHIA)
    shape = ZooShape(batch=2, tokens=32, width=64, layers=1)
    model, inputs, reference = _fresh_with_eager_gradients(entry, shape)
    jm = thunder.jit(model, executors=[torch_compile_ex], remat=True, remat_memory_budget=0.0)

    def step():
        entry.output(jm(**inputs)).float().pow(2).mean().backward()

    step()
    assert same_gradients([p.grad for p in model.parameters()], reference)
    model.zero_grad(set_to_none=True)
    peak = allocator_step_peak(step).peak_bytes
    estimate = thunder_remat.last_save_plan(jm).peak_estimate
    assert peak <= estimate, (peak, estimate)


@pytest.mark.inductor
@_needs(PYTHIA)
def test_the_rewrite_is_chosen_after_each_candidate_runs_its_backward_in_its_own_order():
    """The checkpoint search compares candidates in the trace's backward order; the backward is
    then reordered. pythia at 0.15 (64 tokens x 4, torch.compile regions): holding the rewrite
    above is estimated lowest before the reorder, but the rewrite without checkpoints, reordered,
    is lower still, and is the one built; its estimate is the walk of the trace built."""
    import thunder
    import torch
    from thunder.executors.torch_compile import torch_compile_ex

    from model_zoo import ZooShape
    from thunder_remat.plugin import expected_regions
    from thunder_remat.whole_graph.peak import estimate_peak_bytes

    entry = zoo_model(PYTHIA)
    shape = ZooShape(batch=4, tokens=64, width=64, layers=2)
    torch.manual_seed(0)
    model = entry.build(shape)
    jm = thunder.jit(model, executors=[torch_compile_ex], remat=True, remat_memory_budget=0.15)
    jm(**entry.inputs(shape, torch.Generator().manual_seed(1)))
    plan = thunder_remat.last_save_plan(jm)
    assert plan.checkpoint_ops == () and plan.backward_order != "trace"
    assert plan.peak_estimate < min(plan.anchor_estimates.values()) < plan.peak_estimate_without_checkpoints
    regions = expected_regions(plan.trace, [torch_compile_ex], plan=plan)
    assert estimate_peak_bytes(plan.trace, regions, plan.prologue) == plan.peak_estimate


GPTJ = "transformers GPT-J"  # outside the zoo (model_zoo.OUTSIDE): no other test tunes for it


@pytest.mark.jit
@_needs(GPTJ)
def test_no_budget_below_the_fastest_plan_is_estimated_above_it_once_the_backward_is_reordered(monkeypatch):
    """The frontier walk compares plans by estimates in the trace's order, and the backward's order
    is chosen after the plan. On GPT-J (2 layers, width 64, 16 tokens x 2, the default executors)
    the fastest plan's rewrite is the highest in the trace's order but falls most once reordered:
    without a second look, 0.5 was estimated (and measured) 5% above 1.0. A plan below the fastest
    now holds the fastest plan's rewrite where that is lower in the backward's own order: no budget
    is estimated above 1.0, the estimate is the walk of the trace built, the allocator measures it,
    and the gradients equal eager."""
    import thunder
    import torch

    import thunder_remat.whole_graph.run as whole_graph_run
    from helpers import joint_trace
    from model_zoo import ZooShape
    from thunder_remat.config import RematConfig
    from thunder_remat.inspect.measure import allocator_step_peak
    from thunder_remat.whole_graph.peak import estimate_peak_bytes
    from thunder_remat.whole_graph.run import plan_saved_values

    entry = zoo_model(GPTJ)
    shape = ZooShape(batch=2, tokens=16, width=64)
    model, inputs, reference = _fresh_with_eager_gradients(entry, shape)
    trace, _, jm = joint_trace(lambda kw: entry.output(model(**kw)), (inputs,), with_jitted=True,
                               remat_memory_budget=0.5)
    fastest = plan_saved_values(trace, RematConfig(memory_budget=1.0))
    top = estimate_peak_bytes(fastest.trace, prologue=fastest.prologue)
    results = {b: plan_saved_values(trace, RematConfig(memory_budget=b)) for b in (0.5, 0.15, 0.0)}
    for budget, result in results.items():
        assert result.peak_estimate <= top, (budget, result.peak_estimate, top)
        assert result.peak_estimate == estimate_peak_bytes(result.trace, prologue=result.prologue), budget
        assert result.choice.plan.saved_bytes <= result.choice.target_bytes, budget
    assert results[0.5].checkpoint_anchors == (1.0,)  # holds the fastest plan's rewrite
    monkeypatch.setattr(whole_graph_run, "_held_at_fastest", lambda rewrite, *args, **kwargs: rewrite)
    assert plan_saved_values(trace, RematConfig(memory_budget=0.5)).peak_estimate > 1.04 * top
    monkeypatch.undo()

    def step():
        entry.output(jm(inputs)).float().pow(2).mean().backward()

    model.zero_grad(set_to_none=True)
    step()
    assert same_gradients([p.grad for p in model.parameters()], reference)
    model.zero_grad(set_to_none=True)
    peak = allocator_step_peak(step).peak_bytes
    plan = thunder_remat.last_save_plan(jm)
    assert plan.peak_estimate == results[0.5].peak_estimate
    assert abs(peak - plan.peak_estimate) <= 64, (peak, plan.peak_estimate)
