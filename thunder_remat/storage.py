"""Which tensor values of a trace share a storage: what a saved value really keeps alive.

The backward holds storages, not values. A view (a slice, a split, a transpose, an expand, a
reshape of a contiguous tensor) keeps its whole base alive; several views of one base hold that
base once; a view of a parameter holds nothing beyond the parameter. ``storage_map`` walks bound
symbols in order and records, for every tensor value, the value that owns its storage (its
*owner*, itself for a fresh tensor) and each owner's bytes.

Two answers per value, because the runtime decides some cases (``torch.reshape`` and
``Tensor.contiguous`` return a view when the input's strides allow it, a copy otherwise):

* ``owner``: the best guess, following each value's strides as PyTorch computes them (a reshape
  is a view when the strides allow it: splitting a sliced projection into heads; a copy when they
  do not: merging the heads of a transposed attention output), used to count bytes. A fresh
  tensor is contiguous, but for what an elementwise op, a conversion or a clone makes: PyTorch
  lays that out as its operands are (TensorIterator's order of dimensions);
* ``maybe_view``: every value an op may return as a view of one of its inputs, whatever the
  strides. The planners never choose to save such a value: they save what it is a view of, or
  recompute it in the backward (a view costs nothing to make, a copying reshape one copy), so a
  saved set is made of fresh tensors whose bytes are exactly their storages'.

Composite ops are read through their decomposition, fusion regions through their bodies: an
output that is a view of a value inside the op (``q``/``k``/``v`` split from a fused projection
inside one region) shares that value's storage with the op's other views of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from thunder.core.devices import to_torch_device
from thunder.core.dtypes import is_float_dtype
from thunder.core.prims import PrimIDs
from thunder.core.proxies import TensorProxy
from thunder.torch import to_torch_dtype

from thunder_remat.cost import dim_size, value_bytes
from thunder_remat.kernel_workspace import (ConvolutionCall, MatmulCall, TensorSpec, convolution_workspace,
                                            matmul_workspace)

__all__ = ["StorageMap", "accumulate_grad_copy", "matmul_copy_elements", "measured_workspace", "prim_id",
           "storage_map"]

#: prims whose output is a view of their first tensor argument (Thunder 0.2.6's torch executor
#: runs them as torch views, or returns the input itself: shallow_copy, update_aliases)
_VIEW_PRIMS = frozenset({
    PrimIDs.BROADCAST_IN_DIM, PrimIDs.RESHAPE, PrimIDs.SQUEEZE, PrimIDs.TRANSPOSE, PrimIDs.UNFOLD,
    PrimIDs.VIEW, PrimIDs.SHALLOW_COPY, PrimIDs.SLICE, PrimIDs.BITCAST, PrimIDs.UPDATE_ALIASES,
})
#: prims that return their input itself when they have nothing to do (same dtype, same device)
_NOOP_WHEN_SAME = {PrimIDs.CONVERT_ELEMENT_TYPE: "dtype", PrimIDs.DEVICE_PUT: "device"}
#: prims computed element by element (torch runs them through TensorIterator, whose output keeps
#: the operands' memory layout)
_ELEMENTWISE_PRIMS = frozenset(getattr(PrimIDs, name) for name in (
    "ABS", "ACOS", "ACOSH", "ADD", "ASIN", "ASINH", "ATAN", "ATAN2", "ATANH", "BITWISE_AND",
    "BITWISE_LEFT_SHIFT", "BITWISE_NOT", "BITWISE_OR", "BITWISE_RIGHT_SHIFT", "BITWISE_XOR", "CEIL", "COS",
    "COSH", "DIGAMMA", "DIV", "EQ", "ERF", "ERFC", "ERFCINV", "ERFINV", "EXP", "EXP2", "EXPM1", "FLOOR", "FMOD",
    "GE", "GT", "ISFINITE", "LE", "LGAMMA", "LOG", "LOG10", "LOG1P", "LOG2", "LT", "MAXIMUM", "MINIMUM", "MUL",
    "NDTRI", "NE", "NEG", "NEXTAFTER", "POW", "RECIPROCAL", "REMAINDER", "ROUND", "RSQRT", "SIGN", "SIGNBIT",
    "SIN", "SINH", "SQRT", "SUB", "TAN", "TANH", "TRUNC", "WHERE", "ZETA") if hasattr(PrimIDs, name))
#: copies that keep their input's order of dimensions (``Tensor.to``, ``clone``, ``flip``: ATen
#: makes their output ``empty_like`` the input, preserving its layout)
_COPIES_KEEPING_LAYOUT = frozenset({PrimIDs.CONVERT_ELEMENT_TYPE, PrimIDs.CLONE, PrimIDs.FLIP})
#: what an elementwise op's decomposition may add around its elementwise prims
_AROUND_ELEMENTWISE = frozenset({PrimIDs.BROADCAST_IN_DIM}) | _COPIES_KEEPING_LAYOUT
#: ``Tensor.contiguous`` runs as one torch call: the input itself when already contiguous
_CONTIGUOUS = "torch.Tensor.contiguous"
#: Thunder 0.2.6's torch executor runs these prims through symbols of its own (ids) that carry no
#: decomposition (traces after fusion have them outside regions)
_EXECUTOR_PRIMS = {
    "torch_prims_reshape_impl": PrimIDs.RESHAPE, "torch_slice_prim_impl": PrimIDs.SLICE,
    "shallow_copy": PrimIDs.SHALLOW_COPY, "update_aliases": PrimIDs.UPDATE_ALIASES, "bitcast": PrimIDs.BITCAST,
    "copy_": PrimIDs.COPY_, "convolution": PrimIDs.CONVOLUTION,
}


def prim_id(bsym):
    """The prim ``bsym`` runs: its symbol's id, the prim's for Thunder 0.2.6's torch executor ops
    that run one (by id: ltorch's ``Tensor.copy_`` is named ``copy_`` too, and writes its first
    argument)."""
    sid = bsym.sym.id
    return sid if isinstance(sid, PrimIDs) else _EXECUTOR_PRIMS.get(sid, sid)


@dataclass(frozen=True)
class StorageMap:
    """Storage owners of the tensor values seen in one walk (see the module docstring)."""

    #: tensor value -> the value owning its storage (itself for a fresh tensor); best guess
    owner: dict
    #: owner -> bytes of its storage
    owner_bytes: dict
    #: values an op may have returned as a view of one of its inputs
    maybe_view: frozenset
    #: owners held anyway (forward inputs: arguments, parameters, buffers)
    held: frozenset
    #: tensor value -> its strides (elements), best guess (fresh tensors contiguous)
    strides: dict = field(default_factory=dict, repr=False, compare=False)
    #: the walk's state, to continue it over more bound symbols (``extended``)
    _walk: object = field(default=None, repr=False, compare=False)
    #: (id(bound symbol), channels-last, or "gradients" for the return) -> (it, its workspace
    #: bytes): every schedule of a trace walks its ops
    _workspaces: dict = field(default_factory=dict, repr=False, compare=False)

    def extended(self, bsyms) -> StorageMap:
        """This map continued over ``bsyms`` (which come after the ones it was made from)."""
        walk = self._walk.copy()
        for bsym in bsyms:
            walk.visit(bsym)
        return walk.result()

    def owner_of(self, name: str) -> str:
        return self.owner.get(name, name)

    def bytes_held(self, names: Iterable[str], sizes: dict | None = None) -> int:
        """Bytes of the distinct storages ``names`` keep alive, leaving out held ones.

        A name the walk never saw counts as its own storage of ``sizes[name]`` bytes (0 if absent).
        """
        owners = {}
        for name in names:
            root = self.owner.get(name)
            if root is None:
                owners.setdefault(name, (sizes or {}).get(name, 0))
            elif root not in self.held:
                owners.setdefault(root, self.owner_bytes[root])
        return sum(owners.values())

    def workspace_bytes(self, bsym, channels_last_convolution: bool = False) -> int:
        """Bytes the op allocates and frees inside itself, as PyTorch runs it. ``torch.matmul``
        (and ``linear`` of a non-contiguous input, which calls it) copies a batched operand whose
        strides do not fold into (batch, rows, columns) before its ``bmm``. A library kernel's
        own memory is measured (``kernel_workspace``): a convolution's (oneDNN's reordered
        operands and scratch; with ``channels_last_convolution`` a 2-d convolution on
        channels-last operands, as a compiler that converts them calls it), a bfloat16 or float16
        matmul's on CPU (oneDNN's packed operands, the copies included). 0 for other ops."""
        name = bsym.sym.name
        convolution = prim_id(bsym) is PrimIDs.CONVOLUTION
        if name not in ("matmul", "linear") and not convolution:
            return 0
        key = (id(bsym), channels_last_convolution and convolution)
        known = self._workspaces.get(key)
        if known is None or known[0] is not bsym:
            bytes_ = (self._convolution_workspace(bsym, key[1]) if convolution
                      else self._matmul_workspace(bsym, name))
            known = self._workspaces[key] = (bsym, bytes_)
        return known[1]

    def _convolution_workspace(self, bsym, channels_last: bool) -> int:
        a, weight, bias, stride, padding, dilation, transposed, output_padding, groups = bsym.args[:9]
        if not all(isinstance(p, TensorProxy) for p in (a, weight)) or not isinstance(bias, (TensorProxy, type(None))):
            return 0

        def ints(values):
            return tuple(int(v) for v in values)

        return convolution_workspace(ConvolutionCall(
            self._spec(a, channels_last), self._spec(weight, channels_last), self._spec(bias), ints(stride),
            ints(padding), ints(dilation), bool(transposed), ints(output_padding), int(groups)))

    def _matmul_workspace(self, bsym, name: str) -> int:
        args = [p for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)]
        if len(args) < 2 or any(p.name not in self.strides for p in args[:2]):
            return 0
        a, b = args[0], args[1]
        if _packed_by_onednn(a):
            bias = args[2] if name == "linear" and len(args) > 2 else None
            return matmul_workspace(MatmulCall(self._spec(a), self._spec(b), self._spec(bias), name == "linear"))
        a_sizes, a_strides, b_sizes, b_strides = _sizes(a), self.strides[a.name], _sizes(b), self.strides[b.name]
        if name == "linear":
            if len(a_sizes) <= 2 or (len(args) > 2 and _is_contiguous(a_sizes, a_strides)):
                return 0  # addmm, or the contiguous input flattened to a matrix
            if len(b_sizes) != 2:
                return 0
            b_sizes, b_strides = b_sizes[::-1], b_strides[::-1]  # the weight, transposed
        return matmul_copy_elements(a_sizes, a_strides, b_sizes, b_strides) * a.dtype.bytes

    def _spec(self, p, channels_last: bool = False) -> TensorSpec | None:
        """``p`` as the plain record ``kernel_workspace`` runs (with the walk's strides, or
        channels-last ones for a 4-d tensor where ``channels_last``)."""
        if p is None:
            return None
        sizes = _sizes(p)
        strides = (_channels_last_strides(sizes) if channels_last and len(sizes) == 4
                   else self.strides.get(p.name, _contiguous_strides(sizes)))
        return TensorSpec(sizes, tuple(strides), str(to_torch_dtype(p.dtype)), str(to_torch_device(p.device)))

    def gradient_copy_bytes(self, ret) -> int:
        """The most bytes autograd's ``AccumulateGrad`` holds beyond the gradients a joint trace
        returns (``ret``: its return, which pairs each input with its gradient) when it stores
        them: it copies those laid out unlike their input (``accumulate_grad_copy``), one at a
        time, freeing a gradient's storage once every copy of a value on it is made. Inputs are
        taken as leaves."""
        known = self._workspaces.get((id(ret), "gradients"))
        if known is None or known[0] is not ret:
            known = self._workspaces[(id(ret), "gradients")] = (ret, self._gradient_copies(ret))
        return known[1]

    def _gradient_copies(self, ret) -> int:
        returned = ret.args[0] if ret.args else None
        if not (isinstance(returned, dict) and "output" in returned and "flat_args" in returned):
            return 0
        by_storage: dict[str, list[tuple[int, int]]] = {}
        for leaf, grad in zip(returned["flat_args"], returned["output"]):
            if not isinstance(leaf, TensorProxy) or not isinstance(grad, TensorProxy):
                continue
            leaf_sizes, sizes = _sizes(leaf), _sizes(grad)
            copied, temporary = accumulate_grad_copy(
                leaf_sizes, self.strides.get(leaf.name, _contiguous_strides(leaf_sizes)), sizes,
                self.strides.get(grad.name, _contiguous_strides(sizes)), grad.dtype.bytes,
                to_torch_device(grad.device).type == "cpu")
            if copied:
                by_storage.setdefault(self.owner_of(grad.name), []).append((copied, temporary))
        return max((sum(c for c, _ in copies) + max(t for _, t in copies) for copies in by_storage.values()),
                   default=0)

    def groups(self, names: Iterable[str]) -> dict[str, list[str]]:
        """owner -> the given names that share its storage, in the order given."""
        out: dict[str, list[str]] = {}
        for name in names:
            out.setdefault(self.owner_of(name), []).append(name)
        return out


class _Walk:
    def __init__(self, held) -> None:
        self.owner: dict[str, str] = {}
        self.owner_bytes: dict[str, int] = {}
        #: value -> its owner if every op that can return a view did (the conservative owner)
        self.loose: dict[str, str] = {}
        self.strides: dict[str, tuple[int, ...]] = {}  # best guess of each value's strides
        self._contiguity: dict[str, bool] = {}  # value -> whether its strides are contiguous, once asked
        self.held: set[str] = set()
        for p in held:
            if isinstance(p, TensorProxy) and p.name not in self.owner:
                self._fresh(p)
                self.held.add(p.name)

    def copy(self) -> _Walk:
        twin = _Walk(())
        twin.owner, twin.owner_bytes = dict(self.owner), dict(self.owner_bytes)
        twin.loose, twin.strides, twin.held = dict(self.loose), dict(self.strides), set(self.held)
        twin._contiguity = dict(self._contiguity)
        return twin

    def result(self) -> StorageMap:
        maybe_view = frozenset(name for name, loose in self.loose.items() if loose != name)
        return StorageMap(self.owner, self.owner_bytes, maybe_view, frozenset(self.held), self.strides, self)

    def _fresh(self, p) -> None:
        self._meet(p.name, p.name, p.name, _contiguous_strides(_sizes(p)))
        self._contiguity[p.name] = True
        self.owner_bytes[p.name] = value_bytes(p)

    def _meet(self, name: str, owner: str, loose: str, strides) -> None:
        self.owner[name], self.loose[name], self.strides[name] = owner, loose, strides

    def visit(self, bsym) -> None:
        outs = [p for p in bsym.flat_proxy_outs if isinstance(p, TensorProxy)]
        args = [p for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)]
        for p in args:  # a value from outside the walk (a region's input): its own storage
            if p.name not in self.owner:
                self._fresh(p)
        new = [p for p in outs if p.name not in self.owner]
        if not new:
            return
        base = _view_base(bsym, args)
        if base is not None:
            for p in new:
                strides = _view_strides(bsym, base, self.strides[base.name], p)
                if strides is None:  # the runtime copies (a reshape of incompatible strides)
                    self._fresh(p)
                    self.loose[p.name] = self.loose[base.name]
                else:
                    self._meet(p.name, self.owner[base.name], self.loose[base.name], strides)
            return
        if bsym.subsymbols:
            self._through_decomposition(bsym, new)
        else:
            for p in new:
                self._fresh(p)
        fresh = [p for p in new if self.owner[p.name] == p.name and len(p.shape) > 1]
        if fresh and _keeps_layout(bsym) and any(not self._contiguous(p) for p in args):
            operands = [(_sizes(p), self.strides[p.name]) for p in args]  # laid out as its operands are
            for p in fresh:
                self.strides[p.name] = _elementwise_strides(operands, _sizes(p))
                self._contiguity.pop(p.name, None)

    def _contiguous(self, p) -> bool:
        """Whether ``p``'s strides are contiguous (TensorIterator then lays out its output so)."""
        known = self._contiguity.get(p.name)
        if known is None:
            known = self._contiguity[p.name] = _is_contiguous(_sizes(p), self.strides[p.name])
        return known

    def _through_decomposition(self, bsym, new) -> None:
        """Walk the op's body on its own: the names inside a composite are its own (a copy of the
        op made elsewhere reuses them). An output that is a view of one of the op's inputs is a
        view; one that is a view of a value made inside the op is fresh from the outside, sharing
        that value's storage with any other output viewing it."""
        inner = _Walk(())
        for p in bsym.flat_proxy_args:
            if isinstance(p, TensorProxy) and p.name in self.owner:
                owner = self.owner[p.name]
                inner._meet(p.name, owner, self.loose[p.name], self.strides[p.name])
                inner.owner_bytes[owner] = self.owner_bytes[owner]
        outside = set(inner.owner_bytes)
        outside_loose = set(inner.loose.values())
        for sub in _view_chains(bsym.subsymbols, new):
            inner.visit(sub)
        named: dict[str, str] = {}  # owner made inside -> the first output using it
        for p in new:
            owner = inner.owner.get(p.name)
            if owner is None:
                self._fresh(p)
                continue
            strides, loose = inner.strides[p.name], inner.loose[p.name]
            loose = loose if loose in outside_loose else p.name
            if owner in outside:
                self._meet(p.name, owner, loose, strides)
                continue
            key = named.setdefault(owner, p.name)
            self._meet(p.name, key, loose, strides)
            self.owner_bytes.setdefault(key, inner.owner_bytes[owner])


