"""In-place writes to intermediates (``h *= 2``, BERT's ``embeddings += position_embeddings``).

Thunder records them as ``copy_(new, destination)``: from then on the destination's storage holds
the new data. Neither pass may replay the write in the backward (it would write into a storage
that already holds its result) nor hand over the value from before the write. Gradients are
compared with PyTorch running the same program without the in-place write.

Where the backward needs the value from *before* a write to a matmul's output (``h = x @ w;
h += cos(h)``), Thunder 0.2.6 alone already hands over the overwritten storage; thunder_remat's
plan then fails, saying why (the last test; docs/whole-graph.md, "In-place writes").
"""

import pytest
import thunder
import torch

from helpers import run, saved_names
from test_fusion_pairs import pointwise_ex, x_w
from thunder_remat.executors.eager import eager_fusion_ex

pytestmark = pytest.mark.jit


def scaled_matmul(x, w):
    h = x @ w
    h *= 2.0
    return torch.sin(h) * 3


def scaled_matmul_reference(x, w):
    return torch.sin((x @ w) * 2.0) * 3


def scaled_exp(x, w):
    h = torch.exp(x)
    h *= 2.0
    return torch.sin(h) @ w


def scaled_exp_reference(x, w):
    return torch.sin(torch.exp(x) * 2.0) @ w


def shifted_norm(x, w):
    """BERT's embeddings: a sum written in place, then a layer norm."""
    h = x @ w
    h += torch.cos(x).sum(1, keepdim=True)
    return torch.nn.functional.layer_norm(h, (4,)) * torch.tanh(h)


def shifted_norm_reference(x, w):
    h = (x @ w) + torch.cos(x).sum(1, keepdim=True)
    return torch.nn.functional.layer_norm(h, (4,)) * torch.tanh(h)


def fresh_copy_scaled(x, w):
    """A write into a tensor made just for it: running it again with that tensor is sound."""
    t = torch.sin(x) * 1.0
    t.mul_(0.75)
    return torch.tanh(t) @ w


def fresh_copy_scaled_reference(x, w):
    return torch.tanh(torch.sin(x) * 0.75) @ w


PROGRAMS = {
    "fresh_copy_scaled": (fresh_copy_scaled, fresh_copy_scaled_reference),
    "scaled_matmul": (scaled_matmul, scaled_matmul_reference),
    "scaled_exp": (scaled_exp, scaled_exp_reference),
    "shifted_norm": (shifted_norm, shifted_norm_reference),
}
EXECUTORS = {"pointwise regions": [pointwise_ex], "eager regions": [eager_fusion_ex], "no regions": []}
OPTIONS = {
    "defaults": {"remat": True},
    "budget 0": {"remat": True, "remat_budget": 0.0},
    "pair pass alone": {"remat": True, "remat_whole_graph": False},
}


def reference_gradients(fn):
    x, w = (a.detach().clone().requires_grad_() for a in x_w())
    fn(x, w).pow(2).sum().backward()
    return x.grad, w.grad


