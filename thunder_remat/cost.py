"""Bytes a value occupies: the capacity of its edge in a flow network.

Sizes are ``numel * itemsize`` of the real tensor, not just the element size. A dimension
that is not a known integer (a symbolic size under ``cache="symbolic values"``) counts as
``UNKNOWN_DIM`` elements: a documented guess that keeps such tensors comparable without
pretending to know their size.
"""

from __future__ import annotations

import math

from thunder.core import dtypes, prims
from thunder.core.proxies import NumberProxy, TensorProxy

from thunder_remat.policies import contraction_kind

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

    Each op is priced by what it does, never as free when it computes something:

    * contractions (``policies.CONTRACTIONS``): 2 * multiply-adds. Matmuls (and ``MATMUL_OP``
      ops): 2 * output elements * contracted size; convolutions: 2 * output elements * (input
      channels / groups) * kernel window (transposed: per input element); grouped matmuls and
      einsum from their operands; attention: 4 * query elements * key length;
    * pooling windows: output elements * window (adaptive pooling: the input elements);
    * sort, argsort, top-k: input elements * log2(size of the sorted dimension);
    * scans (cumsum, ...), gathers and scatters: the elements they read and write (a gather reads
      only the rows its index names, not the whole table);
    * interpolation and grid sampling: output elements * taps (1 nearest, 2 per linear dimension);
    * reductions: input elements; shape ops (views, reshapes): 0; Thunder's own prims and
      decomposed ops (pointwise): the elements of their largest tensor;
    * any other op (a torch op Thunder registered automatically, an executor's opaque op): the cost
      model does not know its work, so every element it reads and writes counts, never less.
    """
    ins = [p for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)]
    outs = [p for p in bsym.flat_proxy_outs if isinstance(p, TensorProxy)]
    if not outs:
        return 0.0
    name = bsym.sym.name
    priced = _priced_by_kind(bsym, name, ins, outs)
    if priced is not None:
        return float(priced)
    if "MATMUL_OP" in tag_names or name in ("linear", "matmul"):
        k = dim_size(ins[0].shape[-1]) if ins and ins[0].ndim >= 1 else 1
        return 2.0 * sum(numel(o) for o in outs) * k
    if "SHAPE_OP" in tag_names:
        return 0.0
    if "REDUCTION_OP" in tag_names:
        return float(sum(numel(i) for i in ins))
    if _thunder_knows(bsym):
        return float(max([numel(p) for p in ins + outs]))
    return float(sum(numel(p) for p in ins + outs))


def _thunder_knows(bsym) -> bool:
    """Ops of Thunder's own language (prims, torch-level symbols, its executors' ops for them) or
    with a decomposition: pointwise unless named otherwise. An op without either (a torch op
    Thunder 0.2.6 registers automatically, whose symbol lives in ``torch``: ``spmm``, ``addmm``,
    ``cummax``, ...; a custom op) is opaque to the cost model."""
    if bsym.subsymbols:
        return True
    module = getattr(getattr(bsym.sym, "module", None), "__name__", None) or ""
    return module.startswith("thunder.")


def _prod(values) -> int:
    n = 1
    for v in values:
        n *= dim_size(v)
    return n


def _arg(bsym, position: int, keyword: str, default=None):
    if keyword in bsym.kwargs:
        return bsym.kwargs[keyword]
    return bsym.args[position] if len(bsym.args) > position else default


#: interpolation taps per output element, by the mode in the op's name or ``mode`` argument
_TAPS = {"nearest": 1, "linear": 2, "bilinear": 4, "bicubic": 16, "trilinear": 8, "area": 1}
#: matmuls written a @ b on their last two tensors (the add* ops add a first tensor)
_A_AT_B = frozenset({"mm", "spmm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot"})
_SORTS = frozenset({"sort", "argsort", "msort", "topk", "kthvalue"})
_SCANS = frozenset({"cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"})
_GATHERS = frozenset({"gather", "take", "take_along_axis", "take_along_dim", "index_select", "embedding",
                      "embedding_bag"})
_SCATTERS = frozenset({"scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy", "index_put",
                       "index_fill", "index_reduce", "masked_scatter"})


def _priced_by_kind(bsym, name: str, ins, outs) -> float | None:
    """The price of an op that is not elementwise (see ``op_flops``), or None for the others."""
    out = numel(outs[0])
    base = name.removeprefix("torch.ops.").removeprefix("aten.").removesuffix(".default")
    kind = contraction_kind(name)
    if kind == "attention" and len(ins) >= 3:
        # Thunder's own attention and the CUDA sdpa executor's forward ops take (q, k, v, ...)
        q, k = ins[0], ins[1]
        return 4.0 * numel(q) * dim_size(k.shape[-2]) if k.ndim >= 2 else float(numel(q))
    if kind in ("convolution", "transposed convolution") and len(ins) >= 2 and ins[1].ndim >= 3:
        weight = ins[1]
        transposed = kind == "transposed convolution" or (base in ("convolution", "_convolution")
                                                          and bool(_arg(bsym, 6, "transposed", False)))
        # weight: (out, in / groups, *kernel); transposed: (in, out / groups, *kernel), each input
        # element spread over out / groups channels and the window
        per_element = dim_size(weight.shape[1]) * _prod(weight.shape[2:])
        return 2.0 * (numel(ins[0]) if transposed else out) * per_element
    if kind == "grouped matmul" and len(ins) >= 2:
        a, b = ins[0], ins[1]
        if a.ndim == 2 and b.ndim == 2:  # (m, k) x (k, n) -> (groups, m, n): k split among groups
            return 2.0 * numel(a) * dim_size(b.shape[-1])
        return 2.0 * out * dim_size(a.shape[-1])
    if base == "einsum":
        return _einsum_flops(bsym, ins)
    if base in ("tensordot", "inner") and len(ins) >= 2:
        # no batch dimensions: a = M*K, b = K*N, out = M*N, so K = sqrt(a * b / out)
        return 2.0 * math.sqrt(float(numel(ins[0])) * numel(ins[1]) * out)
    if base == "bilinear" and len(ins) >= 3 and ins[2].ndim >= 2:  # x1^T W x2 per output element
        return 2.0 * out * _prod(ins[2].shape[-2:])
    if base == "chain_matmul":
        return 2.0 * out * sum(dim_size(t.shape[-1]) for t in ins[:-1])
    if base in _A_AT_B and len(ins) >= 2:
        # a @ b, with an added term first for the add* ops: 2 * a's elements * b's columns
        a, b = ins[-2], ins[-1]
        return 2.0 * numel(a) * (dim_size(b.shape[-1]) if b.ndim >= 2 else 1)
    if "unpool" in base:
        return float(out + sum(numel(i) for i in ins))
    if "pool" in base and ins:
        if "adaptive" in base:  # every input element falls in some window
            return float(max(numel(ins[0]), out))
        dims = next((int(c) for c in base if c.isdigit()), max(ins[0].ndim - 2, 1))
        kernel = _arg(bsym, 2 if base.startswith("lp_pool") or "backward" in base else 1, "kernel_size", 1)
        if isinstance(kernel, TensorProxy) or not isinstance(kernel, (int, tuple, list)):
            return float(max(numel(p) for p in ins + outs))  # a window it does not name
        window = _prod(kernel) if isinstance(kernel, (tuple, list)) else dim_size(kernel) ** dims
        # the backward scatters each gradient over its window into the input
        return float((numel(ins[0]) if "backward" in base else out) * max(window, 1))
    if base in _SORTS and ins:
        x = ins[0]
        dim = _arg(bsym, 2 if base in ("topk", "kthvalue") else 1, "dim", -1)
        size = dim_size(x.shape[dim]) if isinstance(dim, int) and -x.ndim <= dim < x.ndim else numel(x)
        return float(numel(x) * max(math.ceil(math.log2(max(size, 2))), 1))
    if base in _SCANS and ins:  # one combine per element
        return float(numel(ins[0]))
    if base in _GATHERS:
        # each output element read through the index, plus the index: not the whole table
        return float(out + sum(numel(i) for i in ins if dtypes.is_exact_dtype(i.dtype)))
    if base in _SCATTERS and ins:
        # the destination copied, then each source (and index) element read and combined
        return float(out + sum(numel(i) for i in ins[1:]))
    if "upsample" in base or "interpolate" in base or "grid_sample" in base:
        mode = _arg(bsym, 3 if "interpolate" in base else 2, "mode", None)
        if not isinstance(mode, str):
            named = (m for m in ("trilinear", "bilinear", "bicubic", "linear", "nearest") if m in base)
            mode = next(named, "nearest" if "interpolate" in base else "bilinear")
        taps = _TAPS.get(mode, 4)
        if mode == "bilinear" and "grid_sample" in base and ins and ins[0].ndim == 5:
            taps = _TAPS["trilinear"]
        return float(out * taps)
    return None


def _einsum_flops(bsym, ins) -> float:
    """2 * the product of every index's size: one multiply-add per point of the joint index space
    (exact for two operands; an upper bound of the best contraction order for more)."""
    equation = next((a for a in bsym.args if isinstance(a, str)), None)
    if equation is None or "..." in equation:
        return 2.0 * max(numel(i) for i in ins) if ins else 0.0
    sizes: dict[str, int] = {}
    for spec, operand in zip(equation.split("->")[0].split(","), ins):
        for letter, dim in zip(spec.strip(), operand.shape):
            sizes[letter] = dim_size(dim)
    return 2.0 * _prod(sizes.values())
