"""Tiny joint forward+backward traces built by hand, and fusion regions made from them, for the
stage-level (unit) tests: no thunder.jit, no compilation.

``joint_trace(forward, backward, inputs)`` records ``forward(*proxies)`` as the forward part and
``backward(*proxies, *forward_outputs)`` (returning the gradients) as the backward part, tagged
as Thunder 0.2.6's grad transform tags its joint trace, and ends with the same return.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from thunder.core import devices, dtypes, prims
from thunder.core.proxies import TensorProxy
from thunder.core.symbol import BoundSymbolTag
from thunder.core.trace import TraceCtx, tracectx

__all__ = ["tensor", "joint_trace", "fused", "chain_joint_trace", "reduction_joint_trace", "describe", "check_golden"]


def tensor(name: str, *shape: int, requires_grad: bool = True, dtype=dtypes.float32) -> TensorProxy:
    return TensorProxy(name, shape=tuple(shape), dtype=dtype, device=devices.cpu, requires_grad=requires_grad)


def joint_trace(forward: Callable, backward: Callable, inputs: Sequence[tuple]) -> TraceCtx:
    """``inputs``: (name, *shape) per argument; ``forward`` returns one tensor (the loss or an
    output), ``backward(*args, out, grad_out)`` the gradients of the arguments."""
    trace = TraceCtx()
    with tracectx(trace):
        args = [tensor(name, *shape) for name, *shape in inputs]
        trace.args = tuple(args)
        for a in args:
            prims.unpack_trivial(a, name=a.name)
        out = forward(*args)
        first_backward = len(trace.bound_symbols)
        grad_out = prims.get_grad(out)
        grads = backward(*args, out, grad_out)
        for bsym in trace.bound_symbols[first_backward:]:
            bsym.tags.add(BoundSymbolTag.BACKWARD)
        prims.python_return({"output": tuple(grads), "flat_args": list(args), "fw_flat_out": (out,)})
    return trace


def chain_joint_trace() -> tuple[TraceCtx, dict]:
    """linear -> exp -> sin -> square, and its backward, which reads exp's and sin's outputs:
    a matmul and a cheap chain after it. Returns the trace and its forward values by role
    (h, a, b, c)."""
    import thunder.torch as ltorch

    values = {}

    def forward(x, w):
        h = ltorch.linear(x, w)
        a = ltorch.exp(h)
        b = ltorch.sin(a)
        c = ltorch.mul(b, b)
        values.update(h=h, a=a, b=b, c=c)
        return c

    def backward(x, w, out, g):
        a, b = values["a"], values["b"]
        gb = ltorch.mul(ltorch.mul(g, 2.0), b)
        ga = ltorch.mul(gb, ltorch.cos(a))
        gh = ltorch.mul(ga, a)
        gx = ltorch.matmul(gh, w)
        gw = ltorch.matmul(ltorch.transpose(gh, 0, 1), x)
        return gx, gw

    return joint_trace(forward, backward, [("x", 4, 8), ("w", 16, 8)]), values


def reduction_joint_trace() -> tuple[TraceCtx, dict]:
    """exp -> sum over the last dim (16x smaller) -> scale; the backward reads the sum's output
    and exp's: a reduction the default policies prefer to keep. Values by role (e, s, y)."""
    import thunder.torch as ltorch

    values = {}

    def forward(x):
        e = ltorch.exp(x)
        s = ltorch.sum(e, -1, keepdim=True)
        y = ltorch.mul(e, s)
        values.update(e=e, s=s, y=y)
        return y

    def backward(x, out, g):
        e, s = values["e"], values["s"]
        ge = ltorch.mul(g, s)
        gs = ltorch.sum(ltorch.mul(g, e), -1, keepdim=True)
        gx = ltorch.mul(ltorch.add(ge, gs), e)
        return (gx,)

    return joint_trace(forward, backward, [("x", 4, 16)]), values


def fused(trace, executor=None):
    """``trace`` with its ops grouped into fusion regions by the eager fusion executor (the
    torch.compile executor's grouping, regions run by PyTorch; building one costs milliseconds),
    Thunder's own fusion-pair pass off, as while thunder_remat runs."""
    from thunder_remat.executors.hooks.builtin_pass import activated
    from thunder_remat.executors.eager import eager_fusion_ex

    with activated():
        return (executor or eager_fusion_ex).fusion_pass(trace)


def describe(trace) -> str:
    """A stable text of ``trace`` for golden files: one line per bound symbol (outputs, op, inputs,
    whether it runs in the backward), a region's body ops after it; no provenance, no timings."""
    from thunder_remat.trace_facts import is_backward, is_backward_region

    def names(proxies):
        return ", ".join(p.name for p in proxies)

    lines = []
    for bsym in trace.bound_symbols:
        where = "backward" if (is_backward(bsym) or is_backward_region(bsym)) else "forward"
        line = f"{where:8} ({names(bsym.flat_proxy_outs)}) = {bsym.sym.name}({names(bsym.flat_proxy_args)})"
        if bsym.sym.is_fusion:
            line += ": " + " ".join(sub.sym.name for sub in bsym.subsymbols)
        lines.append(line)
    return "\n".join(lines) + "\n"


def check_golden(name: str, text: str) -> None:
    """``text`` equals tests/golden/<name>.txt (THUNDER_REMAT_UPDATE_GOLDENS=1 rewrites it, after a
    deliberate change)."""
    import os
    from pathlib import Path

    path = Path(__file__).parent / "golden" / f"{name}.txt"
    if os.environ.get("THUNDER_REMAT_UPDATE_GOLDENS"):
        path.write_text(text)
    assert text == path.read_text(), f"golden {path.name} differs:\n{text}"
