"""Bytes a value occupies: the capacity of its edge in a flow network.

Sizes are ``numel * itemsize`` of the real tensor, not just the element size. A dimension
that is not a known integer (a symbolic size under ``cache="symbolic values"``) counts as
``UNKNOWN_DIM`` elements: a documented guess that keeps such tensors comparable without
pretending to know their size.
"""

from __future__ import annotations

from thunder.core.proxies import NumberProxy, TensorProxy

#: Elements assumed for a dimension whose size is not known at compile time.
UNKNOWN_DIM = 1024


def dim_size(dim) -> int:
    """A dimension as an int; symbolic dims fall back to their traced value, then ``UNKNOWN_DIM``."""
    if isinstance(dim, bool):
        return int(dim)
    if isinstance(dim, int):
        return dim
    value = getattr(dim, "value", None)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return UNKNOWN_DIM


def value_bytes(proxy) -> int:
    """Memory held by ``proxy`` if it is materialized; numbers and other scalars cost nothing."""
    if isinstance(proxy, TensorProxy):
        return numel(proxy) * proxy.dtype.bytes
    if isinstance(proxy, NumberProxy):
        return 0
    return 0


def numel(proxy) -> int:
    n = 1
    for dim in proxy.shape:
        n *= dim_size(dim)
    return n


def op_flops(bsym, tag_names) -> float:
    """A rough cost of running ``bsym`` once, in floating-point operations, from shapes only.

    Matmul-like ops: 2 * output elements * contracted size; reductions: input elements; shape ops
    (views, reshapes): 0; everything else (pointwise): the elements it touches.
    """
    ins = [p for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)]
    outs = [p for p in bsym.flat_proxy_outs if isinstance(p, TensorProxy)]
    if not outs:
        return 0.0
    name = bsym.sym.name
    # Thunder's own attention and the CUDA sdpa executor's forward ops
    # (sdpaex_grad_forward_scaled_dot_product_{efficient,flash}_attention) take (q, k, v, ...).
    if (name == "sdpa" or "scaled_dot_product" in name) and len(ins) >= 3:
        q, k = ins[0], ins[1]
        return 4.0 * numel(q) * dim_size(k.shape[-2]) if k.ndim >= 2 else float(numel(q))
    if "MATMUL_OP" in tag_names or name in ("linear", "matmul"):
        k = dim_size(ins[0].shape[-1]) if ins and ins[0].ndim >= 1 else 1
        return 2.0 * sum(numel(o) for o in outs) * k
    if "SHAPE_OP" in tag_names:
        return 0.0
    if "REDUCTION_OP" in tag_names:
        return float(sum(numel(i) for i in ins))
    return float(max([numel(p) for p in ins + outs]))
