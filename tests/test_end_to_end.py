"""End to end with Thunder's real torch.compile (Inductor) executor on small built-in models.

Gradients must equal the run without thunder_remat (Thunder's built-in pass), and the bytes a real
forward saves for backward (saved_tensors_hooks) must be no more than with Thunder's pass.
Inductor compiles on CPU take seconds, so each model is compiled once per mode and shared.
"""

import pytest
import thunder
import torch
from thunder.executors.torch_compile import torch_compile_ex

from helpers import last_pairs, train_built_in
from thunder_remat.models import build_model, example_batch

pytestmark = [pytest.mark.jit, pytest.mark.inductor]


def train_step(name, **options):
    step = train_built_in(name, executors=[torch_compile_ex], **options)
    return step.jitted, step.out, step.grads, step.saved


@pytest.fixture(scope="module", params=["mlp", "gpt", "llama"])
def model_runs(request):
    return request.param, train_step(request.param), train_step(request.param, remat=True)


def test_gradients_equal_without_the_pass(model_runs):
    _, (_, out0, grads0, _), (_, out1, grads1, _) = model_runs
    torch.testing.assert_close(out1, out0, atol=1e-5, rtol=1e-4)
    for g1, g0 in zip(grads1, grads0):
        torch.testing.assert_close(g1, g0, atol=1e-5, rtol=1e-4)


def test_saved_bytes_no_more_than_thunder(model_runs):
    name, (_, _, _, saved0), (jm, _, _, saved1) = model_runs
    assert saved1.activation_bytes <= saved0.activation_bytes, (name, saved0, saved1)
    result = last_pairs(jm)
    assert result.pairs and result.bytes_after <= result.bytes_before
    fusions = [b for b in thunder.last_backward_traces(jm)[-1].bound_symbols if b.sym.is_fusion]
    assert fusions and all(b.sym.name.startswith("TorchCompile") for b in fusions)


def test_torch_compile_regions_are_built_once_on_first_call(model_runs):
    _, _, (jm, _, _, _) = model_runs
    from thunder_remat.executors.torch_compile import DeferredRegion

    for trace in (thunder.last_traces(jm)[-1], thunder.last_backward_traces(jm)[-1]):
        regions = [fn for b in trace.bound_symbols if b.sym.is_fusion for fn in b._call_ctx.values()]
        assert regions and all(isinstance(fn, DeferredRegion) and fn.built for fn in regions)


@pytest.mark.parametrize("fullgraph", [None, False])
def test_deferred_build_keeps_torch_compile_options(monkeypatch, fullgraph):
    """torch_compile_fullgraph is read when the region is built, on its first call."""
    seen = []

    def fake_compile(fn, *, mode=None, fullgraph=None):
        seen.append(fullgraph)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    options = {} if fullgraph is None else {"torch_compile_fullgraph": fullgraph}
    model = build_model("mlp", "tiny")
    jm = thunder.jit(model, executors=[torch_compile_ex], remat=True, **options)
    jm(example_batch(model)).sum().backward()
    assert seen and set(seen) == {True if fullgraph is None else fullgraph}


def test_torch_compile_under_a_budget():
    """The whole-graph pass at budget 0.5 with the real torch.compile executor: same numbers, fewer bytes."""
    _, out0, grads0, saved0 = train_step("gpt")
    jm, out1, grads1, saved1 = train_step("gpt", remat=True, remat_memory_budget=0.5)
    torch.testing.assert_close(out1, out0, atol=1e-5, rtol=1e-4)
    for g1, g0 in zip(grads1, grads0):
        torch.testing.assert_close(g1, g0, atol=1e-5, rtol=1e-4)
    import thunder_remat

    plan = thunder_remat.last_save_plan(jm)
    assert plan.failure is None and plan.choice.feasible
    assert saved1.activation_bytes == plan.choice.plan.saved_bytes < saved0.activation_bytes
