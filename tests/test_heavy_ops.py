"""Ops that are not elementwise (issue 25): priced by what they compute, contractions kept.

A convolution used to be priced like a pointwise op (its output elements) and no policy kept it,
so the fastest plan recomputed every convolution of a CNN. Prices are checked against torch's own
flop counter on the same shapes.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import thunder
import torch
import torch.nn.functional as F
from thunder.core import devices, dtypes, prims
from thunder.core.proxies import TensorProxy
from thunder.core.trace import TraceCtx, tracectx
from torch.utils.flop_counter import FlopCounterMode

import thunder_remat
from thunder_remat.cost import op_flops
from thunder_remat.policies import (DEFAULT_POLICIES, NeverRecomputeContractions, OpFacts, VerdictKind,
                                    contraction_kind, judge_op)


def _torch_flops(fn, *shapes) -> int:
    with FlopCounterMode(display=False) as counter:
        fn(*(torch.randn(s) for s in shapes))
    return counter.get_total_flops()


def _proxy(shape, dtype=dtypes.float32) -> TensorProxy:
    return TensorProxy(shape=shape, device=devices.cpu, dtype=dtype)


def _convolution(x, w, *, stride=1, padding=0, groups=1):
    """The convolution prim's bound symbol, as it stands in a joint trace (recorded, not run)."""
    trace = TraceCtx()
    with tracectx(trace):
        n = len(x) - 2
        prims.convolution(_proxy(x), _proxy(w), None, (stride,) * n, (padding,) * n, (1,) * n, False,
                          (0,) * n, groups)
    (bsym,) = [b for b in trace.bound_symbols if b.sym.name == "convolution"]
    return bsym


@pytest.mark.unit
@pytest.mark.parametrize("x, w, stride, padding, groups", [
    ((2, 3, 8, 8), (8, 3, 3, 3), 1, 1, 1),
    ((2, 8, 16, 16), (16, 2, 3, 3), 2, 1, 4),  # grouped, strided
    ((1, 4, 9), (6, 4, 3), 1, 0, 1),  # 1-d
    ((1, 2, 4, 4, 4), (3, 2, 2, 2, 2), 1, 0, 1),  # 3-d
])
def test_a_convolution_is_priced_at_its_real_flops(x, w, stride, padding, groups):
    real = _torch_flops(lambda a, b: torch.convolution(a, b, None, (stride,) * (len(x) - 2), (padding,) * (len(x) - 2),
                                                       (1,) * (len(x) - 2), False, (0,) * (len(x) - 2), groups), x, w)
    bsym = _convolution(x, w, stride=stride, padding=padding, groups=groups)
    assert op_flops(bsym, frozenset()) == real > 0


@pytest.mark.unit
def test_a_transposed_convolution_is_priced_at_its_real_flops():
    x, w = (1, 4, 5, 5), (4, 6, 3, 3)
    real = _torch_flops(lambda a, b: F.conv_transpose2d(a, b, stride=2), x, w)
    # Thunder 0.2.6's convolution prim refuses transposed=True: F.conv_transpose2d runs as a torch
    # op it registered automatically
    op = SimpleNamespace(sym=SimpleNamespace(name="conv_transpose2d", module=torch, id="torch.conv_transpose2d"),
                         subsymbols=(), args=(), kwargs={})
    with tracectx(TraceCtx()):
        op.flat_proxy_args, op.flat_proxy_outs = [_proxy(x), _proxy(w)], [_proxy((1, 6, 11, 11))]
    assert op_flops(op, frozenset()) == real


def _opaque(name, ins, outs, *args, **kwargs):
    """A bound symbol of a torch op Thunder registered automatically (no decomposition, no tag)."""
    with tracectx(TraceCtx()):
        ins, outs = [_proxy(s) for s in ins], [_proxy(s) for s in outs]
    return SimpleNamespace(sym=SimpleNamespace(name=name, module=torch, id=name), subsymbols=(), args=(*ins, *args),
                           kwargs=kwargs, flat_proxy_args=ins, flat_proxy_outs=outs)