def _view_chains(subsymbols, outputs) -> list:
    """The body ops (in order) that can decide whose storage ``outputs`` use: the chain of views
    back from each output, through composites; any other op's outputs are fresh, which is what
    the walk assumes for values it has not seen."""
    producer = {}
    for sub in subsymbols:
        for q in sub.flat_proxy_outs:
            producer.setdefault(q.name, sub)
    needed: set[int] = set()
    stack = [p.name for p in outputs]
    while stack:
        sub = producer.get(stack.pop())
        if sub is None or id(sub) in needed:
            continue
        needed.add(id(sub))
        args = [a for a in sub.flat_proxy_args if isinstance(a, TensorProxy)]
        base = _view_base(sub, args)
        if base is not None:
            stack.append(base.name)
        elif sub.subsymbols:
            stack.extend(a.name for a in args)
    return [sub for sub in subsymbols if id(sub) in needed]


def _keeps_layout(bsym) -> bool:
    """Whether torch lays out the fresh outputs of ``bsym`` as its operands are laid out: an op it
    runs through TensorIterator (an elementwise prim, or an op whose decomposition is made only of
    them, with the broadcasts and conversions around them), or a conversion or clone alone
    (``Tensor.to``, ``clone``: they keep the input's order of dimensions, as TensorIterator would)."""
    sid = prim_id(bsym)
    if sid in _ELEMENTWISE_PRIMS or sid in _COPIES_KEEPING_LAYOUT:
        return True
    if not bsym.subsymbols or isinstance(sid, PrimIDs) or bsym.sym.is_fusion:  # a region lays out its own
        return False
    leaves, stack = [], list(bsym.subsymbols)
    while stack:
        sub = stack.pop()
        if sub.subsymbols and not isinstance(prim_id(sub), PrimIDs):
            stack.extend(sub.subsymbols)
        else:
            leaves.append(prim_id(sub))
    return (all(leaf in _ELEMENTWISE_PRIMS or leaf in _AROUND_ELEMENTWISE for leaf in leaves)
            and any(leaf in _ELEMENTWISE_PRIMS or leaf in _COPIES_KEEPING_LAYOUT for leaf in leaves))


