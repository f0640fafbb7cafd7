"""verify() catches broken rewrites; a rewrite that fails verification is undone with a warning."""

import pytest
import thunder
import torch
from thunder.core.trace import from_trace

import thunder_remat
from thunder_remat.executors.eager import eager_fusion_ex
from thunder_remat.models import build_model, example_batch

from helpers import joint_trace

pytestmark = pytest.mark.jit


def joint_traces(name="gpt", dropout=0.1, budget=0.0):
    """(Thunder's joint trace, thunder_remat's rewrite of it, the plan) for a tiny model."""
    seen = []
    import thunder_remat.whole_graph.run as wg

    original = wg.build

    def spy(schedule):
        new = original(schedule)
        seen.append((schedule.trace, new))
        return new

    wg.build = spy
    try:
        model = build_model(name, "tiny", dropout=dropout)
        jm = thunder.jit(model, executors=[eager_fusion_ex], remat=True, remat_memory_budget=budget)
        jm(example_batch(model)).sum().backward()
    finally:
        wg.build = original
    before, after = seen[-1]
    return before, after, thunder_remat.last_save_plan(jm).choice.plan


def test_a_sound_rewrite_passes():
    before, after, plan = joint_traces()
    assert thunder_remat.verify(before, after, saved=plan.saved, saved_bytes=plan.saved_bytes) == []
    wrong = thunder_remat.verify(before, after, saved_bytes=plan.saved_bytes + 4)
    assert len(wrong) == 1
    assert wrong[0].startswith(f"the backward holds {plan.saved_bytes} B of forward activations, "
                               f"the plan says {plan.saved_bytes + 4} B: storages ")
    assert thunder_remat.verify(before, before) == []


def test_use_before_definition_is_caught():
    before, after, _ = joint_traces()
    broken = from_trace(after)
    bsyms = list(after.bound_symbols)
    i = next(k for k, b in enumerate(bsyms) if any(p.name.startswith("rc_") for p in b.flat_proxy_outs))
    broken.bound_symbols = bsyms[:i] + bsyms[i + 1:]
    problems = thunder_remat.verify(before, broken)
    assert any("before it is produced" in p for p in problems)
    with pytest.raises(thunder_remat.VerificationError):
        thunder_remat.verify(before, broken, raise_on_error=True)


def test_duplicated_random_op_is_caught():
    before, after, _ = joint_traces()
    uniform = next(b for b in after.bound_symbols if b.sym.name == "uniform")
    broken = from_trace(after)
    broken.bound_symbols = [uniform, *after.bound_symbols]
    assert any("uniform runs 2 times" in p for p in thunder_remat.verify(before, broken))


def slice_of_a_product(x, w):
    y = x @ w  # a fresh 8 x 16 tensor, kept rather than recomputed (a matmul)
    s = y[:, :2]  # a view keeping all of y alive
    return (s * s).sum()


def test_saved_views_holding_more_than_the_plan_says_are_caught():
    x, w = torch.randn(8, 4, requires_grad=True), torch.randn(4, 16, requires_grad=True)
    before, result = joint_trace(slice_of_a_product, (x, w))
    # Thunder's own split of this trace saves the slice, which keeps y's whole storage alive
    view = next(p.name for b in before.bound_symbols for p in b.flat_proxy_outs
                if b.sym.name == "slice_prim" and p.shape == (8, 2))
    base = next(p.name for b in before.bound_symbols for p in b.flat_proxy_outs if b.sym.name == "matmul")
    problems = thunder_remat.verify(before, before, saved_bytes=8 * 2 * 4)
    assert problems == [f"the backward holds {8 * 16 * 4} B of forward activations, the plan says {8 * 2 * 4} B: "
                        f"storages {base} ({8 * 16 * 4} B, kept alive by {view})"]
    # thunder_remat's plan saves the base, never the view, and says so in bytes
    assert result.choice.plan.saved_bytes == 8 * 16 * 4 and view not in result.choice.plan.saved
    assert result.problem.storage_bytes(result.problem.saved_by_thunder) == 8 * 16 * 4


def test_changed_outputs_and_unsaved_reads_are_caught():
    before, after, plan = joint_traces()
    other_before, *_ = joint_traces("mlp", None)
    assert "the trace no longer returns the same values" in thunder_remat.verify(other_before, after)
    problems = thunder_remat.verify(before, before, saved=())
    assert any("which the plan does not save" in p for p in problems)


def test_a_rewrite_failing_verification_is_undone(monkeypatch):
    import thunder_remat.whole_graph.run as wg

    original = wg.build

    def drop_first_recomputation(schedule):
        new = original(schedule)
        bsyms = list(new.bound_symbols)
        i = next(k for k, b in enumerate(bsyms) if any(p.name.startswith("rc_") for p in b.flat_proxy_outs))
        new.bound_symbols = bsyms[:i] + bsyms[i + 1:]
        return new

    model = build_model("gpt", "tiny", dropout=0.1)
    x = example_batch(model)
    base = thunder.jit(model, executors=[eager_fusion_ex])
    torch.manual_seed(0)
    out0 = base(x)
    out0.float().pow(2).mean().backward()
    grads0 = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    monkeypatch.setattr(wg, "build", drop_first_recomputation)
    jm = thunder.jit(model, executors=[eager_fusion_ex], remat=True, remat_memory_budget=0.0)
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="the whole-graph rewrite failed verification and is undone"):
        out = jm(x)
    out.float().pow(2).mean().backward()
    assert torch.equal(out, out0)
    for p, g0 in zip(model.parameters(), grads0):
        torch.testing.assert_close(p.grad, g0, atol=1e-5, rtol=1e-4)
    assert thunder_remat.last_save_plan(jm).failure.startswith("verification failed")


def test_a_pair_rewrite_failing_verification_is_undone(monkeypatch):
    import sys

    # the one helper both passes verify through reads this module's verify
    monkeypatch.setattr(sys.modules["thunder_remat.verify"], "verify", lambda before, after, **_: ["injected problem"])
    model = build_model("mlp", "tiny")
    jm = thunder.jit(model, executors=[eager_fusion_ex], remat=True, remat_whole_graph=False)
    with pytest.warns(UserWarning, match="the fusion-pair rewrite failed verification and is undone: injected problem"):
        jm(example_batch(model)).sum().backward()
    assert thunder_remat.last_pair_pass(jm).failure.startswith("verification failed")


def test_verify_rejects_what_is_not_a_trace():
    before, after, _ = joint_traces("mlp", None)
    with pytest.raises(TypeError, match="'after' must be a Thunder trace"):
        thunder_remat.verify(before, "not a trace")
    with pytest.raises(TypeError, match="'before' must be a Thunder trace"):
        thunder_remat.verify(None, after)
