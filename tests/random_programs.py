"""Random PyTorch programs for property-based tests (hypothesis strategies), and how to check one.

A program is a list of steps over a pool of tensors that starts with the inputs. Each step reads
one or two pool entries (chosen at random, so values get any number of consumers) and appends a
result: pointwise, broadcasting, reduction, reshape/view, matmul, dropout, or an in-place write
(``WRITES``: into a fresh copy, a matmul's output, a view of a base, a mask by slice assignment,
an integer tensor). Operands are drawn from the whole pool, so a value often has a second use far
from its first. The function returns the sum of the last pool entries' squares.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import thunder
import torch
import torch.nn.functional as F
from hypothesis import reject
from hypothesis import strategies as st

import thunder_remat
from thunder_remat.inspect.measure import saved_for_backward

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}

UNARY = ("tanh", "sigmoid", "relu", "neg", "exp_small", "scale")
#: in-place writes into intermediates: a fresh copy, a matmul's output, through a view into its
#: base, a mask built by slice assignment, an integer tensor that needs no gradient
WRITES = ("inplace", "inplace_matmul", "inplace_view", "mask", "int_inplace")
STEPS = UNARY + ("add", "mul", "bias", "row_sum", "reshape", "transpose2", "matmul", "dropout", "int_mix") + WRITES


@dataclass(frozen=True)
class Program:
    batch: int
    width: int
    dtype: str
    steps: tuple  # (kind, operand index a, operand index b)
    outputs: int

    def __call__(self, x, w, b, k):
        pool = [x]
        for kind, ia, ib in self.steps:
            a, c = pool[ia % len(pool)], pool[ib % len(pool)]
            pool.append(_apply(kind, a, c, w, b, k))
        return sum(t.float().pow(2).sum() for t in pool[-self.outputs:])

    def inputs(self, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        dt = DTYPES[self.dtype]
        x = (torch.randn(self.batch, self.width, generator=g) * 0.5).to(dt).requires_grad_()
        w = (torch.randn(self.width, self.width, generator=g) / self.width**0.5).to(dt).requires_grad_()
        b = (torch.randn(self.width, generator=g) * 0.1).to(dt).requires_grad_()
        k = torch.randint(0, 3, (self.batch, self.width), generator=g)
        return x, w, b, k


def _apply(kind, a, c, w, b, k):
    if kind == "tanh":
        return torch.tanh(a)
    if kind == "sigmoid":
        return torch.sigmoid(a)
    if kind == "relu":
        return F.relu(a)
    if kind == "neg":
        return -a
    if kind == "exp_small":
        return torch.exp(torch.tanh(a))
    if kind == "scale":
        return a * 0.5
    if kind == "add":
        return a + c
    if kind == "mul":
        return a * torch.tanh(c)
    if kind == "bias":
        return a + b
    if kind == "row_sum":
        return a * torch.tanh(a.sum(dim=-1, keepdim=True))
    if kind == "reshape":
        return a.reshape(a.shape[0], -1, 2).transpose(1, 2).reshape(a.shape)
    if kind == "transpose2":
        return a.t().contiguous().t() + 1
    if kind == "matmul":
        return a @ w
    if kind == "dropout":
        return F.dropout(a, p=0.3, training=True)
    if kind == "inplace":
        t = a * 1.0
        t.mul_(0.75)
        return t
    if kind == "int_mix":
        return a + k.to(a.dtype) * 0.1
    if kind == "inplace_matmul":
        t = a @ w
        t += torch.tanh(c)
        return t
    if kind == "inplace_view":
        t = a * 1.0
        t[:, : t.shape[1] // 2] *= 2.0
        return t
    if kind == "mask":
        half = a.shape[1] // 2
        m = torch.zeros_like(a)
        m[:, :half] = c[:, :half].masked_fill(c[:, :half] > 0, -1.0)
        return a + m
    if kind == "int_inplace":
        buckets = k.clone()
        buckets += (k > 0).to(k.dtype) * 2
        return a * buckets.to(a.dtype)
    raise ValueError(kind)


def programs(max_steps: int = 8, dtypes=tuple(DTYPES)):
    step = st.tuples(st.sampled_from(STEPS), st.integers(0, 64), st.integers(0, 64))
    return st.builds(
        Program,
        batch=st.sampled_from([2, 4]),
        width=st.sampled_from([4, 8]),
        dtype=st.sampled_from(dtypes),
        steps=st.lists(step, min_size=1, max_size=max_steps).map(tuple),
        outputs=st.integers(1, 3),
    )


@dataclass
class Outcome:
    outputs: torch.Tensor
    grads: list
    saved: object
    jitted: object


def run(program: Program, executor, seed: int = 7, **options) -> Outcome:
    x, w, b, k = program.inputs()
    jm = thunder.jit(program, executors=[executor], **options)
    torch.manual_seed(seed)
    out, saved = saved_for_backward(jm, x, w, b, k)
    out.backward()
    return Outcome(out.detach(), [t.grad for t in (x, w, b)], saved, jm)


def check(program: Program, executor, budget=1.0) -> None:
    """Outputs and gradients equal to the run without thunder_remat; no thunder_remat warning (so every
    rewrite passed verification); the activation storages really saved equal the plan's bytes; at
    budget 1.0, no more activation bytes than Thunder's own pass.
    Programs Thunder 0.2.6 itself cannot run (without thunder_remat) are rejected, not counted."""
    try:
        base = run(program, executor)
    except Exception:  # a Thunder/torch limitation, e.g. a torch.compile region reading an undefined name
        reject()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="thunder_remat")
        ours = run(program, executor, remat=True, remat_memory_budget=budget)
    atol, rtol = TOLERANCE[DTYPES[program.dtype]]
    torch.testing.assert_close(ours.outputs, base.outputs, atol=atol, rtol=rtol)
    for g, g0 in zip(ours.grads, base.grads):
        if g0 is None:
            assert g is None
        else:
            torch.testing.assert_close(g, g0, atol=atol, rtol=rtol)
    plan = thunder_remat.last_save_plan(ours.jitted)
    assert plan is not None and plan.failure is None, plan and plan.failure
    # the storages the forward really hands to the backward are the bytes the plan promised
    assert ours.saved.activation_bytes == plan.choice.plan.saved_bytes, (ours.saved, plan.choice.plan.saved_bytes)
    if budget == 1.0:
        assert ours.saved.activation_bytes <= base.saved.activation_bytes, (ours.saved, base.saved)