def _elementwise_strides(operands, out_sizes) -> tuple[int, ...]:
    """The strides PyTorch gives the output of an elementwise op on ``operands`` ((sizes, strides)
    each, broadcast to ``out_sizes``), following TensorIterator (torch 2.11): the dimensions are
    ordered by the operands' strides, the first operand with a strict preference deciding, broadcast
    dimensions (stride 0) ignored, ties broken by size; the output is dense in that order."""
    ndim = len(out_sizes)
    if ndim <= 1:
        return _contiguous_strides(out_sizes)
    aligned = []
    for sizes, strides in operands:
        lead = ndim - len(sizes)
        if lead < 0:
            return _contiguous_strides(out_sizes)
        aligned.append([0] * lead + [st if size == out or out == 1 else 0
                                     for size, st, out in zip(sizes, strides, out_sizes[lead:])])

    def should_swap(dim0, dim1) -> int:
        for strides in aligned:
            s0, s1 = strides[dim0], strides[dim1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 != s1:
                return -1 if s0 < s1 else 1
            if out_sizes[dim0] > out_sizes[dim1]:
                return 1
        return 0

    perm = list(reversed(range(ndim)))  # the fastest dimension first
    for i in range(1, ndim):
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    if perm == list(reversed(range(ndim))):
        return _contiguous_strides(out_sizes)
    result, step = [0] * ndim, 1
    for dim in perm:
        result[dim] = step
        step *= out_sizes[dim]
    return tuple(result)


def _view_base(bsym, args):
    """The argument whose storage the op's outputs share (when the runtime makes a view), or None."""
    sid = prim_id(bsym)
    if not args:
        return None
    if sid in _VIEW_PRIMS or sid == _CONTIGUOUS:
        return args[0]
    if sid == PrimIDs.COPY_:  # copy_(source, destination) returns the destination
        return args[1] if len(args) > 1 else None
    if sid in _NOOP_WHEN_SAME:
        attr = _NOOP_WHEN_SAME[sid]
        out = next(p for p in bsym.flat_proxy_outs if isinstance(p, TensorProxy))
        return args[0] if getattr(out, attr, None) == getattr(args[0], attr, None) else None
    return None


def _sizes(p) -> tuple[int, ...]:
    return tuple(dim_size(d) for d in p.shape)


def measured_workspace(bsym) -> bool:
    """Whether ``bsym``'s workspace is a library kernel's, measured (``kernel_workspace``): a
    convolution, or a matmul in bfloat16 or float16 on CPU."""
    if prim_id(bsym) is PrimIDs.CONVOLUTION:
        return True
    if bsym.sym.name not in ("matmul", "linear"):
        return False
    a = next((p for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)), None)
    return a is not None and _packed_by_onednn(a)


