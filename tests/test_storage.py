"""thunder_remat.storage: which values share a storage, checked against what PyTorch really does."""

import pytest
import thunder
import torch

import thunder_remat
from thunder_remat.trace_facts import forward_storages
from thunder_remat.models import build_model, example_batch

from helpers import forward_tensors, joint_trace

pytestmark = pytest.mark.jit


def disagreements(joint, inputs):
    """Forward values on which the static storage owners and a real run disagree."""
    storages = forward_storages(joint)
    tensors = forward_tensors(joint, inputs)
    known = [n for n in tensors if n in storages.owner]
    ptr = {n: tensors[n].untyped_storage().data_ptr() for n in known}
    wrong = []
    for a in known:
        for b in known:
            if a < b and (ptr[a] == ptr[b]) != (storages.owner_of(a) == storages.owner_of(b)):
                wrong.append((a, b, storages.owner_of(a), storages.owner_of(b)))
    for n in known:  # the bytes a storage is counted at are the bytes it has
        owner = storages.owner_of(n)
        if owner in tensors and ptr[n] == ptr[owner]:
            assert storages.owner_bytes[owner] == tensors[owner].untyped_storage().nbytes(), n
        sized = [d for d, size in enumerate(tensors[n].shape) if size != 1]  # and the strides it has
        if [storages.strides[n][d] for d in sized] != [tensors[n].stride()[d] for d in sized]:
            wrong.append((n, "strides", storages.strides[n], tensors[n].stride()))
    return wrong, len(known)


def views(x, w):
    y = x @ w  # 8 x 12, fresh
    a, b, c = y.split(4, dim=1)  # views of y
    t = a.transpose(0, 1)  # a view
    s = t * 2  # fresh, transposed as t is (elementwise outputs keep the operands' layout)
    u = s.reshape(16, 2)  # so a copy
    r = b.reshape(2, 4, 4)  # a view: b's rows are one block each
    q = t.reshape(16, 2)  # a copy: t is transposed
    e = y[:1].expand(3, 12)  # a view of a view
    k = y.contiguous()  # y itself
    f = y.to(torch.float32)  # y itself
    g = c.contiguous()  # a copy of a slice
    h = y.view(2, 4, 12).permute(2, 0, 1).reshape(12, 8)  # a copy
    p = y.repeat(2, 1)  # a copy
    return (u, r + 1, q - 1, e * 3, k + f, g, h, p)


def test_the_owners_of_views_and_copies_are_those_pytorch_makes():
    x, w = torch.randn(8, 6, requires_grad=True), torch.randn(6, 12, requires_grad=True)
    joint, _ = joint_trace(views, (x, w))
    wrong, checked = disagreements(joint, {"x": x, "w": w})
    assert checked >= 15 and wrong == []


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_the_owners_in_a_model_forward_are_those_pytorch_makes(name):
    model = build_model(name, "tiny")
    x = example_batch(model)
    joint, _ = joint_trace(model, (x,))
    inputs = {"idx": x, **{"t_" + name.replace(".", "_"): p for name, p in model.named_parameters()},
              **{"t_" + name.replace(".", "_"): b for name, b in model.named_buffers()}}
    wrong, checked = disagreements(joint, inputs)
    assert checked > 50 and wrong == []


def test_a_recomputed_composite_gets_storages_of_its_own():
    """A copy of a composite op (softmax here) reuses the names inside its decomposition; its
    outputs still own new storage, not the forward op's."""

    def f(x, w):
        return torch.softmax(x, dim=-1) @ w

    x, w = torch.randn(8, 16, requires_grad=True), torch.randn(16, 4, requires_grad=True)
    _, result = joint_trace(f, (x, w), remat_memory_budget=0.0)
    storages = forward_storages(result.trace, with_backward=True)
    copies = [p.name for b in result.trace.bound_symbols for p in b.flat_proxy_outs if p.name.startswith("rc_")]
    assert copies
    for name in copies:
        assert storages.owner_of(name).startswith("rc_"), (name, storages.owner_of(name))


