"""The main job: jit a built-in model with and without thunder_remat and compare.

    python -m thunder_remat                 # tiny GPT, light eager fusion executor, budget 1.0
    python -m thunder_remat --model llama --size small --executor torchcompile --budget 0.5
    python -m thunder_remat --budget 2MiB --output-dir out/

Prints a before/after table led by the activation bytes held for backward (storages, measured in
a real forward with saved_tensors_hooks) and the step's peak (measured by the allocator), with
Thunder's own pass and with thunder_remat, what the whole-graph and fusion-pair passes did, pass times, and
whether gradients equal the run without the pass (exit status 1 if they do not). Writes to the
output folder (default ``thunder_remat_out``): ``report.txt`` and ``report.json`` (every saved value
and why), ``tradeoff.png`` (saved bytes vs estimated recompute over a budget sweep, if matplotlib
is installed), ``sweep.json``, ``cut.dot`` (the whole-graph cut) and the rewritten forward and
backward traces.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from thunder_remat.executors import EXECUTOR_NAMES as EXECUTORS

log = logging.getLogger("thunder_remat")


def parse_args(argv=None) -> argparse.Namespace:
    from thunder_remat.models import MODEL_NAMES, SIZES

    p = argparse.ArgumentParser(prog="thunder-remat", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=MODEL_NAMES, default="gpt", help="built-in model (default: gpt)")
    p.add_argument("--size", choices=sorted(SIZES), default="tiny", help="model size (default: tiny)")
    p.add_argument(
        "--executor", choices=EXECUTORS, default="eager",
        help="fusion executor: eager (light, no compile), torchcompile (Inductor/Triton), nvfuser (CUDA only)",
    )
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument(
        "--attention", choices=["fused", "decomposed"], default="fused",
        help="fused (default): attention runs as one op that saves its output and log-sum-exp "
             "(thunder_remat's CPU flash-attention executor on CPU, Thunder's sdpa on CUDA); "
             "decomposed: Thunder 0.2.6's CPU default (matmul, softmax, matmul)",
    )
    p.add_argument("--dropout", type=float, default=0.0, help="dropout probability for gpt (default: 0)")
    p.add_argument("--budget", default="1.0", type=_budget,
                   help="remat_memory_budget: a fraction in [0, 1], or bytes such as 2MiB (default: 1.0)")
    p.add_argument("--cost-model", choices=["flops", "measured"], default="flops",
                   help="remat_cost_model: estimate recompute from shapes, or time each op on the device "
                        "(default: flops)")
    p.add_argument("--output-dir", default="thunder_remat_out",
                   help="folder for the report, plot, drawing and traces (default: thunder_remat_out)")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the pass does")
    return p.parse_args(argv)


def _budget(text: str):
    from thunder_remat.budget import parse_budget

    try:
        value = float(text) if text.replace(".", "", 1).isdigit() and "." in text else text
        parse_budget(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def measure(args, executors, **options) -> dict:
    import thunder
    import torch

    import thunder_remat
    from thunder_remat.inspect.measure import allocator_step_peak, saved_for_backward
    from thunder_remat.models import build_model, example_batch

    model = build_model(args.model, args.size, dropout=args.dropout or None).to(args.device)
    x = example_batch(model).to(args.device)
    jm = thunder.jit(model, executors=executors, **options)
    start = time.perf_counter()
    torch.manual_seed(0)
    out, saved = saved_for_backward(jm, x)
    out.float().pow(2).mean().backward()
    first_step_s = time.perf_counter() - start
    grads = [p.grad.detach().clone() for p in model.parameters()]
    del out
    model.zero_grad(set_to_none=True)
    # one more step under the allocator: the step's peak, compiled regions included
    peak = allocator_step_peak(lambda: jm(x).float().pow(2).mean().backward(), args.device).peak_bytes
    return {
        "jitted": jm,
        "saved": saved,
        "grads": grads,
        "first_step_s": first_step_s,
        "peak": peak,
        "pairs": thunder_remat.last_pair_pass(jm),
        "plan": thunder_remat.last_save_plan(jm),
    }


def write_outputs(folder, jm, report) -> list[str]:
    """The report, sweep, plot, drawing and traces; returns the files written."""
    import json
    from pathlib import Path

    import thunder

    import thunder_remat

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def put(name, text):
        (out / name).write_text(text)
        written.append(str(out / name))

    put("report.txt", str(report) + "\n")
    put("report.json", json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    put("forward_trace.py", str(thunder.last_traces(jm)[-1]))
    put("backward_trace.py", str(thunder.last_backward_traces(jm)[-1]))
    if thunder_remat.last_save_plan(jm) is not None and thunder_remat.last_save_plan(jm).choice is not None:
        points = thunder_remat.sweep_budgets(jm)
        put("sweep.json", json.dumps([p.__dict__ for p in points], indent=2) + "\n")
        put("cut.dot", thunder_remat.draw(jm))
        chosen = thunder_remat.last_save_plan(jm).choice.plan
        unit = thunder_remat.last_save_plan(jm).problem.cost_unit
        mark = thunder_remat.inspect.tradeoff.SweepPoint("chosen", None, chosen.saved_bytes, chosen.recompute_cost, True, unit)
        try:
            thunder_remat.plot_tradeoff(points, out / "tradeoff.png", chosen=mark,
                                        thunder_bytes=thunder_remat.plugin.thunder_alone_saved_bytes(jm))
            written.append(str(out / "tradeoff.png"))
        except ImportError as exc:
            log.warning("%s; tradeoff.png not written", exc)
    return written


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    print(f"thunder-remat: {args.model} ({args.size}) with the {args.executor} fusion executor on {args.device}, "
          f"attention {args.attention}", file=sys.stderr)
    import torch

    import thunder_remat
    import thunder_remat.inspect.tradeoff

    from thunder_remat.executors import attention_executor_for, fusion_executor_by_name
    from thunder_remat.pairs.run import PairStatus

    try:
        executors = [fusion_executor_by_name(args.executor)]
    except RuntimeError as exc:
        raise SystemExit(f"thunder-remat: {exc}") from None
    if args.attention == "fused":
        executors.insert(0, attention_executor_for(args.device))
    print("  [1/3] compiling and running without thunder_remat (Thunder's built-in pass) ...", file=sys.stderr)
    before = measure(args, executors)
    print(f"  [2/3] compiling and running with thunder_remat (budget {args.budget}) ...", file=sys.stderr)
    after = measure(args, executors, remat=True, remat_memory_budget=args.budget, remat_cost_model=args.cost_model)

    same = all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(before["grads"], after["grads"]))
    pairs, plan = after["pairs"], after["plan"]
    held0, held1 = before["saved"].activation_bytes, after["saved"].activation_bytes
    ratio = f"{held1 / held0:.2f}x" if held0 else "-"
    rows = [
        ("activation bytes held for backward", f"{held0:,}", f"{held1:,} ({ratio})"),
        ("  with parameters and inputs", f"{before['saved'].nbytes:,}", f"{after['saved'].nbytes:,}"),
        ("tensors saved for backward", before["saved"].count, after["saved"].count),
        ("step peak, measured by the allocator", f"{before['peak']:,}",
         f"{after['peak']:,} ({after['peak'] / before['peak']:.2f}x)" if before["peak"] else f"{after['peak']:,}"),
    ]
    if plan is not None and plan.peak_estimate is not None:
        rows.append(("step peak, thunder_remat's estimate", "-", f"{plan.peak_estimate:,}"))
    if plan is not None and plan.choice is not None:
        rows += [
            ("whole-graph: planned activation bytes", "-", f"{plan.choice.plan.saved_bytes:,}"),
            ("whole-graph: forward ops recomputed in backward", "-", len(plan.choice.plan.recomputed)),
            (f"whole-graph: est. recompute ({plan.problem.cost_unit})", "-", f"{plan.choice.plan.recompute_cost:.3g}"),
            ("whole-graph pass time (ms)", "-", f"{plan.timings.total_ms:.1f}"),
        ]
    if pairs is not None:
        rows += [
            ("fusion pairs visited / rewritten", "-", f"{len(pairs.pairs)} / {sum(p.status is PairStatus.REWRITTEN for p in pairs.pairs)}"),
            ("bytes crossing fusion pairs (before -> after)", "-", f"{pairs.bytes_before} -> {pairs.bytes_after}"),
            ("pair pass time (ms)", "-",
             f"{pairs.timings.total_ms - pairs.timings.reemit_ms:.1f} (+{pairs.timings.reemit_ms:.1f} re-emit)"),
        ]
    rows += [
        ("first step incl. compile (s)", f"{before['first_step_s']:.1f}", f"{after['first_step_s']:.1f}"),
        ("gradients equal to the run without the pass", "-", "yes" if same else "NO"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'':{width}}  {'Thunder':>14}  {'thunder_remat':>22}")
    for label, b, a in rows:
        print(f"{label:{width}}  {str(b):>14}  {str(a):>22}")
    print("activation bytes: the storages a real forward keeps for the backward (saved_tensors_hooks), each once; "
          "parameters and inputs are held anyway and left out, 'with parameters and inputs' counts them too; "
          "step peak: the most bytes allocated at once during a second step, above what was allocated when it "
          "began (gradients set to None first)")
    print(f"  [3/3] writing the report, sweep, plot, drawing and traces to {args.output_dir}/ ...", file=sys.stderr)
    written = write_outputs(args.output_dir, after["jitted"], thunder_remat.explain(after["jitted"]))
    print(f"wrote {len(written)} files to {args.output_dir}/: " + ", ".join(p.rsplit("/", 1)[-1] for p in written))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
