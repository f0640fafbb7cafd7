"""remat_cost_model="measured": forward ops timed on their device instead of estimated from shapes.

Runs on CPU here (CPU time); on CUDA the same code times with CUDA events.
"""

import pytest
import thunder
import torch

import thunder_remat
import thunder_remat.executors.hooks.op_timing as op_timing
from thunder_remat.executors.eager import eager_fusion_ex
from thunder_remat.models import example_batch
from thunder_remat.whole_graph.problem import ForwardOp, ForwardValue, SaveProblem, with_measured_costs
from helpers import train_built_in

pytestmark = pytest.mark.jit


def train(budget, **options):
    step = train_built_in("gpt", executors=[eager_fusion_ex], remat=True, remat_memory_budget=budget, **options)
    return step.jitted, step.grads, step.saved, step.model


@pytest.fixture(scope="module")
def measured():
    return {b: train(b, remat_cost_model="measured") for b in (1.0, 0.5)}


def test_measured_plans_give_eager_gradients_and_meet_the_plan(measured):
    for b, (jm, grads, saved, model) in measured.items():
        model.zero_grad(set_to_none=True)
        model(example_batch(model)).float().pow(2).mean().backward()
        for g, p in zip(grads, model.parameters()):
            torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-4)
        result = thunder_remat.last_save_plan(jm)
        assert result.problem.cost_unit == "us"
        assert saved.activation_bytes == result.choice.plan.saved_bytes
    assert (measured[0.5][2].activation_bytes <= measured[1.0][2].activation_bytes)


def test_measured_costs_are_positive_where_flops_are(measured):
    jm = measured[0.5][0]
    measured_ops = thunder_remat.last_save_plan(jm).problem.ops
    flops_ops = {op.index: op for op in thunder_remat.last_save_plan(train(0.5)[0]).problem.ops}
    assert [op.index for op in measured_ops] == sorted(flops_ops)
    for op in measured_ops:
        assert (op.cost > 0) == (flops_ops[op.index].cost > 0), op


def test_report_provenance_and_sweep_name_the_unit(measured):
    jm = measured[0.5][0]
    report = thunder_remat.explain(jm)
    assert report.recompute_unit == "us" and "us" in str(report).split("estimated recompute:")[1].splitlines()[0]
    assert "us" in thunder_remat.last_save_plan(jm).provenance()
    assert {p.unit for p in thunder_remat.sweep_budgets(jm, [1.0, 0.0])} == {"us"}


def test_the_same_model_gets_the_same_plan_in_one_process(measured):
    """Timings are cached per op signature, so recompiling does not re-time or change the plan."""
    again = train(0.5, remat_cost_model="measured")[0]
    first = thunder_remat.last_save_plan(measured[0.5][0])
    second = thunder_remat.last_save_plan(again)
    assert [op.cost for op in first.problem.ops] == [op.cost for op in second.problem.ops]
    assert first.choice.plan == second.choice.plan


def test_a_big_matmul_measures_longer_than_a_tiny_add():
    def f(a, b, c):
        return a @ b, c + c

    jf = thunder.jit(f)
    jf(torch.randn(384, 384), torch.randn(384, 384), torch.randn(4))
    ops = {b.sym.name: b for b in thunder.last_traces(jf)[0].bound_symbols if b.sym.name in ("matmul", "add")}
    times = op_timing.time_ops({name: b for name, b in ops.items()})
    assert set(times) == {"matmul", "add"}
    assert times["matmul"] > 5 * times["add"] > 0


def test_timings_are_cached_per_signature(monkeypatch):
    calls = []
    monkeypatch.setattr(op_timing, "_time_one", lambda bsym, r, w: calls.append(bsym.sym.name) or 7.0)
    op_timing.clear_timing_cache()

    def f(a, b):
        return (a + b) + (b + a)

    jf = thunder.jit(f)
    jf(torch.randn(3), torch.randn(3))
    adds = {i: b for i, b in enumerate(thunder.last_traces(jf)[0].bound_symbols) if b.sym.name == "add"}
    assert len(adds) == 3
    assert op_timing.time_ops(adds) == {i: 7.0 for i in adds}
    assert calls == ["add"]  # three adds of the same shapes: timed once
    op_timing.clear_timing_cache()


def test_unmeasured_ops_are_priced_at_the_median_rate():
    values = {n: ForwardValue(n, 16, is_input=(n == "x")) for n in ("x", "a", "b", "c", "v")}
    ops = [
        ForwardOp(0, "mul", ("a",), ("x",), cost=100.0),
        ForwardOp(1, "exp", ("b",), ("a",), cost=200.0),
        ForwardOp(2, "odd", ("c",), ("b",), cost=50.0),  # could not run alone
        ForwardOp(3, "reshape", ("v",), ("c",), cost=0.0),  # a view
    ]
    problem = SaveProblem(values, ops, ("v",))
    out = with_measured_costs(problem, {0: 10.0, 1: 40.0})  # 0.1 and 0.2 us per flop: median 0.15
    assert out.cost_unit == "us" and problem.cost_unit == "flops"
    assert [op.cost for op in out.ops] == [10.0, 40.0, pytest.approx(7.5), 0.0]


def test_attention_of_the_cuda_sdpa_executor_is_priced_as_attention():
    """On CUDA Thunder's sdpa executor replaces attention by its own forward op; same price."""
    from types import SimpleNamespace

    from thunder.core.proxies import TensorProxy
    from thunder.core.trace import TraceCtx, tracectx

    from thunder_remat.cost import op_flops

    with tracectx(TraceCtx()):
        q, k, v = (TensorProxy(shape=(2, 4, 16, 8), device=thunder.devices.cpu, dtype=thunder.dtypes.float32)
                   for _ in range(3))
        out = TensorProxy(like=q)
    expected = 4.0 * 2 * 4 * 16 * 8 * 16
    for name in ("scaled_dot_product_attention", "sdpaex_grad_forward_scaled_dot_product_efficient_attention",
                 "sdpafx_grad_forward_scaled_dot_product_flash_attention"):
        bsym = SimpleNamespace(sym=SimpleNamespace(name=name), flat_proxy_args=[q, k, v], flat_proxy_outs=[out])
        assert op_flops(bsym, set()) == expected, name