def _packed_by_onednn(a) -> bool:
    """A matmul reading ``a`` runs in oneDNN, which packs operands into buffers of its own: a
    16-bit float on CPU."""
    return a.dtype.bytes == 2 and is_float_dtype(a.dtype) and to_torch_device(a.device).type == "cpu"


def _channels_last_strides(sizes) -> tuple[int, ...]:
    """Strides of ``sizes`` (batch, channels, spatial...) with channels innermost."""
    batch, channels, *spatial = sizes
    inner = _contiguous_strides((*spatial, channels))
    return (inner[0] * spatial[0] if spatial else channels, inner[-1], *inner[:-1])


def _contiguous_strides(sizes) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _is_contiguous(sizes, strides) -> bool:
    step = 1
    for size, stride in zip(reversed(sizes), reversed(strides)):
        if size != 1 and stride != step:
            return False
        step *= size
    return True


def _view_strides(bsym, base, strides, out) -> tuple[int, ...] | None:
    """Strides of the view ``out`` of ``base`` (whose strides are ``strides``), or None when the
    runtime copies instead. A best guess where the decomposition leaves arguments unread."""
    sid, sizes, new = prim_id(bsym), _sizes(base), _sizes(out)
    try:
        if sid == PrimIDs.TRANSPOSE:
            perm = bsym.args[1] if len(bsym.args) > 1 else bsym.kwargs["permutation"]
            return tuple(strides[d] for d in perm)
        if sid == PrimIDs.BROADCAST_IN_DIM:
            dims = bsym.args[2] if len(bsym.args) > 2 else bsym.kwargs["broadcast_dimensions"]
            result = [0] * len(new)
            for i, d in enumerate(dims):
                result[d] = strides[i] if sizes[i] == new[d] else 0
            return tuple(result)
        if sid == PrimIDs.SLICE:
            steps = bsym.args[3] if len(bsym.args) > 3 else bsym.kwargs.get("strides")
            return tuple(st * (step or 1) for st, step in zip(strides, steps or [1] * len(strides)))
        if sid == PrimIDs.SQUEEZE:
            dims = bsym.args[1] if len(bsym.args) > 1 else bsym.kwargs["dims"]
            drop = {d % len(sizes) for d in dims}
            return tuple(st for i, st in enumerate(strides) if i not in drop)
        if sid == PrimIDs.UNFOLD:
            dim, _, step = (bsym.args[1:4] if len(bsym.args) > 3 else
                            (bsym.kwargs["dim"], bsym.kwargs["size"], bsym.kwargs["step"]))
            return (*strides[:dim], strides[dim] * step, *strides[dim + 1:], strides[dim])
        if sid in (PrimIDs.RESHAPE, PrimIDs.VIEW):
            return _reshape_strides(sizes, strides, new)
        if sid == _CONTIGUOUS:
            return strides if _is_contiguous(sizes, strides) else None
    except (IndexError, KeyError, TypeError):
        return _contiguous_strides(new)
    return strides if len(strides) == len(new) else _contiguous_strides(new)