@pytest.mark.unit
@pytest.mark.parametrize("name, fn, ins, out", [
    ("spmm", torch.mm, [(3, 4), (4, 5)], (3, 5)),  # torch.mm runs as the auto-registered spmm
    ("addmm", torch.addmm, [(3, 5), (3, 4), (4, 5)], (3, 5)),
    ("bmm", torch.bmm, [(2, 3, 4), (2, 4, 5)], (2, 3, 5)),
    ("baddbmm", torch.baddbmm, [(2, 3, 5), (2, 3, 4), (2, 4, 5)], (2, 3, 5)),
    ("tensordot", lambda a, b: torch.tensordot(a, b, dims=([1, 2], [0, 1])), [(3, 4, 2), (4, 2, 5)], (3, 5)),
])
def test_matmuls_without_thunders_tag_are_priced_as_contractions(name, fn, ins, out):
    real = _torch_flops(fn, *ins)
    assert op_flops(_opaque(name, ins, [out]), frozenset()) == pytest.approx(real)


@pytest.mark.unit
def test_einsum_and_grouped_matmul_are_priced_from_their_operands():
    einsum = _opaque("einsum", [(2, 3, 4), (2, 4, 5)], [(2, 3, 5)])
    einsum.args = ("bij,bjk->bik", *einsum.args)
    assert op_flops(einsum, frozenset()) == _torch_flops(lambda a, b: torch.einsum("bij,bjk->bik", a, b),
                                                         (2, 3, 4), (2, 4, 5))
    # (m, k) x (groups, k, n) -> (m, n): every row through one group's weight
    assert op_flops(_opaque("_grouped_mm", [(8, 4), (2, 4, 3), (2,)], [(8, 3)]), frozenset()) == 2 * 8 * 4 * 3


@pytest.mark.unit
def test_windows_sorts_gathers_and_unknown_ops_are_priced_by_what_they_touch():
    pool = _opaque("max_pool2d_with_indices", [(1, 2, 8, 8)], [(1, 2, 4, 4), (1, 2, 4, 4)], 3, 2, 1)
    assert op_flops(pool, frozenset()) == 32 * 9  # output elements * window
    assert op_flops(_opaque("sort", [(3, 1024)], [(3, 1024)], -1), frozenset()) == 3 * 1024 * 10
    table, index = (50_000, 16), (2, 8)
    with tracectx(TraceCtx()):
        ids = _proxy(index, dtypes.int64)
    embedding = _opaque("embedding", [table], [(2, 8, 16)])
    embedding.flat_proxy_args.insert(0, ids)
    assert op_flops(embedding, frozenset()) == 2 * 8 * 16 + 2 * 8  # the rows read, not the table
    assert op_flops(_opaque("upsample_bilinear2d", [(1, 2, 4, 4)], [(1, 2, 8, 8)]), frozenset()) == 128 * 4
    # an op the cost model does not know: every element it reads and writes, never free
    assert op_flops(_opaque("frobnicate", [(4, 4), (4,)], [(4, 4)]), frozenset()) == 16 + 4 + 16


@pytest.mark.unit
@pytest.mark.parametrize("op, kind", [
    ("convolution", "convolution"), ("conv2d", "convolution"), ("conv_transpose2d", "transposed convolution"),
    ("torch.ops.aten.convolution.default", "convolution"), ("spmm", "matmul"), ("addmm", "matmul"),
    ("bmm", "batched matmul"), ("baddbmm", "batched matmul"), ("_grouped_mm", "grouped matmul"),
    ("einsum", "tensor contraction"), ("sdpaex_grad_forward_scaled_dot_product_efficient_attention", "attention"),
])
def test_contractions_are_kept_softly_by_default_naming_their_kind(op, kind):
    assert contraction_kind(op) == kind
    judgement = judge_op(OpFacts(op, frozenset(), 64, 64), DEFAULT_POLICIES)
    assert judgement.hard is None and judgement.soft is not None and kind in judgement.soft
    assert NeverRecomputeContractions(hard=True).judge(OpFacts(op, frozenset(), 64, 64)).kind is VerdictKind.HARD


@pytest.mark.unit
@pytest.mark.parametrize("op", ["mul", "exp", "max_pool2d_with_indices", "cumsum", "sort", "gather", "where"])
def test_ops_that_are_not_contractions_are_left_to_the_cut(op):
    assert contraction_kind(op) is None
    assert NeverRecomputeContractions().judge(OpFacts(op, frozenset(), 64, 64)) is None


class TinyCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.c2, self.b2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=2), torch.nn.BatchNorm2d(8)

    def forward(self, x):
        h = F.max_pool2d(torch.relu(self.b1(self.c1(x))), 2)
        return torch.relu(self.b2(self.c2(h))).mean((2, 3))


#: real flops of the two convolutions at the test's input (2, 3, 8, 8), without bias
CONV_FLOPS = (2 * (2 * 8 * 8 * 8) * 3 * 9, 2 * (2 * 8 * 4 * 4) * 4 * 9)


def _train(budget):
    """Train one step with thunder_remat at ``budget``; the gradients equal eager PyTorch's."""
    torch.manual_seed(0)
    model, x = TinyCNN(), torch.randn(2, 3, 8, 8)
    eager = copy.deepcopy(model)
    jm = thunder.jit(model, remat=True, remat_memory_budget=budget)
    jm(x).pow(2).sum().backward()
    eager(x).pow(2).sum().backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4)
    return thunder_remat.last_save_plan(jm)


@pytest.fixture(scope="module")
def plans():
    return {budget: _train(budget) for budget in (1.0, 0.0)}


@pytest.mark.jit
def test_a_cnn_recomputes_no_convolution_at_the_fastest_budget(plans):
    result = plans[1.0]
    assert result.status.name != "FAILED", result.failure
    ops = {op.index: op for op in result.problem.ops}
    convs = [op for op in ops.values() if op.op == "convolution"]
    assert sorted(op.cost for op in convs) == sorted(CONV_FLOPS)
    assert all(op.soft_ban == "convolution (a contraction)" for op in convs)
    again = {ops[i].op for i in (*result.choice.plan.recomputed, *result.copied_ops) if i in ops}
    assert not again & {"convolution", "linear", "matmul", "sdpa", "scaled_dot_product_attention"}, again


@pytest.mark.jit
def test_a_cnn_estimated_recompute_counts_its_convolutions_at_a_tight_budget(plans):
    result = plans[0.0]
    ops = {op.index: op for op in result.problem.ops}
    plan = result.choice.plan
    recomputed_convs = [ops[i].cost for i in plan.recomputed if ops[i].op == "convolution"]
    assert recomputed_convs, "the smallest plan recomputes a convolution"
    assert plan.recompute_cost >= sum(recomputed_convs) >= min(CONV_FLOPS)
    assert plan.recompute_cost == pytest.approx(sum(ops[i].cost for i in plan.recomputed))


