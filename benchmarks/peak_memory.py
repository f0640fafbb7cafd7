"""Peak tensor memory of one training step as the memory budget falls.

For each budget, ``thunder.jit(model, executors=..., remat=True, remat_memory_budget=b)`` is
compiled and warmed up, then one forward+backward step runs under
``thunder_remat.inspect.measure.step_peak_memory``: every tensor an op returns is followed until it is
freed, and the most bytes alive at once is the step's peak (parameters, their gradients and the
batch are held before and after the step and are not counted). This works on CPU, where there is
no ``max_memory_allocated``. Also reported: activation bytes saved for backward
(saved_tensors_hooks), the plan's estimated recompute, and the recomputed copies the rewrite
made (with ``--window``, stale pointwise copies are recomputed again near far uses; the last
column is the estimated cost of all copies).

``--executor none`` (default) runs Thunder's torch executor without a fusion executor, so each
intermediate is freed right after its last use (Thunder inserts the deletes); the light
``eager`` executor runs each fusion region as one Python function that keeps every intermediate
of the region alive until it returns, which hides what the plan does.

``--attention fused`` (default) puts the executor that runs attention as one op first (on CPU
thunder_remat's flash-attention executor, whose backward keeps the output and log-sum-exp);
``--attention decomposed`` leaves Thunder 0.2.6's CPU default (matmul, softmax, matmul).

Usage::

    python benchmarks/peak_memory.py --model gpt --size small
"""

from __future__ import annotations

import argparse
import sys
import warnings

BUDGETS = (1.0, 0.7, 0.5, 0.3, 0.1, 0.0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt", choices=["mlp", "gpt", "llama"])
    p.add_argument("--size", default="small", choices=["tiny", "small", "bench"])
    p.add_argument("--executor", default="none", choices=["none", "eager", "torchcompile"],
                   help="Thunder fusion executor (default: none, Thunder's torch executor only)")
    p.add_argument("--attention", default="fused", choices=["fused", "decomposed"],
                   help="attention as one op (default) or Thunder 0.2.6's CPU decomposition")
    p.add_argument("--window", default="30", help="remat_recompute_window: an int >= 1, or 'off' (default: 30)")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    import thunder

    import thunder_remat
    from thunder_remat.executors import attention_executor_for, fusion_executor_by_name
    from thunder_remat.inspect.measure import saved_for_backward, step_peak_memory
    from thunder_remat.models import build_model, example_batch

    executors = [] if args.executor == "none" else [fusion_executor_by_name(args.executor)]
    if args.attention == "fused":
        executors = [attention_executor_for("cpu"), *executors]
    window = False if args.window == "off" else int(args.window)
    print("| model | size | executor | attention | window | budget | step peak B | saved activation B "
          "| est. recompute, plan (flops) | recomputed copies / plan ops | est. recompute, rewritten (flops) "
          "| checkpoint anchors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = [("Thunder (no remat)", {})] + [
        (b, {"remat": True, "remat_memory_budget": b, "remat_recompute_window": window}) for b in BUDGETS
    ]
    for label, options in rows:
        model = build_model(args.model, args.size)
        x = example_batch(model)
        jm = thunder.jit(model, executors=executors, **options)
        for _ in range(2):  # compile and warm up; gradients now exist and are accumulated in place
            jm(x).float().pow(2).mean().backward()
        out, saved = saved_for_backward(jm, x)
        out.float().pow(2).mean().backward()
        del out
        held = [x, *model.parameters(), *(q.grad for q in model.parameters() if q.grad is not None)]
        peak = step_peak_memory(lambda: jm(x).float().pow(2).mean().backward(), held).peak_bytes
        plan = thunder_remat.last_save_plan(jm)
        cost = copies = rewritten = anchor = "-"
        if plan is not None and plan.choice:
            cost, rewritten = f"{plan.choice.plan.recompute_cost:.3g}", f"{plan.rewritten_cost:.3g}"
            copies = f"{plan.copies} / {len(plan.choice.plan.recomputed)}"
            anchor = ", ".join(f"{a:g}" for a in plan.checkpoint_anchors) or "none"
        print(f"| {args.model} | {args.size} | {args.executor} | {args.attention} | {args.window if options else '-'} | {label} "
              f"| {peak:,} | {saved.activation_bytes:,} | {cost} | {copies} | {rewritten} | {anchor} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