def _reshape_strides(sizes, strides, new) -> tuple[int, ...] | None:
    """The strides a reshape to ``new`` can keep as a view, or None if it must copy.

    Dimensions of size 1 aside, the input splits into blocks of dimensions laid out one after
    another in memory; a view is possible when the new dimensions split every block exactly.
    """
    if 0 in sizes:
        return _contiguous_strides(new)
    blocks = []  # (elements, stride of the block's innermost dimension), innermost block first
    for size, stride in zip(reversed(sizes), reversed(strides)):
        if size == 1:
            continue
        if blocks and stride == blocks[-1][1] * blocks[-1][0]:
            blocks[-1] = (blocks[-1][0] * size, blocks[-1][1])
        else:
            blocks.append((size, stride))
    result = [0] * len(new)
    dims = [i for i in reversed(range(len(new))) if new[i] != 1]
    k = 0
    for elements, stride in blocks:
        while elements > 1:
            if k == len(dims) or elements % new[dims[k]]:
                return None
            result[dims[k]] = stride
            stride *= new[dims[k]]
            elements //= new[dims[k]]
            k += 1
    if k != len(dims):
        return None
    for i in reversed(range(len(new))):  # size-1 dimensions: any stride; the one torch gives
        if new[i] == 1:
            result[i] = result[i + 1] * new[i + 1] if i + 1 < len(new) else 1
    return tuple(result)