@pytest.mark.parametrize("options", OPTIONS, ids=list(OPTIONS))
@pytest.mark.parametrize("executors", EXECUTORS, ids=list(EXECUTORS))
@pytest.mark.parametrize("program", PROGRAMS, ids=list(PROGRAMS))
def test_gradients_equal_pytorch(program, executors, options):
    fn, reference = PROGRAMS[program]
    if options == "pair pass alone" and executors == "no regions":
        pytest.skip("no fusion regions: the pair pass has nothing to do")
    r = run(fn, x_w(), executors=EXECUTORS[executors], **OPTIONS[options])
    for got, want in zip(r.grads, reference_gradients(reference)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_the_write_is_saved_not_replayed():
    """The backward of sin needs ``h`` after the write: the forward hands over the write's output
    (one storage, the matmul's) and the backward runs no copy_."""
    r = run(scaled_matmul, x_w(), executors=[pointwise_ex], remat=True)
    forward = thunder.last_traces(r.jitted)[-1]
    copies = [b.flat_proxy_outs[0].name for b in forward.bound_symbols for b in [b, *b.subsymbols]
              if b.sym.name == "copy_"]
    assert saved_names(r.jitted) == sorted([*copies, "w", "x"])
    backward = thunder.last_backward_traces(r.jitted)[-1]
    assert not [b for b in backward.bound_symbols for b in [b, *b.subsymbols] if b.sym.name == "copy_"]
    assert r.saved_bytes == 8 * 4 * 4 + 8 * 16 * 4 + 16 * 4 * 4


def test_a_write_into_a_fresh_tensor_is_recomputed_with_it():
    """Nothing from before the write is read by the backward: the whole chain, write included,
    may run again there, so thunder_remat saves no more than Thunder alone (its fusion pass
    recomputes the chain in the backward region)."""
    alone = run(fresh_copy_scaled, x_w(), executors=[eager_fusion_ex])
    for options in OPTIONS.values():
        ours = run(fresh_copy_scaled, x_w(), executors=[eager_fusion_ex], **options)
        assert ours.saved_bytes <= alone.saved_bytes, options


def test_verify_finds_a_write_run_again_into_a_saved_value():
    """The joint trace with the write copied to the end, as the old passes' rewrites did: the
    gradient reads the matmul's output after the second write."""
    from thunder.core.trace import from_trace

    import thunder_remat
    from thunder_remat.plugin import last_joint_trace
    from thunder_remat.verify import verify

    r = run(scaled_matmul, x_w(), executors=[], remat=True)
    joint = last_joint_trace(r.jitted)
    assert verify(joint, joint) == []
    writes = [b for b in joint.bound_symbols if b.sym.name == "copy_"]
    assert len(writes) == 1
    cos = next(i for i, b in enumerate(joint.bound_symbols) if b.sym.name in ("cos", "torch.cos") or
               any(s.sym.name == "cos" for s in b.subsymbols))
    bad = from_trace(joint)
    bad.bound_symbols = [*joint.bound_symbols[:cos], writes[0], *joint.bound_symbols[cos:]]
    problems = verify(joint, bad)
    assert problems and "after an in-place write" in problems[0], problems
    assert thunder_remat.last_save_plan(r.jitted).failure is None


def stale_matmul(x, w):
    h = x @ w
    h += torch.cos(h)
    return torch.tanh(h)


def test_a_read_of_an_overwritten_matmul_output_is_reported():
    """cos's gradient needs the matmul's output from before the write: it can be neither saved nor
    recomputed (a matmul), so the plan fails, saying why, and Thunder's trace is kept."""
    with pytest.warns(UserWarning, match="from before an in-place write overwrote its storage"):
        r = run(stale_matmul, x_w(), executors=[], remat=True)
    import thunder_remat

    assert "in-place write" in thunder_remat.last_save_plan(r.jitted).failure


def biased_probabilities(x, wq, wk, bias):
    """T5's attention probabilities: a position bias added in place to a matmul's output."""
    s = (x @ wq) @ (x @ wk).transpose(-1, -2)
    s += bias
    return torch.softmax(s, dim=-1)


def biased_attention(x, wq, wk, w2, bias):
    """T5's attention, and a second use of the probabilities far from the first (more backward ops
    in between than the reuse window)."""
    p = biased_probabilities(x, wq, wk, bias)
    h = p @ x
    for _ in range(8):
        h = torch.tanh(h @ w2)
    return (h + p @ x).sum()


def biased_attention_inputs():
    g = torch.Generator().manual_seed(0)
    x, wq, wk = torch.randn(2, 8, 16, generator=g), torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)
    return x, wq, wk, torch.randn(16, 16, generator=g) / 4, torch.randn(2, 8, 8, generator=g)