@pytest.mark.jit
def test_pooling_windows_are_not_kept_as_contractions():
    """Thunder 0.2.6 runs ``nn.MaxPool2d`` as a convolution with a one-hot kernel it builds from
    constants: a gather, left to the cut. With fusion regions Thunder's own pass recomputes it in
    the backward; thunder_remat at 1.0 then holds no more than Thunder alone, which here keeps
    the real convolution's output as thunder_remat does."""
    from thunder_remat.executors.eager import eager_fusion_ex
    from thunder_remat.inspect.measure import saved_for_backward

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3, padding=1))
    x = torch.randn(2, 3, 16, 16)
    runs = {}
    for name, options in (("alone", {}), ("ours", {"remat": True})):
        copy_ = copy.deepcopy(model)
        jm = thunder.jit(copy_, executors=[eager_fusion_ex], **options)
        out, saved = saved_for_backward(jm, x)
        out.pow(2).sum().backward()
        runs[name] = (jm, saved, [p.grad for p in copy_.parameters()])
    ops = thunder_remat.last_save_plan(runs["ours"][0]).problem.ops
    convolutions = [op for op in ops if op.op == "convolution"]
    assert len(convolutions) == 3 and [op.soft_ban for op in convolutions].count(None) == 1
    assert runs["ours"][1].activation_bytes <= runs["alone"][1].activation_bytes
    for got, want in zip(runs["ours"][2], runs["alone"][2]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.jit
def test_where_thunder_alone_recomputes_convolutions_the_fastest_budget_saves_no_more():
    """With a fusion executor whose regions take convolutions, Thunder's own pass recomputes them in
    the backward and saves less than the fastest plan: budget 1.0 is then the fastest plan saving no
    more than Thunder alone (the fraction scale capped at its figure), measured, and lower budgets
    fall from there; a peak budget every plan fits takes that same plan, not the fastest, and warns
    that the estimate does not model the executor's kernels; gradients equal Thunder alone's."""
    import contextlib

    from thunder_remat.executors.eager import eager_fusion_ex
    from thunder_remat.inspect.measure import saved_for_backward
    from thunder_remat.whole_graph.run import UnmodelledPeakWarning

    runs = {}
    for name, options in (("alone", {}), (1.0, {"remat": True}), (0.5, {"remat": True, "remat_memory_budget": 0.5}),
                          ("peak", {"remat": True, "remat_memory_budget": "peak:1GiB"})):
        torch.manual_seed(0)
        model, x = TinyCNN(), torch.randn(2, 3, 8, 8)
        jm = thunder.jit(model, executors=[eager_fusion_ex], **options)
        # a peak budget with regions whose kernels the estimate does not model says so
        with (pytest.warns(UnmodelledPeakWarning, match="does not model the fusion executor's kernels")
              if name == "peak" else contextlib.nullcontext()):
            out, saved = saved_for_backward(jm, x)
        out.pow(2).sum().backward()
        runs[name] = (jm, saved.activation_bytes, [p.grad for p in model.parameters()])
    plan = thunder_remat.last_save_plan(runs[1.0][0])
    assert plan.capped and plan.ceiling == runs["alone"][1] < plan.frontier.fastest.saved_bytes
    assert plan.choice.plan.saved_bytes == runs[1.0][1] <= runs["alone"][1]
    assert "capped at Thunder alone's" in plan.provenance()
    half = thunder_remat.last_save_plan(runs[0.5][0])
    assert half.choice.target_bytes == (plan.frontier.smallest.saved_bytes + plan.ceiling) // 2
    assert runs[0.5][1] <= runs[1.0][1]
    peak = thunder_remat.last_save_plan(runs["peak"][0])
    assert peak.capped and peak.choice.feasible
    assert peak.choice.plan.saved == plan.choice.plan.saved and runs["peak"][1] == runs[1.0][1]
    assert "plans walked capped at Thunder alone's" in peak.provenance()
    for budget in (1.0, 0.5, "peak"):
        for got, want in zip(runs[budget][2], runs["alone"][2]):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.jit
def test_a_peak_budget_warns_where_inductor_regions_run_a_convolution():
    """With Inductor's kernel model the estimate still does not see what its CPU convolutions hold
    (oneDNN): a peak budget says so when a predicted region runs one; a fraction budget, or the
    same budget with no region running a convolution, or without fusion regions, does not."""
    import warnings

    from helpers import joint_trace
    from thunder_remat.config import RematConfig
    from thunder_remat.fusion_regions import KernelModel, runs_convolution
    from thunder_remat.whole_graph.run import LossOutsideWarning, UnmodelledPeakWarning, plan_saved_values

    torch.manual_seed(0)
    trace, _ = joint_trace(TinyCNN(), (torch.randn(2, 3, 8, 8),))
    inductor = KernelModel(reads_threshold=4, accumulated_reads_threshold=8, uncut_convolution_regions=True)
    everything = lambda bsym: True  # noqa: E731
    no_convolution = lambda bsym: not runs_convolution(bsym)  # noqa: E731
    with pytest.warns(UnmodelledPeakWarning, match="the memory of convolutions in its regions"):
        plan_saved_values(trace, RematConfig(memory_budget="peak:1GiB"), fusible=everything, kernels=inductor)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnmodelledPeakWarning)
        plan_saved_values(trace, RematConfig(memory_budget=0.5), fusible=everything, kernels=inductor)
    for fusible, kernels in ((no_convolution, inductor), (None, None)):  # no convolution region; no regions
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plan_saved_values(trace, RematConfig(memory_budget="peak:1GiB"), fusible=fusible, kernels=kernels)
        # the model's output goes to the caller's loss: that warning, and no other of the kind
        assert [w.category for w in caught if issubclass(w.category, UnmodelledPeakWarning)] == [LossOutsideWarning]
