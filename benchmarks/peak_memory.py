"""Peak CPU memory of one training step as the memory budget falls.

For each budget, ``thunder.jit(model, executors=[eager], remat=True, remat_memory_budget=b)`` is
compiled and warmed up, then one forward+backward step runs under ``torch.profiler`` with
``profile_memory=True``. Every allocation and free the CPU allocator reports is a memory event;
their running sum, in time order, is the memory allocated since the step began, and its maximum is
the step's peak (relative to the memory live before the step). Also reported: activation bytes
saved for backward (saved_tensors_hooks) and the plan's estimated recompute.

Usage::

    python benchmarks/peak_memory.py --model gpt --size small
"""

from __future__ import annotations

import argparse
import sys
import warnings

BUDGETS = (1.0, 0.7, 0.5, 0.3, 0.1, 0.0)


def step_peak_bytes(fn) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e for e in prof.events() if getattr(e, "self_cpu_memory_usage", 0)),
        key=lambda e: e.time_range.start,
    )
    live = peak = 0
    for e in events:
        live += e.self_cpu_memory_usage
        peak = max(peak, live)
    del torch
    return peak


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt", choices=["mlp", "gpt", "llama"])
    p.add_argument("--size", default="small", choices=["tiny", "small", "bench"])
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    import thunder
    import torch

    import thunder_remat
    from thunder_remat.executors.eager import eager_fusion_ex
    from thunder_remat.measure import saved_for_backward
    from thunder_remat.models import build_model, example_batch

    print("| model | size | budget | peak step memory (B) | saved activation bytes | est. recompute flops |")
    print("|---|---|---|---|---|---|")
    rows = [("Thunder (no remat)", {})] + [(b, {"remat": True, "remat_memory_budget": b}) for b in BUDGETS]
    for label, options in rows:
        model = build_model(args.model, args.size)
        x = example_batch(model)
        jm = thunder.jit(model, executors=[eager_fusion_ex], **options)
        for _ in range(2):  # compile and warm up
            jm(x).float().pow(2).mean().backward()
        out, saved = saved_for_backward(jm, x)
        out.float().pow(2).mean().backward()
        del out
        model.zero_grad(set_to_none=False)

        def step():
            jm(x).float().pow(2).mean().backward()

        peak = step_peak_bytes(step)
        plan = thunder_remat.last_save_plan(jm)
        flops = f"{plan.choice.plan.recompute_flops:.3g}" if plan is not None and plan.choice else "-"
        print(f"| {args.model} | {args.size} | {label} | {peak:,} | {saved.activation_bytes:,} | {flops} |", flush=True)
    del torch
    return 0


if __name__ == "__main__":
    sys.exit(main())
