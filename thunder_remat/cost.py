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
        numel = 1
        for dim in proxy.shape:
            numel *= dim_size(dim)
        return numel * proxy.dtype.bytes
    if isinstance(proxy, NumberProxy):
        return 0
    return 0
