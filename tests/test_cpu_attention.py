"""The CPU flash-attention executor: same numbers as Thunder's decomposition, output and
log-sum-exp saved instead of the probabilities, never recomputed by a plan."""

from __future__ import annotations

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunder_remat
from thunder_remat.cost import op_flops
from thunder_remat.executors.cpu_attention import BACKWARD_NAME, FORWARD_NAME, cpu_attention_ex
from thunder_remat.executors.eager import eager_fusion_ex

from helpers import run

pytestmark = pytest.mark.jit

WITH_ATTENTION = [cpu_attention_ex, eager_fusion_ex]


def attention(q, k, v):
    return F.scaled_dot_product_attention(q.sin(), k, v, is_causal=True).relu()


def scaled(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, scale=0.3)


def masked(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def constant_mask(q, k, v):
    """An additive (batch, 1, queries, keys) mask made inside the program, as transformers' BERT
    makes its own: no gradient flows to it."""
    mask = torch.full((12, 12), -1e4).triu(1).expand(2, 1, 12, 12)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _random(*shape, requires_grad=False):
    return torch.randn(shape, generator=torch.Generator().manual_seed(1), requires_grad=requires_grad)


def qkv(seed=0, keys=12, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    shapes = ((2, 3, 12, 8), (2, 3, keys, 8), (2, 3, keys, 8))
    return tuple(torch.randn(s, generator=g, dtype=dtype, requires_grad=True) for s in shapes)


def op_names(trace):
    return [b.sym.name for b in trace.bound_symbols]


CLAIMED = {
    "causal": (attention, ()),
    "scale": (scaled, ()),
    "mask made inside": (constant_mask, ()),
    "mask given, no gradient": (masked, (_random(2, 1, 12, 12),)),
}


@pytest.mark.parametrize("fn, mask", CLAIMED.values(), ids=CLAIMED.keys())
def test_outputs_and_grads_equal_thunders_decomposition(fn, mask):
    fused = run(fn, (*qkv(), *mask), executors=WITH_ATTENTION)
    decomposed = run(fn, (*qkv(), *mask), executors=[eager_fusion_ex])
    for a, b in zip(fused.outputs + fused.grads, decomposed.outputs + decomposed.grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert FORWARD_NAME in op_names(thunder.last_traces(fused.jitted)[-1])
    assert BACKWARD_NAME in op_names(thunder.last_backward_traces(fused.jitted)[-1])
    assert BACKWARD_NAME not in op_names(thunder.last_backward_traces(decomposed.jitted)[-1])


def test_backward_keeps_output_and_logsumexp_not_probabilities():
    q, k, v = qkv(keys=40)
    fused = run(scaled, (q, k, v), executors=WITH_ATTENTION)
    decomposed = run(scaled, (q, k, v), executors=[eager_fusion_ex])
    # inputs q, k, v are held by the caller anyway; the fused op adds out (2x3x12x8) and lse (2x3x12)
    inputs = sum(t.numel() * 4 for t in (q, k, v))
    assert fused.saved_bytes - inputs == (2 * 3 * 12 * 8 + 2 * 3 * 12) * 4
    # the decomposition keeps the 2x3x12x40 probabilities
    assert decomposed.saved_bytes - inputs >= 2 * 3 * 12 * 40 * 4


MASKS = {
    "needs a gradient": lambda: _random(2, 1, 12, 12, requires_grad=True),  # the kernels return none
    "boolean": lambda: torch.ones(12, 12, dtype=torch.bool).tril().expand(2, 3, 12, 12),  # the kernels refuse it
    "two-dimensional": lambda: _random(12, 12),
}


@pytest.mark.parametrize("make_mask", MASKS.values(), ids=MASKS.keys())
def test_unsupported_masks_fall_back_to_thunder(make_mask):
    """Outside what the CPU kernels compute like the decomposition: Thunder keeps the call."""
    fused = run(masked, (*qkv(), make_mask()), executors=WITH_ATTENTION)
    decomposed = run(masked, (*qkv(), make_mask()), executors=[eager_fusion_ex])
    assert FORWARD_NAME not in op_names(thunder.last_traces(fused.jitted)[-1])
    for a, b in zip(fused.outputs + fused.grads, decomposed.outputs + decomposed.grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("budget", [1.0, 0.0])
def test_plans_treat_the_fused_forward_like_a_matmul(budget):
    """Kept at 1.0 (output and lse saved); recomputed only when the budget demands it (0.0)."""
    base = run(attention, qkv(), executors=WITH_ATTENTION)
    remat = run(attention, qkv(), executors=WITH_ATTENTION, remat=True, remat_memory_budget=budget)
    for a, b in zip(base.outputs + base.grads, remat.outputs + remat.grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    result = thunder_remat.last_save_plan(remat.jitted)
    (fused,) = [op for op in result.problem.ops if op.op == FORWARD_NAME]
    assert fused.soft_ban == "matmul/linear/attention" and fused.hard_ban is None
    recomputed = fused.index in result.choice.plan.recomputed
    assert recomputed == (budget == 0.0)
    assert (FORWARD_NAME in op_names(thunder.last_backward_traces(remat.jitted)[-1])) == recomputed
    if not recomputed:
        assert set(fused.outputs) <= set(result.choice.plan.saved)


def test_the_fused_forward_is_priced_as_attention():
    jitted = thunder.jit(attention, executors=WITH_ATTENTION)
    jitted(*qkv())
    bsym = next(b for b in thunder.last_traces(jitted)[-1].bound_symbols if b.sym.name == FORWARD_NAME)
    assert op_flops(bsym, set()) == 4.0 * (2 * 3 * 12 * 8) * 12


def test_a_fully_masked_row_gives_zeros_as_eager_pytorch_does():
    """Thunder's decomposition gives NaN there (softmax of -inf only); the CPU kernels, like eager
    PyTorch, give zeros."""
    mask = torch.zeros(2, 1, 12, 12)
    mask[:, :, 3] = float("-inf")
    fused = run(masked, (*qkv(), mask), executors=WITH_ATTENTION)
    eager = masked(*qkv(), mask)
    assert FORWARD_NAME in op_names(thunder.last_traces(fused.jitted)[-1])
    torch.testing.assert_close(fused.outputs[0], eager.detach(), atol=1e-5, rtol=1e-4)
    assert not fused.outputs[0].isnan().any() and not any(g.isnan().any() for g in fused.grads)
