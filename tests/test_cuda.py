"""The whole-graph pass on a CUDA GPU with Thunder's sdpa and torch.compile executors (Triton there).

Runs only where CUDA exists (not on the CPU CI machine). ``REMAT_DEVICE_TESTS=cpu`` runs the same
tests on the CPU, which is how they are checked without a GPU. At budgets 1.0, 0.5 and 0.0, with
and without dropout: outputs and gradients equal to Thunder without thunder_remat (same seed;
Inductor may round re-emitted regions differently, so not bit for bit); saved bytes falling with
the budget and within the plan; and the measured cost model times ops with CUDA events (costs in
microseconds).
"""

import os

import pytest
import torch

DEVICE = os.environ.get("REMAT_DEVICE_TESTS", "cuda")
pytestmark = [pytest.mark.jit, pytest.mark.inductor, pytest.mark.skipif(
    DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU (REMAT_DEVICE_TESTS=cpu runs it on CPU)"
)]
BUDGETS = (1.0, 0.5, 0.0)


def train_step(name, dropout, **options):
    import thunder
    from thunder.executors.torch_compile import torch_compile_ex

    from thunder_remat.inspect.measure import saved_for_backward
    from thunder_remat.models import build_model, example_batch

    model = build_model(name, "tiny", dropout=dropout).to(DEVICE)
    x = example_batch(model).to(DEVICE)
    # On a GPU, attention goes through Thunder's sdpa executor, as with Thunder's default executors.
    executors = [thunder.get_executor("sdpa")] if DEVICE == "cuda" else []
    jm = thunder.jit(model, executors=[*executors, torch_compile_ex], **options)
    torch.manual_seed(1234)
    out, saved = saved_for_backward(jm, x)
    out.float().pow(2).mean().backward()
    return jm, out.detach(), [p.grad.clone() for p in model.parameters()], saved


@pytest.fixture(scope="module", params=[("gpt", 0.1), ("llama", 0.0)], ids=str)
def runs(request):
    name, dropout = request.param
    base = train_step(name, dropout)
    return base, {b: train_step(name, dropout, remat=True, remat_memory_budget=b) for b in BUDGETS}


def test_outputs_bit_identical_and_gradients_equal(runs):
    (_, out0, grads0, _), by_budget = runs
    for b, (_, out, grads, _) in by_budget.items():
        # Inductor may fuse the re-emitted regions differently, so rounding can differ in the last
        # bits; a different dropout mask would differ by far more than this.
        torch.testing.assert_close(out, out0, atol=1e-5, rtol=1e-4, msg=f"budget {b}")
        for g, g0 in zip(grads, grads0):
            torch.testing.assert_close(g, g0, atol=1e-5, rtol=1e-4)


def test_saved_bytes_fall_with_the_budget_within_the_plan(runs):
    import thunder_remat

    (_, _, _, saved0), by_budget = runs
    measured = [by_budget[b][3].activation_bytes for b in BUDGETS]
    assert measured == sorted(measured, reverse=True) and measured[0] <= saved0.activation_bytes, measured
    for jm, _, _, saved in by_budget.values():
        plan = thunder_remat.last_save_plan(jm)
        assert plan.failure is None and saved.activation_bytes <= plan.choice.plan.saved_bytes


def test_measured_costs_are_timed_on_the_device():
    import thunder_remat

    base = train_step("gpt", 0.0)
    jm, out, grads, saved = train_step("gpt", 0.0, remat=True, remat_memory_budget=0.5, remat_cost_model="measured")
    plan = thunder_remat.last_save_plan(jm)
    assert plan.problem.cost_unit == "us"
    assert all(op.cost >= 0 for op in plan.problem.ops) and any(op.cost > 0 for op in plan.problem.ops)
    torch.testing.assert_close(out, base[1], atol=1e-5, rtol=1e-4)
    for g, g0 in zip(grads, base[2]):
        torch.testing.assert_close(g, g0, atol=1e-5, rtol=1e-4)
    assert saved.activation_bytes <= plan.choice.plan.saved_bytes
