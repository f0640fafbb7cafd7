"""Fused attention on CPU, so the backward keeps the output and log-sum-exp, not the probabilities.

Thunder 0.2.6 runs ``scaled_dot_product_attention`` through its sdpa executor only on CUDA; on CPU
it decomposes attention into matmul, softmax and matmul, whose backward reads the
(batch x heads x queries x keys) probabilities. A plan that does not save them must recompute
``q @ k^T``. PyTorch's CPU flash-attention kernels (``aten._scaled_dot_product_flash_attention_for_cpu``
and its backward) need only the output and a (batch x heads x queries) log-sum-exp, as Thunder's
sdpa executor does on GPU. Put ``cpu_attention_ex`` before the other executors to run attention
that way on CPU; it claims only what those kernels compute like the decomposition (4-D float
inputs, no dropout, no mask or an additive mask of the query's dtype that needs no gradient: the
kernels return none for it) and leaves everything else to Thunder.

The forward op carries Thunder's DONT_AUTO_RECOMPUTE_IN_BACKWARD tag and a name containing
``scaled_dot_product``, so thunder_remat prices it as attention and treats it like a matmul: kept
unless the memory budget leaves no other way.
Written against lightning-thunder 0.2.6 (``OperatorExecutor.register_operator`` and
``register_implementation`` with a grad transform) and torch 2.11.
"""

from __future__ import annotations

import torch
from thunder.core import dtypes
from thunder.core.devices import DeviceType
from thunder.core.prims import OpTags
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import get_grad, put_grads
from thunder.extend import OperatorExecutor, register_executor
import thunder.torch as ltorch

__all__ = ["cpu_attention_ex", "FORWARD_NAME", "BACKWARD_NAME"]

FORWARD_NAME = "remat_cpu_scaled_dot_product_attention_forward"
BACKWARD_NAME = "remat_cpu_attention_backward"

#: dtypes the CPU flash kernels accept; the log-sum-exp is float32 except for float64 inputs
_SUPPORTED = (dtypes.float32, dtypes.float64, dtypes.bfloat16)

cpu_attention_ex = OperatorExecutor("remat_cpu_attention", version="0.1")
register_executor(cpu_attention_ex)


def _logsumexp_dtype(query):
    return dtypes.float64 if dtypes.to_dtype(query.dtype) == dtypes.float64 else dtypes.float32


def _forward_meta(query, key, value, attn_mask, is_causal, scale):
    batch, heads, queries, _ = query.shape
    out = TensorProxy(like=query, shape=(batch, heads, queries, value.shape[-1]))
    lse = TensorProxy(
        shape=(batch, heads, queries), dtype=_logsumexp_dtype(query), device=query.device, requires_grad=False
    )
    return out, lse


def _forward_impl(query, key, value, attn_mask, is_causal, scale):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale
    )


def _backward_meta(grad_out, query, key, value, attn_mask, out, lse, is_causal, scale):
    return TensorProxy(like=query), TensorProxy(like=key), TensorProxy(like=value)


def _backward_impl(grad_out, query, key, value, attn_mask, out, lse, is_causal, scale):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, query, key, value, out, lse, 0.0, is_causal, attn_mask=attn_mask, scale=scale
    )


attention_forward = cpu_attention_ex.register_operator(
    FORWARD_NAME, meta=_forward_meta, fn=_forward_impl, tags=(OpTags.DONT_AUTO_RECOMPUTE_IN_BACKWARD,)
)
attention_backward = cpu_attention_ex.register_operator(BACKWARD_NAME, meta=_backward_meta, fn=_backward_impl)


def _mask_claimed(mask, query, key) -> bool:
    """An additive mask the kernels take as the decomposition does: the query's dtype (a boolean
    mask they refuse), broadcastable to (batch, heads, queries, keys), and no gradient wanted (the
    backward kernel returns none for it)."""
    if not isinstance(mask, TensorProxy) or mask.requires_grad or mask.dtype != query.dtype or mask.ndim != 4:
        return False
    target = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    return all(m in (1, t) for m, t in zip(mask.shape, target))


def _claims(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None) -> bool:
    """Only what the CPU flash kernels compute like the decomposition: no dropout, no mask or one
    ``_mask_claimed`` takes (Thunder refuses a mask with ``is_causal`` before any executor). A query
    row the mask hides entirely gives zeros, as eager PyTorch does (the decomposition: NaN)."""
    tensors = (query, key, value)
    if dropout_p != 0.0:
        return False
    if not all(isinstance(t, TensorProxy) and t.ndim == 4 for t in tensors):
        return False
    if any(t.device.devicetype != DeviceType.CPU for t in tensors):
        return False
    if any(dtypes.to_dtype(t.dtype) not in _SUPPORTED for t in tensors) or len({t.dtype for t in tensors}) != 1:
        return False
    if query.shape[-1] != key.shape[-1] or key.shape[2] != value.shape[2]:
        return False
    return attn_mask is None or _mask_claimed(attn_mask, query, key)


def _execute(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None):
    out, _ = attention_forward(query, key, value, attn_mask, is_causal, scale)
    return out


def _grad(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None):
    out, lse = attention_forward(query, key, value, attn_mask, is_causal, scale)
    grads = attention_backward(get_grad(out), query, key, value, attn_mask, out, lse, is_causal, scale)
    put_grads((query, key, value), grads)
    return out


cpu_attention_ex.register_implementation(
    ltorch.scaled_dot_product_attention, checker=_claims, execution_transform=_execute, grad_transform=_grad
)