def _dead_inplace_copy(x, w):
    t = (x @ w) * 1.0
    t.mul_(0.75)  # a dead in-place update: kept by dead-code elimination, run in the backward
    return torch.tanh(x).pow(2).sum()


@pytest.mark.parametrize("case", ["gpt", "dead in-place copy"])
def test_the_split_model_saves_what_thunders_split_saves(case):
    from thunder.core.transform_common import dce
    from thunder.transforms.autodiff import split_into_forward_and_backward

    from thunder_remat.trace_facts import thunder_split

    from thunder.core.compile_data import compile_data_and_stats

    if case == "gpt":
        model = build_model("gpt", "tiny")
        joint, _, jitted = joint_trace(model, (example_batch(model),), with_jitted=True)
    else:
        args = (torch.randn(4, 8, requires_grad=True), torch.randn(8, 8))
        joint, _, jitted = joint_trace(_dead_inplace_copy, args, with_jitted=True)
    with compile_data_and_stats(thunder.compile_data(jitted), thunder.compile_stats(jitted)):
        forward, _ = split_into_forward_and_backward(dce(joint))
    saved = [p.name for p in forward.output[1][0]]
    assert saved and set(thunder_split(joint).saved) == set(saved)


def biased_scores(x, w, bias):
    scores = (x @ w).view(4, 8, 2, 8).transpose(1, 2) @ x.view(4, 8, 2, 8).permute(0, 2, 3, 1)
    scores += bias  # written in place: a copy_ into the matmul's output after Thunder's functionalization
    return scores.softmax(-1)


@pytest.mark.parametrize("name", ["gpt", "llama", "in-place", "llama bfloat16"])
def test_the_walk_of_the_executed_traces_matches_a_real_run(name):
    """The traces that run (after the rewrite, Thunder's split and its executors, forward and
    backward), run on random inputs: values the walk puts on one storage share one, the others do
    not, and every value has the strides the walk gives it (a copy_ after fusion is a write into its
    destination; elementwise outputs keep their operands' layout)."""
    from helpers import executed_tensors
    from thunder.core.proxies import Proxy
    from thunder.core.pytree import tree_flatten

    from thunder_remat.storage import storage_map

    if name == "in-place":
        jm = thunder.jit(biased_scores, remat=True, remat_memory_budget=0.0)
        jm(torch.randn(4, 8, 16), torch.randn(16, 16, requires_grad=True), torch.randn(2, 8, 8)).sum().backward()
        assert any(b.sym.name == "copy_" for b in thunder.last_traces(jm)[-1].bound_symbols)
    else:
        model = build_model(name.split()[0], "tiny")
        if name.endswith("bfloat16"):  # conversions around the normalizations and the loss
            model = model.to(torch.bfloat16)
        jm = thunder.jit(model, remat=True, remat_memory_budget=0.0)
        jm(example_batch(model)).sum().backward()
    for trace in (thunder.last_traces(jm)[-1], thunder.last_backward_traces(jm)[-1]):
        storages = storage_map(trace.bound_symbols,
                               [p for p in tree_flatten((trace.args, trace.kwargs))[0] if isinstance(p, Proxy)])
        tensors = {n: t for n, t in executed_tensors(trace).items() if n in storages.owner and t.numel()}
        ptr = {n: t.untyped_storage().data_ptr() for n, t in tensors.items()}
        by_owner, by_ptr = {}, {}
        for n in tensors:
            by_owner.setdefault(storages.owner_of(n), set()).add(ptr[n])
            by_ptr.setdefault(ptr[n], set()).add(storages.owner_of(n))
        assert len(tensors) > (100 if name != "in-place" else 5)
        assert [o for o, ptrs in by_owner.items() if len(ptrs) > 1] == []  # one owner, one storage
        assert [o for o in by_ptr.values() if len(o) > 1] == []  # one storage, one owner
        for n, t in tensors.items():
            sized = [d for d, size in enumerate(t.shape) if size != 1]
            assert [storages.strides[n][d] for d in sized] == [t.stride()[d] for d in sized], n
