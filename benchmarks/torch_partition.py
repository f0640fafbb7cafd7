"""What torch.compile's partitioner recomputes, costed by thunder_remat's flop rule.

torch's min-cut partitioner (``torch._functorch.partitioners``) reports no recompute estimate a
caller can read, so this helper watches it: while :func:`capture_partitions` is active, every call
Inductor makes to ``min_cut_rematerialization_partition`` is recorded with the joint graph it was
given and the forward/backward graphs it returned. A *recomputed* node is a backward-graph node
whose name is a joint-graph node the forward outputs depend on (the partitioner copies nodes into
the backward graph under their joint-graph names).

Each recomputed node is costed by the same rule thunder_remat uses for Thunder ops
(``thunder_remat.cost.op_flops``): matmul-like ops ``2 * output elements * contracted size``,
attention ``4 * numel(q) * keys``, shape ops 0, reductions their input elements, anything else the
largest number of elements it touches. Written against torch 2.11 (private module paths).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

__all__ = ["Partition", "capture_partitions", "node_flops", "is_matmul_like"]

_MATMUL = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear"}
_SHAPE = {
    "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "squeeze", "unsqueeze",
    "slice", "select", "split", "split_with_sizes", "unbind", "alias", "as_strided", "detach",
    "_reshape_alias", "getitem", "view_as", "squeeze_copy", "unsqueeze_copy", "view_copy",
}
_REDUCTION = {"sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "prod", "any", "all",
              "argmax", "argmin", "logsumexp"}


def is_matmul_like(op_name: str) -> bool:
    """Matmul, linear or attention, for aten and Thunder op names alike."""
    return op_name in _MATMUL or "scaled_dot_product" in op_name or op_name == "sdpa"


@dataclass
class Partition:
    joint: object
    forward: object
    backward: object
    num_fwd_outputs: int

    def recomputed_nodes(self) -> list:
        """Backward-graph nodes that are forward computations run again."""
        out = next(n for n in self.joint.graph.nodes if n.op == "output")
        forward_outputs = [a for a in out.args[0][: self.num_fwd_outputs] if hasattr(a, "name")]
        required, stack = set(), list(forward_outputs)
        while stack:
            node = stack.pop()
            if node.name in required:
                continue
            required.add(node.name)
            stack.extend(node.all_input_nodes)
        return [n for n in self.backward.graph.nodes if n.op == "call_function" and n.name in required]

    def recompute_flops(self) -> float:
        return float(sum(node_flops(n) for n in self.recomputed_nodes()))

    def recompute_matmul_flops(self) -> float:
        """Flops of recomputed matmul-like and attention nodes only: what torch's own default
        runtime estimator (FlopCounterMode) counts; every other node costs it ~nothing."""
        return float(sum(node_flops(n) for n in self.recomputed_nodes() if is_matmul_like(_op_name(n))))


def _op_name(node) -> str:
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    name = getattr(packet, "__name__", None) or getattr(target, "__name__", str(target))
    return name.split(".")[-1]


def _tensors(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _numel(t) -> int:
    n = 1
    for d in t.shape:
        n *= int(d)
    return n


def node_flops(node) -> float:
    """thunder_remat's flop rule (cost.op_flops) applied to an aten node, from its fake tensors."""
    ins = [t for a in node.all_input_nodes for t in _tensors(a.meta.get("val"))]
    outs = _tensors(node.meta.get("val"))
    if not outs:
        return 0.0
    name = _op_name(node)
    if "scaled_dot_product" in name and len(ins) >= 3:
        q, k = ins[0], ins[1]
        return 4.0 * _numel(q) * int(k.shape[-2])
    if name in _MATMUL:
        first = ins[1] if name in ("addmm", "baddbmm") and len(ins) > 1 else ins[0]
        return 2.0 * sum(_numel(o) for o in outs) * int(first.shape[-1])
    if name in _SHAPE:
        return 0.0
    if name in _REDUCTION:
        return float(sum(_numel(t) for t in ins))
    return float(max(_numel(t) for t in ins + outs))


@contextlib.contextmanager
def capture_partitions():
    """Record every partition Inductor makes inside the block (autograd cache off so none is skipped)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.compile_fx as compile_fx

    partitions: list[Partition] = []
    original = compile_fx.min_cut_rematerialization_partition

    def recording(joint, inputs, **kwargs):
        forward, backward = original(joint, inputs, **kwargs)
        partitions.append(Partition(joint, forward, backward, kwargs["num_fwd_outputs"]))
        return forward, backward

    compile_fx.min_cut_rematerialization_partition = recording
    try:
        with functorch_config.patch(enable_autograd_cache=False):
            yield partitions
    finally:
        compile_fx.min_cut_rematerialization_partition = original