@pytest.mark.parametrize("budget", [0.5, 0.0])
def test_a_write_chain_copied_again_for_a_far_use_writes_once(budget):
    """The backward copies the write chain once and keeps it: a second copy for the far use would
    add the bias again into the matmul copy the first one wrote into (wrong gradients, no warning)."""
    import warnings

    import thunder_remat

    args = [a.requires_grad_() for a in biased_attention_inputs()]
    eager = [a.detach().clone().requires_grad_() for a in args]
    biased_attention(*eager).pow(2).backward()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="thunder_remat")
        r = run(biased_attention, args, executors=[], remat=True, remat_memory_budget=budget)
    assert thunder_remat.last_save_plan(r.jitted).failure is None
    for got, want in zip(r.grads, (a.grad for a in eager)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def biased_layers(x, wq, wk, w2, bias):
    """Three layers of ``biased_attention``'s attention, each followed by six matmuls: the write
    chain of a layer is needed to remake the next layer's checkpoint, and again, far later, by its
    own layer's backward."""
    h = x
    for _ in range(3):
        a = biased_probabilities(h, wq, wk, bias) @ h
        for _ in range(6):
            a = torch.tanh(a @ w2)
        h = a + h
    return h.sum()


def test_a_write_chain_made_for_a_checkpoint_is_made_again_whole_where_its_layer_needs_it(monkeypatch):
    """At 0.5 the backward remakes checkpoints (layer outputs) from the write chain of the layer
    below; that layer's own backward, far later, makes the whole chain again on a fresh matmul
    copy (two copies of the write, of its alias update and of the matmul it writes into), as
    checkpointing would, instead of holding the first copy's storage across the backward: the
    estimated peak falls (27,652 B against 28,164 B), the verifier accepts it and the gradients
    equal eager."""
    import warnings
    from collections import Counter

    import thunder_remat
    import thunder_remat.whole_graph.rewrite as rewrite

    args = [a.requires_grad_() for a in biased_attention_inputs()]
    eager = [a.detach().clone().requires_grad_() for a in args]
    biased_layers(*eager).pow(2).backward()

    def step():
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="thunder_remat")
            r = run(biased_layers, args, executors=[], remat=True, remat_memory_budget=0.5)
        plan = thunder_remat.last_save_plan(r.jitted)
        ops = {op.index: op.op for op in plan.problem.ops}
        return r, plan, Counter(ops[i] for i in plan.copied_ops)

    r, plan, copies = step()
    assert plan.failure is None and plan.checkpoint_ops
    assert (copies["copy_"], copies["update_aliases"]) == (2, 2)
    for got, want in zip(r.grads, (a.grad for a in eager)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    monkeypatch.setattr(rewrite._CopyScheduler, "group_made_for_outer_level", lambda self, i: False)
    _, held, held_copies = step()
    assert (held_copies["copy_"], held_copies["update_aliases"]) == (1, 1)
    assert (plan.peak_estimate, held.peak_estimate) == (27652, 28164)


def test_verify_rejects_a_write_run_twice_into_one_storage():
    """A hand-made rewrite: the backward runs the bias write once more into the matmul output the
    forward already wrote into (what the old copy schedule did). Every read is of a value made
    before it and nothing reads stale data by name: only counting the storage's writes finds it."""
    from thunder.core.proxies import variableify
    from thunder.core.symbol import BoundSymbolTag
    from thunder.core.trace import from_trace, tracectx

    from thunder_remat.plugin import last_joint_trace
    from thunder_remat.verify import verify

    args = [a.requires_grad_() for a in biased_attention_inputs()]
    r = run(biased_attention, args, executors=[], remat=True, remat_whole_graph=False)
    joint = last_joint_trace(r.jitted)
    assert verify(joint, joint) == []
    write = next(b for b in joint.bound_symbols if b.sym.name == "copy_")
    first_backward = next(i for i, b in enumerate(joint.bound_symbols) if BoundSymbolTag.BACKWARD in b.tags)
    bad = from_trace(joint)
    with tracectx(bad):
        out = write.flat_proxy_outs[0]
        again = write.from_bsym_swap_proxies({variableify(out): out.replace_name(f"{out.name}_again")},
                                             skip_output=False)
    bad.bound_symbols = [*joint.bound_symbols[:first_backward], again, *joint.bound_symbols[first_backward:]]
    problems = verify(joint, bad)
    assert any("receives 2 in-place write(s)" in p for p in problems), problems


def slice_assigned_mask(x, w):
    """A mask built by slice assignment (Gemma-2's sliding window, BLOOM's and Swin's masks)."""
    m = torch.full((8, 8), -1e9).triu(1).clone()
    m[:, :4] = m[:, :4].masked_fill(m[:, :4] == 0, -1e9)
    return torch.softmax((x @ w) @ x.transpose(-1, -2) + m, -1) @ x


@pytest.mark.parametrize("budget", [1.0, 0.5, 0.0])
def test_a_mask_built_by_slice_assignment_is_planned(budget):
    """``m[:, :4] = ...`` is ``copy_with_setitem`` (a copy) then ``copy_`` (the write). Copies of
    the write chain read the values they were made from; the plan is rewritten, not failed."""
    import thunder_remat

    g = torch.Generator().manual_seed(0)
    args = (torch.randn(2, 8, 16, generator=g).requires_grad_(), (torch.randn(16, 16, generator=g) / 4).requires_grad_())
    eager = [a.detach().clone().requires_grad_() for a in args]
    slice_assigned_mask(*eager).pow(2).sum().backward()
    r = run(slice_assigned_mask, args, executors=[], remat=True, remat_memory_budget=budget)
    assert thunder_remat.last_save_plan(r.jitted).failure is None
    for got, want in zip(r.grads, (a.grad for a in eager)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def position_buckets(x, w, table):
    """T5's relative position buckets: ``+=`` on integer tensors that need no gradient."""
    rel = torch.arange(8)[None, :] - torch.arange(8)[:, None]
    buckets = torch.zeros_like(rel)
    buckets += (rel > 0).to(torch.long) * 4
    rel = torch.abs(rel)
    buckets += torch.where(rel < 2, rel, torch.full_like(rel, 3))
    bias = torch.nn.functional.embedding(buckets, table).permute(2, 0, 1)
    return torch.softmax((x @ w) @ x.transpose(-1, -2) + bias, -1) @ x


@pytest.mark.parametrize("executors", ["no regions", pytest.param("torch.compile", marks=pytest.mark.inductor)])
def test_an_in_place_method_on_a_fresh_tensor_may_run_again(executors):
    """``add_`` into a tensor made in the forward is judged like ``copy_`` (it runs again only with
    its destination), not banned: at 1.0 thunder_remat saves no more than Thunder alone, which
    recomputes the buckets in the backward."""
    from thunder.executors.torch_compile import torch_compile_ex

    chosen = [torch_compile_ex] if executors == "torch.compile" else []
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(2, 8, 16, generator=g).requires_grad_(), (torch.randn(16, 16, generator=g) / 4).requires_grad_(),
            torch.randn(8, 2, generator=g).requires_grad_())
    alone = run(position_buckets, args, executors=chosen)
    ours = run(position_buckets, args, executors=chosen, remat=True, remat_memory_budget=1.0)
    assert ours.saved_bytes <= alone.saved_bytes
    for got, want in zip(ours.grads, alone.grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_verify_matches_values_across_traces_whatever_comes_first():
    """Value numbers are shared by the two traces verify compares: an extra, unread op at the start
    of the rewritten trace (so every later value is numbered in another order) changes nothing."""
    from thunder.core import prims
    from thunder.core.proxies import TensorProxy
    from thunder.core.trace import from_trace, tracectx

    from thunder_remat.plugin import last_joint_trace
    from thunder_remat.verify import verify

    args = [a.requires_grad_() for a in biased_attention_inputs()]
    r = run(biased_attention, args, executors=[], remat=True, remat_whole_graph=False)
    joint = last_joint_trace(r.jitted)
    first = next(i for i, b in enumerate(joint.bound_symbols) if b.sym.name == "matmul" or
                 any(s.sym.name == "matmul" for s in b.subsymbols))
    x = joint.args[0]
    shifted = from_trace(joint)
    with tracectx(shifted):
        extra = prims.neg.bind(x, output=TensorProxy(like=x))
    shifted.bound_symbols = [*joint.bound_symbols[:first], extra, *joint.bound_symbols[first:]]
    assert verify(joint, shifted) == []
