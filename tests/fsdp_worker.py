"""One rank of the FSDP tests and benchmark (run with torch.multiprocessing, gloo on loopback)."""

from __future__ import annotations

import copy
import json
import os
import warnings

import thunder
import torch
import torch.distributed as dist

#: mode -> (sharding strategy, thunder_remat options, fusion executor)
MODES = {
    "zero2": ("ZERO2", {}, None),
    "zero2+remat": ("ZERO2", {"remat": True}, None),
    "zero3": ("ZERO3", {}, None),
    "zero3+remat": ("ZERO3", {"remat": True}, None),
    "zero3+remat, eager fusion, budget 0.0": ("ZERO3", {"remat": True, "remat_memory_budget": 0.0}, "eager"),
    "zero3+remat, budget 0.0, prefetch 2": ("ZERO3", {"remat": True, "remat_memory_budget": 0.0,
                                                      "remat_fsdp_prefetch": 2}, None),
    "zero3+remat, budget 0.0": ("ZERO3", {"remat": True, "remat_memory_budget": 0.0}, None),
    "zero3+remat, budget 0.0, window 1": ("ZERO3", {"remat": True, "remat_memory_budget": 0.0,
                                                    "remat_recompute_window": 1}, None),
    "ddp": ("DDP", {}, None),
    "ddp+remat": ("DDP", {"remat": True}, None),
}


def _is_collective(name: str) -> bool:
    return any(k in name for k in ("all_gather", "all_reduce", "reduce_scatter", "wait", "broadcast_prim", "synchronize"))


def max_in_flight(trace) -> int:
    """Most all-gathers issued and not yet waited on at any point of the trace."""
    futures, peak = set(), 0
    for b in _ops(trace):
        name = b.sym.name
        if "all_gather" in name:
            futures.update(p.name for p in b.flat_proxy_outs)
        elif "wait" in name:
            futures.difference_update(p.name for p in b.flat_proxy_args)
        peak = max(peak, len(futures))
    return peak


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 16), torch.nn.GELU(),
                               torch.nn.Linear(16, 8))


def _ops(trace):
    """Every op of the trace, looking inside fusion regions."""
    for b in trace.bound_symbols:
        yield from (b.subsymbols if b.sym.is_fusion else (b,))


def _saved_producers(jm) -> dict[str, str]:
    fw = thunder.last_traces(jm)[-1]
    producer = {p.name: b.sym.name for b in _ops(fw) for p in b.flat_proxy_outs}
    flat, _ = thunder.core.pytree.tree_flatten(fw.output[1])
    return {p.name: producer.get(p.name, "input") for p in flat if isinstance(p, thunder.core.proxies.TensorProxy)}


def run_rank(rank: int, world_size: int, port: int, out_dir: str, modes) -> None:
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    import thunder_remat  # noqa: F401  (registers the plugin)
    from thunder.distributed import FSDPType
    from thunder.distributed import copy_default_process_group
    from thunder.distributed.transforms.ddp_v2 import DDPTransform
    from thunder.distributed.transforms.fsdp_v2 import FSDPTransform

    from thunder_remat.executors import fusion_executor_by_name
    from thunder_remat.inspect.measure import saved_for_backward

    base = build()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    ref_model = copy.deepcopy(base)
    ref_model(x).float().pow(2).mean().backward()
    ref = {n: p.grad for n, p in ref_model.named_parameters()}
    results = {}
    for mode in modes:
        strategy, options, executor = MODES[mode]
        model = copy.deepcopy(base)
        if strategy == "DDP":
            transform = DDPTransform(process_group=copy_default_process_group(), bucket_size_in_mb=25.0,
                                     broadcast_from=None)
        else:
            transform = FSDPTransform(device=torch.device("cpu"), sharding_strategy=getattr(FSDPType, strategy))
        executors = [] if executor is None else [fusion_executor_by_name(executor)]
        jm = thunder.jit(model, transforms=[transform], executors=executors, **options)
        out, saved = saved_for_backward(jm, x)
        out.float().pow(2).mean().backward()
        grads_ok = True
        for name, p in jm.named_parameters():
            key = name.replace("_model.", "")
            expected = ref[key] if strategy == "DDP" else ref[key].chunk(world_size, 0)[rank]
            grads_ok &= p.grad is not None and torch.allclose(p.grad, expected, atol=1e-5, rtol=1e-4)
        bw = thunder.last_backward_traces(jm)[-1]
        producers = _saved_producers(jm)
        gathered = [n for n, op in producers.items() if "wait" in op or "all_gather" in op]
        gathered_bytes = 0
        fw = thunder.last_traces(jm)[-1]
        flat, _ = thunder.core.pytree.tree_flatten(fw.output[1])
        for p in flat:
            if getattr(p, "name", None) in gathered:
                gathered_bytes += p.numel * p.dtype.bytes
        results[mode] = {
            "grads_ok": bool(grads_ok),
            "backward_all_gathers": sum("all_gather" in b.sym.name for b in _ops(bw)),
            "backward_max_in_flight": max_in_flight(bw),
            "backward_collectives": sorted(b.sym.name for b in _ops(bw) if _is_collective(b.sym.name)),
            "forward_collectives": sorted(b.sym.name for b in _ops(thunder.last_traces(jm)[-1])
                                          if _is_collective(b.sym.name)),
            "saved_gathered_params": gathered,
            "saved_gathered_param_bytes": gathered_bytes,
            "saved_bytes": saved.nbytes,
            "saved_activation_bytes": saved.activation_bytes,
        }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()
