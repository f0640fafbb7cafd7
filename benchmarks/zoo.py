"""The zoo: real model code (litgpt, Hugging Face transformers, the built-in models) through
thunder_remat, with the light executor and with Thunder's torch.compile executor.

For every zoo model (``tests/model_zoo.py``, random weights, nothing downloaded) and executor:

* Thunder 0.2.6 without thunder_remat (its own fusion-pair pass), once;
* thunder_remat at budgets 1.0, 0.5 and 0.0, and at two byte budgets (a third and two thirds of
  the way from the smallest plan to the fastest, in bytes);
* torch.compile (Inductor) with ``torch._functorch.config.activation_memory_budget`` at 1.0, 0.5
  and 0.0 (once per model; it does not depend on Thunder's executor).

Each run is one forward under ``thunder_remat.inspect.measure.saved_for_backward`` (activation storages:
parameters, buffers and inputs left out) and one backward of ``output.float().pow(2).mean()``;
gradients are compared with eager PyTorch (atol 1e-5, rtol 1e-4). The table gives, per model and
executor: Thunder's bytes, thunder_remat's measured and planned bytes per budget, whether they
are equal, the ratio to Thunder at 1.0, torch.compile's bytes, whether a byte budget held, the
budgets whose whole-graph plan failed (``last_save_plan(jm).status``; Thunder's own trace runs
then) and whether ``thunder_remat.explain`` ran after every budget's run.

Usage::

    python benchmarks/zoo.py [--size small] [--executors eager,torchcompile] [--models litgpt,BERT]
                             [--write docs/benchmarks.md]

``--write`` replaces the part of the file between ``<!-- zoo table -->`` and
``<!-- end zoo table -->``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from pathlib import Path

# the zoo (tests/model_zoo.py) is shared with the tests, not installed with the package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

log = logging.getLogger("zoo")

BUDGETS = (1.0, 0.5, 0.0)
BYTE_STEPS = (1 / 3, 2 / 3)
START, END = "<!-- zoo table -->", "<!-- end zoo table -->"


def parse_args(argv=None):
    from model_zoo import ZOO_SHAPES

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="small", choices=sorted(ZOO_SHAPES))
    p.add_argument("--executors", default="eager,torchcompile", help="comma list of eager, torchcompile")
    p.add_argument("--models", default="", help="comma list of substrings of zoo model names (default: all)")
    p.add_argument("--no-torch", action="store_true", help="skip the torch.compile activation_memory_budget runs")
    p.add_argument("--write", help="markdown file whose zoo table is replaced")
    args = p.parse_args(argv)
    args.executors = [e.strip() for e in args.executors.split(",") if e.strip()]
    bad = [e for e in args.executors if e not in ("eager", "torchcompile")]
    if bad:
        p.error(f"--executors: unknown {bad}; choose from eager, torchcompile")
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    return args


def torch_compile_bytes(entry, size, budget, ref) -> tuple[int, bool]:
    import torch
    import torch._functorch.config as functorch_config

    from thunder_remat.inspect.measure import saved_for_backward
    from model_zoo import same_gradients

    torch._dynamo.reset()
    model, inputs = entry.make(size)
    with functorch_config.patch(activation_memory_budget=budget):
        compiled = torch.compile(model)
        out, saved = saved_for_backward(compiled, **inputs, held=[*model.parameters(), *model.buffers()])
        entry.output(out).float().pow(2).mean().backward()
    return saved.activation_bytes, same_gradients(ref, [p.grad for p in model.parameters()])


def bench(entry, size, executor_name, torch_bytes) -> dict:
    import thunder_remat
    from thunder_remat.executors import fusion_executor_by_name
    from thunder_remat.inspect.tradeoff import frontier_of
    from thunder_remat.plugin import thunder_alone_saved_bytes
    from model_zoo import eager_gradients, run_zoo_model, same_gradients

    executors = [fusion_executor_by_name(executor_name)]
    ref = eager_gradients(entry, size)
    start = time.perf_counter()
    try:
        alone = run_zoo_model(entry, executors, size)
    except Exception as exc:  # a Thunder 0.2.6 limitation: thunder_remat cannot be compared there
        log.warning("%s / %s: Thunder alone fails: %s: %s", entry.name, executor_name, type(exc).__name__, exc)
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return dict(model=entry.name, executor=executor_name, error=f"{type(exc).__name__}: {first_line[:80]}")
    row = dict(model=entry.name, executor=executor_name, thunder=alone.saved.activation_bytes,
               thunder_ok=same_gradients(ref, alone.grads), runs={}, byte_runs=[], torch=torch_bytes)
    frontier = None
    row["explain_errors"] = []
    for budget in BUDGETS:
        run = run_zoo_model(entry, executors, size, remat=True, remat_memory_budget=budget)
        plan = thunder_remat.last_save_plan(run.jitted)
        row["runs"][budget] = dict(measured=run.saved.activation_bytes, planned=_planned(plan),
                                   ok=same_gradients(ref, run.grads), failed=plan.failure)
        if plan.failure is not None:
            log.warning("%s / %s at %s: plan failed: %s", entry.name, executor_name, budget, plan.failure[:300])
        row["explain_errors"] += _explain_error(thunder_remat, run.jitted, budget)
        if budget == 1.0:
            row["static_thunder"] = thunder_alone_saved_bytes(run.jitted)
            frontier = frontier_of(plan) if plan.choice is not None else None
    if frontier is None:  # no plan at 1.0: no frontier to place byte budgets on
        row["seconds"] = time.perf_counter() - start
        return row
    low, high = frontier.smallest.saved_bytes, frontier.fastest.saved_bytes
    for step in BYTE_STEPS:
        limit = max(2, int(low + step * (high - low)))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run = run_zoo_model(entry, executors, size, remat=True, remat_memory_budget=limit)
        plan = thunder_remat.last_save_plan(run.jitted)
        infeasible = any("BudgetInfeasible" in type(w.message).__name__ for w in caught)
        row["byte_runs"].append(dict(limit=limit, measured=run.saved.activation_bytes, infeasible=infeasible,
                                     planned=_planned(plan), ok=same_gradients(ref, run.grads)))
    row["seconds"] = time.perf_counter() - start
    log.info("%s / %s: %.0f s", entry.name, executor_name, row["seconds"])
    return row


def _planned(plan) -> int | None:
    """The bytes the plan promised (None: the pass failed before it had a plan)."""
    return plan.choice.plan.saved_bytes if plan.choice is not None else None


def _explain_error(thunder_remat, jitted, budget) -> list[str]:
    try:
        thunder_remat.explain(jitted)
        return []
    except Exception as exc:
        return [f"{budget}: {type(exc).__name__}: {str(exc)[:60]}"]


def table(rows, size) -> str:
    yn = {True: "yes", False: "NO"}
    lines = [
        "| model | executor | Thunder B | thunder_remat B at 1.0 / 0.5 / 0.0 | = planned | ratio to Thunder at 1.0 "
        "| torch.compile B at 1.0 / 0.5 / 0.0 | byte budgets held (B budget: B saved) "
        "| grads equal eager (Thunder, thunder_remat, torch.compile) | plan failed at | explain runs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['executor']} | fails in Thunder 0.2.6 alone: `{r['error']}` "
                         "| | | | | | | | |")
            continue
        runs = [r["runs"][b] for b in BUDGETS]
        equal = all(x["measured"] == x["planned"] for x in runs + r["byte_runs"])
        held = "; ".join(f"{x['limit']:,}: {x['measured']:,}" + (" (infeasible)" if x["infeasible"] else "")
                         + ("" if x["measured"] <= x["limit"] or x["infeasible"] else " EXCEEDED")
                         for x in r["byte_runs"])
        grads = all(x["ok"] for x in runs + r["byte_runs"]) and r["thunder_ok"] and all(ok for _, ok in r["torch"])
        failed = ", ".join(f"{b}" for b, x in zip(BUDGETS, runs) if x["failed"] is not None) or "-"
        explained = "yes" if not r["explain_errors"] else "NO: " + "; ".join(r["explain_errors"])
        held = held or "-"
        torch_cell = " / ".join(f"{b:,}" if isinstance(b, int) else b for b, _ in r["torch"]) if r["torch"] else "-"
        ours = " / ".join(f"{x['measured']:,}" for x in runs)
        lines.append(
            f"| {r['model']} | {r['executor']} | {r['thunder']:,} | {ours} "
            f"| {yn[equal]} | {runs[0]['measured'] / r['thunder']:.2f}x | {torch_cell} | {held} | {yn[grads]} "
            f"| {failed} | {explained} |"
        )
    from model_zoo import ZOO_SHAPES

    shape = ZOO_SHAPES[size]
    lines.append("")
    lines.append(f"Zoo size `{size}`: {shape.layers} layers, width {shape.width}, batch {shape.batch} x "
                 f"{shape.tokens} tokens, float32, CPU. Activation bytes are storages saved for backward in one "
                 "real forward (saved_tensors_hooks), parameters and inputs left out; '= planned': every "
                 "thunder_remat run saved exactly the bytes its plan promised; the static figure of what Thunder "
                 "alone saves (`thunder_remat.plugin.thunder_alone_saved_bytes`) equalled the measured one in "
                 f"{sum(r.get('static_thunder') == r.get('thunder') for r in rows if 'error' not in r)} of "
                 f"{sum('error' not in r for r in rows)} rows.")
    return "\n".join(lines)


def main(argv=None) -> int:
    warnings.filterwarnings("ignore")
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    from model_zoo import ZOO, available, eager_gradients

    entries = [e for e in ZOO if available(e) and (not args.models or any(m in e.name for m in args.models))]
    skipped = [e.name for e in ZOO if not available(e)]
    if skipped:
        log.warning("skipped (package missing): %s", ", ".join(skipped))
    from doc_tables import emit_table

    rows = []
    for entry in entries:
        torch_bytes = []
        if not args.no_torch:
            ref = eager_gradients(entry, args.size)
            for budget in BUDGETS:
                try:
                    torch_bytes.append(torch_compile_bytes(entry, args.size, budget, ref))
                except Exception as exc:  # a torch.compile failure is torch's: recorded, not ours to stop on
                    log.warning("%s: torch.compile at activation_memory_budget %s fails: %s: %s", entry.name, budget,
                                type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
                    torch_bytes.append((f"fails ({type(exc).__name__})", True))
        for executor in args.executors:
            rows.append(bench(entry, args.size, executor, torch_bytes))
        # written after every model: a long run (an hour and more on 2 cores) can be read as it goes
        emit_table(table(rows, args.size), args.write, START, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
