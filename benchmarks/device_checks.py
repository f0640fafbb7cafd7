"""The checks that need a GPU, prepared as one short script for when a device is lent.

One row per run, each a fresh compile of the same model on ``--device``:

* eager PyTorch (no compile), the reference for gradients;
* Thunder with the chosen fusion executor, without thunder_remat (on CUDA also Thunder's sdpa
  executor for attention, as Thunder's defaults have it);
* Thunder + thunder_remat at each budget, and once at 0.5 with ``remat_cost_model="measured"``
  (every distinct forward op timed on the device: CUDA events on a GPU);
* ``torch.compile`` with ``torch._functorch.config.activation_memory_budget`` at some budgets.

Columns: saved activation bytes (``saved_tensors_hooks`` in a real forward); the step's peak,
on CUDA from the allocator (``max_memory_allocated`` in a plain step, less what was allocated
before it), and with ``--executor none`` also from ``step_peak_memory`` (tensor storage,
dispatch mode; it does not see inside fused regions, so it is left out otherwise); step time
(median of 5, synchronized); gradients equal to eager PyTorch (no dropout in these models).
Every row is printed as soon as it is measured, so a run cut short still reports what it did.
Also runs on CPU (no allocator column), which is how it is tested.

Usage::

    python benchmarks/device_checks.py --device cuda --executor torchcompile --model gpt --size medium
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
import warnings

BUDGETS = (1.0, 0.7, 0.5, 0.3, 0.1, 0.0)
TORCH_BUDGETS = (1.0, 0.5, 0.1)


def _sync(device):
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _loss(out):
    return out.float().pow(2).mean()


def reference_grads(model_name, size, device):
    from thunder_remat.models import build_model, example_batch

    model = build_model(model_name, size).to(device)
    _loss(model(example_batch(model).to(device))).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def measure(model, fn, x, device, *, tensor_peak, ref=None):
    """Saved bytes, step peak(s), step time and gradient check for ``fn`` (already built)."""
    import torch

    from thunder_remat.inspect.measure import saved_for_backward, step_peak_memory

    def step():
        _loss(fn(x)).backward()

    start = time.perf_counter()
    step()
    _sync(device)
    first_s = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    out, saved = saved_for_backward(fn, x)
    _loss(out).backward()
    del out
    grads_ok = None
    if ref is not None:
        grads_ok = all(
            torch.allclose(p.grad, g, atol=1e-4, rtol=1e-3) for p, g in zip(model.parameters(), ref)
        )
    allocator = None
    if device.startswith("cuda"):
        _sync(device)
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        _sync(device)
        allocator = torch.cuda.max_memory_allocated() - before
    peak = None
    if tensor_peak:
        held = [x, *model.parameters(), *(p.grad for p in model.parameters() if p.grad is not None)]
        peak = step_peak_memory(step, held).peak_bytes
    times = []
    for _ in range(5):
        _sync(device)
        t = time.perf_counter()
        step()
        _sync(device)
        times.append((time.perf_counter() - t) * 1e3)
    return dict(saved=saved.activation_bytes, allocator=allocator, peak=peak, step_ms=statistics.median(times),
                first_s=first_s, grads_ok=grads_ok)


def runs(args):
    """(label, build) pairs; build(model) returns the callable to measure, a plan getter or None, and
    the context to measure it in (torch.compile reads its budget when it compiles, on the first call)."""
    import contextlib

    import thunder
    import torch

    import thunder_remat
    from thunder_remat.executors import fusion_executor_by_name

    executor = None if args.executor == "none" else fusion_executor_by_name(args.executor)
    executors = [executor] if executor is not None else []
    if args.device.startswith("cuda"):
        # What a Thunder user on a GPU gets by default: attention through Thunder's sdpa executor
        # (one fused kernel, backward from out + logsumexp) instead of its decomposition.
        executors = [thunder.get_executor("sdpa"), *executors]

    def thunder_run(**options):
        def build(model):
            jm = thunder.jit(model, executors=executors, **options)
            plan_of = (lambda: thunder_remat.last_save_plan(jm)) if options else None
            return jm, plan_of, contextlib.nullcontext()
        return build

    def torch_run(budget):
        def build(model):
            from torch._functorch import config as functorch_config

            torch._dynamo.reset()
            return torch.compile(model), None, functorch_config.patch(activation_memory_budget=budget)
        return build

    yield "eager PyTorch", lambda model: (model, None, contextlib.nullcontext())
    yield f"Thunder + {args.executor} (no remat)", thunder_run()
    for b in args.budgets:
        yield f"thunder_remat budget {b}", thunder_run(remat=True, remat_memory_budget=b)
    if args.measured:
        yield "thunder_remat budget 0.5, measured costs", thunder_run(
            remat=True, remat_memory_budget=0.5, remat_cost_model="measured")
    for b in args.torch_budgets:
        yield f"torch.compile budget {b}", torch_run(b)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--executor", default="torchcompile", choices=["none", "eager", "torchcompile", "nvfuser"])
    p.add_argument("--model", default="gpt", choices=["mlp", "gpt", "llama"])
    p.add_argument("--size", default="bench", choices=["tiny", "small", "bench", "medium"])
    p.add_argument("--measured", action=argparse.BooleanOptionalAction, default=True,
                   help="also run budget 0.5 with remat_cost_model='measured' (default: yes)")
    p.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="thunder_remat budget fractions")
    p.add_argument("--torch-budgets", default=",".join(map(str, TORCH_BUDGETS)),
                   help="torch.compile activation_memory_budget fractions ('' for none)")
    args = p.parse_args(argv)
    try:
        args.budgets = [float(b) for b in args.budgets.split(",") if b.strip()]
        args.torch_budgets = [float(b) for b in args.torch_budgets.split(",") if b.strip()]
    except ValueError:
        p.error("--budgets and --torch-budgets take comma lists of numbers in [0, 1]")
    if any(not 0.0 <= b <= 1.0 for b in (*args.budgets, *args.torch_budgets)):
        p.error("--budgets and --torch-budgets take numbers in [0, 1]")
    warnings.filterwarnings("ignore")
    from thunder_remat.models import build_model, example_batch

    ref = reference_grads(args.model, args.size, args.device)
    print("| model | device | run | saved activation B | step peak B (allocator) | step peak B (tensors) "
          "| est. recompute | step ms | first call s | grads = eager |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    failures = 0
    for label, build in runs(args):
        try:
            model = build_model(args.model, args.size).to(args.device)
            x = example_batch(model).to(args.device)
            fn, plan_of, context = build(model)
            with context:
                r = measure(model, fn, x, args.device, tensor_peak=args.executor == "none", ref=ref)
            plan = plan_of() if plan_of else None
        except Exception:  # one broken run must not hide the others' numbers
            failures += 1
            print(f"| {args.model} {args.size} | {args.device} | {label} | FAILED: "
                  f"{traceback.format_exc(limit=3).splitlines()[-1]} |||||||", flush=True)
            continue
        cost = "-"
        if plan is not None and plan.choice is not None:
            cost = f"{plan.choice.plan.recompute_cost:.3g} {plan.problem.cost_unit}"
        fmt = lambda v: "-" if v is None else f"{v:,}"  # noqa: E731
        ok = {None: "-", True: "yes", False: "NO"}[r["grads_ok"]]
        print(f"| {args.model} {args.size} | {args.device} | {label} | {r['saved']:,} | {fmt(r['allocator'])} "
              f"| {fmt(r['peak'])} | {cost} | {r['step_ms']:.2f} | {r['first_s']:.1f} | {ok} |", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
