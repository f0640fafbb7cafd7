"""Compile cost as the model grows: Thunder's first call with and without thunder_remat, side by side.

For each depth (the built-in GPT at its tiny width: 16 wide, 2 heads, 8 tokens, batch 2) and each
budget, one fresh ``thunder.jit`` and its first forward+backward call, timed; Thunder alone is timed
twice, as it ships and with the linear-time stand-ins for its two quadratic helpers that
thunder_remat uses in its own compilations (``executors/hooks/thunder_speedups.py``), so that the table
shows both what a user waits for and what thunder_remat itself adds; with thunder_remat,
the whole-graph pass's own time split as its result reports it (analysis, solve: every min cut and
knapsack, rewrite, peak estimates), the copies its rewrite made and how many forward ops it
recomputes, and the peak Python memory of the pass alone (tracemalloc, on a second run of the pass
over the same joint trace, after the timed call). The fitted growth of the pass time from the smallest depth of at least 8 to the largest is
the slope of log(time) against log(layers).

Usage::

    python benchmarks/compile_scaling.py --layers 2,8,16,32 --budgets 1.0,0.5,0.1,0.0 \\
        [--executor eager] [--write docs/benchmarks.md]

``--write`` replaces the part of the file between ``<!-- compile scaling table -->`` and
``<!-- end compile scaling table -->``.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
import tracemalloc
import warnings

log = logging.getLogger("compile_scaling")
START, END = "<!-- compile scaling table -->", "<!-- end compile scaling table -->"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="2,8,16,32", help="comma list of depths (default 2,8,16,32)")
    p.add_argument("--budgets", default="1.0,0.5,0.1,0.0", help="comma list of budget fractions")
    p.add_argument("--executor", default="eager", choices=["eager", "torchcompile"])
    p.add_argument("--write", help="markdown file whose compile-scaling table is replaced")
    args = p.parse_args(argv)
    try:
        args.layers = [int(x) for x in args.layers.split(",")]
        args.budgets = [float(x) for x in args.budgets.split(",")]
    except ValueError:
        p.error("--layers takes ints, --budgets numbers in [0, 1], as comma lists")
    if any(n < 1 for n in args.layers) or any(not 0.0 <= b <= 1.0 for b in args.budgets):
        p.error("--layers must be >= 1 and --budgets in [0, 1]")
    return args


def _model(layers: int):
    import torch

    from thunder_remat.models import BUILDERS, ModelSpec

    spec = ModelSpec(n_layer=layers, n_embd=16, n_head=2, seq_len=8, batch=2)
    torch.manual_seed(0)
    model = BUILDERS["gpt"](spec)
    model.spec = spec
    return model, torch.randint(0, spec.vocab, (spec.batch, spec.seq_len))


def first_call(layers: int, executor, **options) -> tuple[float, object, int]:
    """Seconds of a fresh jit's first forward+backward; the jitted model; the peak Python memory
    of the whole-graph pass in bytes (0 without thunder_remat), from running the pass once more
    on the same joint trace under tracemalloc (which would slow the timed call down), with the
    collector paused as in the plugin. The timed call's pass also filled Thunder's own per-bound-
    symbol caches of the trace (flattened arguments and outputs), which the re-run finds filled."""
    import thunder

    import thunder_remat.plugin as plugin

    model, x = _model(layers)
    seen = []
    original = plugin.plan_saved_values

    def spy(trace, config, **kwargs):
        seen.append((trace, config, kwargs))
        return original(trace, config, **kwargs)

    plugin.plan_saved_values = spy
    try:
        jitted = thunder.jit(model, executors=[executor], **options)
        start = time.perf_counter()
        jitted(x).float().pow(2).mean().backward()
        seconds = time.perf_counter() - start
    finally:
        plugin.plan_saved_values = original
    memory = 0
    if seen:
        trace, config, kwargs = seen[-1]
        with plugin._collector_paused():  # as the plugin runs the pass
            tracemalloc.start()
            original(trace, config, **kwargs)
            memory = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    return seconds, jitted, memory


def bench(layers_list, budgets, executor_name):
    import thunder_remat
    from thunder_remat.executors import fusion_executor_by_name
    from thunder_remat.executors.hooks.thunder_speedups import forced

    executor = fusion_executor_by_name(executor_name)
    first_call(1, executor)  # warm-up: the process's first compilation also pays for imports and caches
    rows = []
    for layers in layers_list:
        alone, _, _ = first_call(layers, executor)
        with forced():
            alone_fast, _, _ = first_call(layers, executor)
        log.info("%d layers: Thunder alone %.1f s, with the stand-ins %.1f s", layers, alone, alone_fast)
        for budget in budgets:
            seconds, jitted, memory = first_call(layers, executor, remat=True, remat_memory_budget=budget)
            plan = thunder_remat.last_save_plan(jitted)
            rows.append(dict(layers=layers, budget=budget, alone=alone, alone_fast=alone_fast, ours=seconds,
                             analysis=plan.timings.analysis_ms,
                             solve=plan.timings.solve_ms, rewrite=plan.timings.rewrite_ms, estimate=plan.timings.estimate_ms,
                             total=plan.timings.total_ms, copies=plan.copies, recomputed=len(plan.choice.plan.recomputed),
                             memory=memory, anchors=plan.checkpoint_anchors))
            log.info("  budget %s: %.1f s, pass %.0f ms, %d copies", budget, seconds, plan.timings.total_ms, plan.copies)
    return rows


def growth(rows, budget) -> float | None:
    """The fitted exponent of pass time against depth, from the first depth >= 8 to the last."""
    points = sorted((r["layers"], r["total"]) for r in rows if r["budget"] == budget and r["layers"] >= 8)
    if len(points) < 2:
        return None
    xs, ys = [math.log(n) for n, _ in points], [math.log(max(t, 1e-3)) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def table(rows, budgets, executor) -> str:
    lines = [
        "| layers | budget | first call without / with thunder_remat (s) | with / without "
        "| without, with the stand-ins (s) | with / that | whole-graph pass (ms) "
        "| pass / first call without | analysis / solve / rewrite / estimate (ms) | copies / recomputed ops "
        "| pass peak Python memory (MB) | checkpoint anchors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['layers']} | {r['budget']} | {r['alone']:.1f} / {r['ours']:.1f} | {r['ours'] / r['alone']:.2f}x "
            f"| {r['alone_fast']:.1f} | {r['ours'] / r['alone_fast']:.2f}x "
            f"| {r['total']:.0f} | {r['total'] / 1e3 / r['alone']:.1%} "
            f"| {r['analysis']:.0f} / {r['solve']:.0f} / {r['rewrite']:.0f} / {r['estimate']:.0f} "
            f"| {r['copies']:,} / {r['recomputed']:,} | {r['memory'] / 1e6:.1f} "
            f"| {', '.join(f'{a:g}' for a in r['anchors']) or 'none'} |"
        )
    fits = [f"{b}: {growth(rows, b):.2f}" for b in budgets if growth(rows, b) is not None]
    lines.append("")
    lines.append(f"Built-in GPT at its tiny width, Thunder with the {executor} executor, CPU. Fitted exponent of the "
                 f"pass time against depth (8 layers and up), per budget: {'; '.join(fits) or 'n/a'}.")
    return "\n".join(lines)


def main(argv=None) -> int:
    warnings.filterwarnings("ignore")
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    logging.getLogger("thunder_remat").setLevel(logging.WARNING)
    rows = bench(args.layers, args.budgets, args.executor)
    text = table(rows, args.budgets, args.executor)
    from doc_tables import emit_table

    emit_table(text, args.write, START, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