def matmul_copy_elements(a_sizes, a_strides, b_sizes, b_strides) -> int:
    """Elements ``torch.matmul(a, b)`` copies into temporaries (no autograd), following
    ``_matmul_impl`` of ATen (torch 2.11): a matrix or vector pair goes to mm/mv/dot as it is; an
    operand of three or more dimensions times a matrix is folded into one matrix when its batch
    dimensions are laid out one after another; otherwise both operands are broadcast to
    (batch, rows, columns) by ``expand().reshape()``, which copies an operand whose strides allow
    no such view."""
    da, db = len(a_sizes), len(b_sizes)
    if da <= 2 and db <= 2:
        return 0
    if da >= 3 and db <= 2:  # the larger operand folds into a matrix when its batch dims do
        if all(a_strides[i] == a_strides[i + 1] * a_sizes[i + 1] for i in range(da - 2)):
            return 0
    elif db >= 3 and da == 1:  # a vector times a batch: folded as the batch's transpose
        t_sizes, t_strides = (*b_sizes[:-2], b_sizes[-1], b_sizes[-2]), (*b_strides[:-2], b_strides[-1], b_strides[-2])
        if all(t_strides[i] == t_strides[i + 1] * t_sizes[i + 1] for i in range(db - 2)):
            return 0
    n, m1 = (a_sizes[-2] if da > 1 else 1), a_sizes[-1]
    m2, p = (b_sizes[-2], b_sizes[-1]) if db > 1 else (b_sizes[0], 1)
    batch = _broadcast_sizes(a_sizes[:-2], b_sizes[:-2])
    rows = 1
    for size in batch:
        rows *= size
    copied = 0
    for sizes, strides, matrix in ((a_sizes, a_strides, (n, m1)), (b_sizes, b_strides, (m2, p))):
        if len(sizes) == 1:  # a vector is expanded over the batch as (batch, length)
            matrix = (sizes[0],)
        expanded = (*batch, *matrix)
        if _reshape_strides(expanded, _expanded_strides(sizes, strides, expanded), (rows, *matrix)) is None:
            copied += rows * matrix[0] * (matrix[1] if len(matrix) > 1 else 1)
    return copied


