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
