"""The checks that need a GPU, prepared as one short script for when a device is lent.

For each budget: compile the model with the chosen fusion executor on ``--device``, warm up, then
measure one training step: the step's peak from ``step_peak_memory`` (tensor storage) and, on
CUDA, from ``torch.cuda.max_memory_allocated`` (allocator, relative to the memory allocated
before the step); saved activation bytes; the step time (median of 5, synchronized). Then once
with ``remat_cost_model="measured"`` at budget 0.5, which times every distinct forward op on the
device (CUDA events). Also runs on CPU (no allocator column), which is how it was tested. The
tensor column counts only what runs op by op (see ``step_peak_memory``): with a fusion executor
read the allocator column.

Usage (about 2 minutes on a GPU for the 6-layer GPT with torch.compile)::

    python benchmarks/device_checks.py --device cuda --executor torchcompile --model gpt --size bench
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

BUDGETS = (1.0, 0.5, 0.1, 0.0)


def one_run(model_name, size, device, executor, **options):
    import thunder
    import torch

    import thunder_remat
    from thunder_remat.measure import saved_for_backward, step_peak_memory
    from thunder_remat.models import build_model, example_batch

    model = build_model(model_name, size).to(device)
    x = example_batch(model).to(device)
    jm = thunder.jit(model, executors=[executor] if executor is not None else [], **options)

    def step():
        jm(x).float().pow(2).mean().backward()

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    start = time.perf_counter()
    step()
    sync()
    compile_s = time.perf_counter() - start
    step()
    out, saved = saved_for_backward(jm, x)
    out.float().pow(2).mean().backward()
    del out
    held = [x, *model.parameters(), *(p.grad for p in model.parameters() if p.grad is not None)]
    allocator = None
    if device.startswith("cuda"):
        sync()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    peak = step_peak_memory(step, held).peak_bytes
    if device.startswith("cuda"):
        sync()
        allocator = torch.cuda.max_memory_allocated() - before
    times = []
    for _ in range(5):
        sync()
        t = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    plan = thunder_remat.last_save_plan(jm)
    return dict(peak=peak, allocator=allocator, saved=saved.activation_bytes, step_ms=statistics.median(times),
                compile_s=compile_s, unit=plan.problem.cost_unit if plan and plan.problem else "-",
                cost=plan.choice.plan.recompute_cost if plan and plan.choice else None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--executor", default="torchcompile", choices=["none", "eager", "torchcompile", "nvfuser"])
    p.add_argument("--model", default="gpt", choices=["mlp", "gpt", "llama"])
    p.add_argument("--size", default="bench", choices=["tiny", "small", "bench"])
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    from thunder_remat.executors import fusion_executor_by_name

    executor = None if args.executor == "none" else fusion_executor_by_name(args.executor)
    print(f"| model | device | executor | run | step peak B (tensors) | step peak B (allocator) | saved activation B "
          f"| est. recompute | step ms | first call s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    runs = [("Thunder (no remat)", {})]
    runs += [(f"budget {b}", {"remat": True, "remat_memory_budget": b}) for b in BUDGETS]
    runs += [("budget 0.5, measured costs", {"remat": True, "remat_memory_budget": 0.5, "remat_cost_model": "measured"})]
    for label, options in runs:
        r = one_run(args.model, args.size, args.device, executor, **options)
        allocator = "-" if r["allocator"] is None else f"{r['allocator']:,}"
        cost = "-" if r["cost"] is None else f"{r['cost']:.3g} {r['unit']}"
        print(f"| {args.model} {args.size} | {args.device} | {args.executor} | {label} | {r['peak']:,} | {allocator} "
              f"| {r['saved']:,} | {cost} | {r['step_ms']:.1f} | {r['compile_s']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
