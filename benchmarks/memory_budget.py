"""Saved activation bytes under a memory budget: thunder_remat vs torch.compile's activation_memory_budget.

For each model and each budget b:

* torch.compile (Inductor) with ``torch._functorch.config.activation_memory_budget = b``;
* ``thunder.jit(model, executors=[attention, ex], remat=True, remat_memory_budget=b)``, where
  ``attention`` runs attention as one op like torch does (Thunder's sdpa executor on CUDA,
  thunder_remat's CPU flash-attention executor on CPU; ``--attention decomposed`` leaves it out);
* and once, Thunder 0.2.6 without thunder_remat.

Each runs one forward under ``thunder_remat.inspect.measure.saved_for_backward`` (saved_tensors_hooks); the
table reports *activation* bytes: saved tensors that do not share storage with the input batch
or the model's parameters and buffers (those are held anyway). Gradients of a
``out.float().pow(2).mean()`` loss are compared with eager PyTorch (allclose, atol 1e-5, rtol 1e-4).
Estimated recompute uses one flop rule for both (thunder_remat.cost.op_flops; for torch, applied
to the aten nodes its partitioner moved into the backward, see benchmarks/torch_partition.py).
The two budget fractions are each system's own scale (between its smallest and its fastest plan),
so the table also gives thunder_remat's plan under an absolute byte budget equal to what torch
saved at that fraction: the least recompute thunder_remat needs to hold no more than torch.

Usage::

    python benchmarks/memory_budget.py --models mlp,gpt,llama --size tiny --executor eager
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings

log = logging.getLogger("memory_budget")

BUDGETS = (1.0, 0.7, 0.5, 0.3, 0.1, 0.0)
ATOL, RTOL = 1e-5, 1e-4


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mlp,gpt,llama", help="comma list of mlp, gpt, llama (default: all)")
    p.add_argument("--size", default="tiny", choices=["tiny", "small", "bench", "medium"])
    p.add_argument("--device", default="cpu", help="torch device for every run (default: cpu)")
    p.add_argument("--executor", default="eager", choices=["eager", "torchcompile"],
                   help="Thunder fusion executor for the thunder_remat runs (default: eager)")
    p.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="comma list of fractions")
    p.add_argument("--attention", default="fused", choices=["fused", "decomposed"],
                   help="fused (default): attention as one op for every Thunder run, like torch; "
                        "decomposed: Thunder 0.2.6's CPU default (matmul, softmax, matmul)")
    p.add_argument("--output", help="also write the markdown table here")
    args = p.parse_args(argv)
    from thunder_remat.models import MODEL_NAMES

    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in args.models if m not in MODEL_NAMES]
    if bad:
        p.error(f"unknown model(s) {bad}; choose from {list(MODEL_NAMES)}")
    try:
        args.budgets = [float(b) for b in args.budgets.split(",")]
    except ValueError:
        p.error("--budgets must be a comma list of numbers in [0, 1]")
    if any(not 0.0 <= b <= 1.0 for b in args.budgets):
        p.error("--budgets must lie in [0, 1]")
    return args


def _grads_ok(model, out, ref) -> bool:
    import torch

    model.zero_grad(set_to_none=True)
    out.float().pow(2).mean().backward()
    ok = all(torch.allclose(p.grad, ref[n], atol=ATOL, rtol=RTOL) for n, p in model.named_parameters())
    model.zero_grad(set_to_none=True)
    return ok


def bench(name, size, executor, budgets, device="cpu", attention="fused"):
    import thunder
    import torch
    import torch._functorch.config as functorch_config

    import thunder_remat
    from thunder_remat.executors import attention_executor_for, fusion_executor_by_name
    from thunder_remat.inspect.measure import saved_for_backward
    from thunder_remat.models import build_model, example_batch
    from thunder_remat.inspect.tradeoff import frontier_of
    from thunder_remat.whole_graph.planner import PlanSearch

    from torch_partition import capture_partitions, is_matmul_like

    model = build_model(name, size).to(device)
    x = example_batch(model).to(device)
    model(x).float().pow(2).mean().backward()
    ref = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    ex = [fusion_executor_by_name(executor)]
    if attention == "fused":
        ex = [attention_executor_for(device), *ex]

    jm = thunder.jit(model, executors=ex)
    out, saved = saved_for_backward(jm, x)
    thunder_bytes = saved.activation_bytes
    thunder_ok = _grads_ok(model, out, ref)
    rows = []
    for b in budgets:
        log.info("%s/%s budget %s: torch.compile", name, size, b)
        torch._dynamo.reset()
        start = time.perf_counter()
        with functorch_config.patch(activation_memory_budget=b), capture_partitions() as partitions:
            compiled = torch.compile(model)
            out, saved_tc = saved_for_backward(compiled, x)
            tc_ok = _grads_ok(model, out, ref)
        torch_flops = sum(p.recompute_flops() for p in partitions)
        torch_mm = sum(p.recompute_matmul_flops() for p in partitions)
        log.info("  %.1f s; thunder_remat", time.perf_counter() - start)
        jm = thunder.jit(model, executors=ex, remat=True, remat_memory_budget=b)
        out, saved_ours = saved_for_backward(jm, x)
        ours_ok = _grads_ok(model, out, ref)
        plan = thunder_remat.last_save_plan(jm)
        at_torch = PlanSearch(frontier_of(plan)).choose(("bytes", saved_tc.activation_bytes)).plan
        ops = {op.index: op for op in plan.problem.ops}

        def matmul_flops(p):
            return sum(ops[i].cost for i in p.recomputed if is_matmul_like(ops[i].op))
        rows.append(dict(
            model=name, size=size, budget=b, thunder=thunder_bytes, thunder_ok=thunder_ok,
            torch=saved_tc.activation_bytes, torch_ok=tc_ok, ours=saved_ours.activation_bytes, ours_ok=ours_ok,
            planned=plan.choice.plan.saved_bytes, flops=plan.choice.plan.recompute_cost,
            torch_flops=torch_flops, at_torch_bytes=at_torch.saved_bytes, at_torch_flops=at_torch.recompute_cost,
            torch_mm=torch_mm, mm=matmul_flops(plan.choice.plan), at_torch_mm=matmul_flops(at_torch),
        ))
        log.info("  torch.compile %d B, thunder_remat %d B (planned %d B)", rows[-1]["torch"], rows[-1]["ours"],
                 rows[-1]["planned"])
    return rows


def table(rows, executor, device="cpu", attention="fused") -> str:
    yn = {True: "yes", False: "NO"}
    lines = [
        "| model | size | budget | Thunder 0.2.6 (no remat) B | torch.compile B | thunder_remat B "
        "| thunder_remat planned B | recomputed matmul flops: torch / ours | est. recompute, all ops: torch / ours "
        "| ours <= torch: B / matmul / all ops | ours at torch's bytes: B / matmul / all ops "
        "| at torch's bytes, ours <= torch: matmul / all ops | grads equal eager (Thunder / torch / ours) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['size']} | {r['budget']} | {r['thunder']:,} | {r['torch']:,} | {r['ours']:,} "
            f"| {r['planned']:,} | {r['torch_mm']:.3g} / {r['mm']:.3g} | {r['torch_flops']:.3g} / {r['flops']:.3g} "
            f"| {yn[r['ours'] <= r['torch']]} / {yn[r['mm'] <= r['torch_mm']]} / {yn[r['flops'] <= r['torch_flops']]} "
            f"| {r['at_torch_bytes']:,} / {r['at_torch_mm']:.3g} / {r['at_torch_flops']:.3g} "
            f"| {yn[r['at_torch_mm'] <= r['torch_mm']]} / {yn[r['at_torch_flops'] <= r['torch_flops']]} "
            f"| {yn[r['thunder_ok']]} / {yn[r['torch_ok']]} / {yn[r['ours_ok']]} |"
        )
    lines.append("")
    lines.append(f"Activation bytes saved for backward in one real forward; thunder_remat ran with the {executor} executor on {device}, "
                 f"attention {attention}. "
                 "Recompute: estimated flops of the forward ops run again in the backward, one rule for both.")
    return "\n".join(lines)


def main(argv=None) -> int:
    warnings.filterwarnings("ignore")
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    rows = []
    for name in args.models:
        rows += bench(name, args.size, args.executor, args.budgets, args.device, args.attention)
    text = table(rows, args.executor, args.device, args.attention)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
