"""Estimate, from shapes alone, the most tensor bytes alive at once while a joint trace runs.

Used to compare rewrites of one trace (which backward checkpoints give the lowest peak), not to
predict an allocator: it walks the joint forward+backward trace in order, allocates each op's
tensor outputs, frees a tensor after the last op that reads it, and counts views as sharing their
base's storage, which then lives until the last read of any of its views. A view is a shape op or
an op made only of shape ops (``torch.reshape`` is ``prims.reshape`` inside), as PyTorch runs
them on a contiguous tensor; a reshape or ``contiguous`` of a transposed, broadcast or sliced
tensor copies it. Forward inputs and parameters are held anyway and not counted. The
forward/backward split keeps exactly the forward values the backward reads, which the walk keeps
alive the same way.
"""

from __future__ import annotations

from thunder.core.proxies import TensorProxy

from thunder_remat.cost import value_bytes
from thunder_remat.joint_analysis import split_joint

__all__ = ["estimate_peak_bytes"]


#: shape prims whose output is not contiguous, so that a later reshape of it copies
_STRIDING = frozenset({"transpose", "broadcast_in_dim", "slice_prim", "unfold"})
#: shape prims that copy a non-contiguous input (and are views of a contiguous one)
_COPYING_IF_STRIDED = frozenset({"reshape", "stride_order"})


def _shape_prims(bsym) -> list[str] | None:
    """The shape prims ``bsym`` is made of, or None if it computes anything."""
    if any(getattr(tag, "name", "") == "SHAPE_OP" for tag in (bsym.sym.tags or ())):
        return [bsym.sym.name]
    if not bsym.subsymbols:
        return None
    names: list[str] = []
    for sub in bsym.subsymbols:
        inner = _shape_prims(sub)
        if inner is None:
            return None
        names += inner
    return names


def estimate_peak_bytes(trace) -> int:
    """The estimated peak of live tensor bytes (inputs excluded) over a joint trace."""
    _, _, inputs = split_joint(trace)
    bsyms = trace.bound_symbols
    root: dict[str, str] = {}  # tensor name -> name of the tensor that owns its storage
    size: dict[str, int] = {}  # owning tensor -> bytes
    last_read: dict[str, int] = {}  # owning tensor -> index of the last op reading it or a view of it
    strided: set[str] = set()  # views that are not contiguous
    for idx, bsym in enumerate(bsyms):
        for p in bsym.flat_proxy_args:
            if isinstance(p, TensorProxy) and p.name in root:
                last_read[root[p.name]] = idx
        prims = _shape_prims(bsym)
        base = next((p for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)), None) if prims else None
        if base is not None and base.name in strided and _COPYING_IF_STRIDED.intersection(prims):
            base = None  # a copy
        for p in bsym.flat_proxy_outs:
            if not isinstance(p, TensorProxy) or p.name in root or p.name in inputs:
                continue
            if base is not None and (base.name in strided or _STRIDING.intersection(prims)):
                strided.add(p.name)
            if base is not None and base.name in root:
                root[p.name] = root[base.name]
            elif base is not None:  # a view of an input: held anyway
                inputs.add(p.name)
            else:
                root[p.name] = p.name
                size[p.name] = value_bytes(p)
                last_read.setdefault(p.name, idx)
    frees: dict[int, list[str]] = {}
    for name, idx in last_read.items():
        frees.setdefault(idx, []).append(name)
    live = peak = 0
    for idx, bsym in enumerate(bsyms):
        for p in bsym.flat_proxy_outs:
            if isinstance(p, TensorProxy) and root.get(p.name) == p.name:
                live += size[p.name]
        peak = max(peak, live)
        for name in frees.get(idx, ()):
            live -= size[name]
    return peak