#: ATen copies a transposed matrix of at least this many elements through a square tile of
#: ``_TRANSPOSE_TILE`` elements a side (``copy_same_type_transpose_``, CPU, torch 2.11)
_TRANSPOSE_MIN_ELEMENTS, _TRANSPOSE_TILE = 60 * 60, 60


def accumulate_grad_copy(leaf_sizes, leaf_strides, grad_sizes, grad_strides, itemsize: int,
                         on_cpu: bool) -> tuple[int, int]:
    """(bytes of the copy, bytes of a temporary alive while it is made) that autograd's
    ``AccumulateGrad`` makes of a leaf's first gradient (torch 2.11). It keeps the gradient as it
    is when it obeys the layout contract (the leaf's strides in every dimension of size above 1,
    no size-1 dimension of stride 0); otherwise it copies it into a tensor laid out as the leaf
    (a matmul's weight gradient computed as a transpose, from ``x @ w.T``). On CPU a transposed
    matrix of at least 60 x 60 elements is copied through a 60 x 60 tile."""
    if tuple(grad_sizes) != tuple(leaf_sizes):
        return 0, 0
    obeys = all((st == leaf_st) if size != 1 else st != 0
                for size, st, leaf_st in zip(grad_sizes, grad_strides, leaf_strides))
    if obeys:
        return 0, 0
    elements = 1
    for size in grad_sizes:
        elements *= size
    transposed = (len(grad_sizes) == 2 and grad_strides[0] == 1 and grad_strides[1] == grad_sizes[0]
                  and elements >= _TRANSPOSE_MIN_ELEMENTS)
    tile = _TRANSPOSE_TILE * _TRANSPOSE_TILE * itemsize if on_cpu and transposed else 0
    return elements * itemsize, tile


def _broadcast_sizes(a, b) -> tuple[int, ...]:
    width = max(len(a), len(b))
    a, b = (1,) * (width - len(a)) + tuple(a), (1,) * (width - len(b)) + tuple(b)
    return tuple(max(x, y) for x, y in zip(a, b))


def _expanded_strides(sizes, strides, expanded) -> tuple[int, ...]:
    """Strides of ``Tensor.expand(expanded)`` of a tensor of ``sizes`` and ``strides``."""
    lead = len(expanded) - len(sizes)
    return (*([0] * lead), *(st if size == new else 0
                              for size, st, new in zip(sizes, strides, expanded[lead:])))


def storage_map(bsyms, held=()) -> StorageMap:
    """The storage owners of every tensor the bound symbols ``bsyms`` produce, in order.

    ``held``: proxies that exist before (forward inputs); they own their storage and count as
    held. Fusion regions and composite ops are read through their bodies.
    """
    walk = _Walk(held)
    for bsym in bsyms:
        walk.visit(bsym)
    return walk.result()
