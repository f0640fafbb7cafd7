"""What thunder_remat decided, model by model and budget by budget, written so that two versions of
the code can be compared: a refactor must leave every plan, byte count and rewritten trace as it was.

    python benchmarks/plan_fingerprints.py --out after.json [--models "built-in gpt,transformers BERT"]
        [--executors eager,default] [--budgets none,1.0,0.5,0.15,0.0,peak:300kB]
    python benchmarks/plan_fingerprints.py --compare before.json after.json

Each row (model, executor, budget) holds the saved set and its bytes, the recomputed ops, the
copies the backward makes, the checkpoints, the peak estimate, what the fusion-pair pass did, and a
hash of the forward and backward execution traces Thunder runs. Only public entry points are read
(``thunder.jit``, ``last_save_plan``, ``last_pair_pass``, Thunder's last traces), so the script runs
unchanged on older commits. CPU only; the small zoo shapes; run under ``PYTHONHASHSEED=0`` (set
for you when no seed is given), as Thunder's own trace depends on the hash seed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

# the zoo (tests/model_zoo.py) is shared with the tests, not installed with the package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

log = logging.getLogger("plan_fingerprints")

EXECUTORS = ("eager", "default")
BUDGETS = ("none", "1.0", "0.5", "0.15", "0.0", "peak:300kB")


def _budget_option(text: str) -> dict:
    if text == "none":
        return {}
    try:
        return {"remat_memory_budget": float(text)}
    except ValueError:
        return {"remat_memory_budget": text}


#: trace lines that name no part of the program: the provenance line (it holds the passes'
#: timings) and the source-position comments (they hold the checkout's path)
_NOT_PROGRAM = re.compile(r"^(# Constructed by |\s*# /\S+:\d+: )")


def _digest(trace) -> str:
    """A hash of the trace's program, the lines of ``_NOT_PROGRAM`` left out."""
    program = "\n".join(line for line in str(trace).splitlines() if not _NOT_PROGRAM.match(line))
    return hashlib.sha256(program.encode()).hexdigest()[:16]


def fingerprint(entry, executor_name: str, budget: str) -> dict:
    """One row: jit ``entry`` with thunder_remat at ``budget`` and read what the passes decided."""
    import thunder

    import thunder_remat
    from model_zoo import run_zoo_model

    if executor_name == "default":
        executors = thunder.get_default_executors()
    else:
        from thunder_remat.executors import fusion_executor_by_name

        executors = [fusion_executor_by_name(executor_name)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = run_zoo_model(entry, executors, remat=True, **_budget_option(budget))
    row: dict = {"warnings": sorted({str(w.message)[:160] for w in caught if "thunder_remat" in str(w.message)})}
    save = thunder_remat.last_save_plan(run.jitted)
    if save is not None:
        choice = getattr(save, "choice", None)
        plan = getattr(choice, "plan", None)
        row.update(
            status=str(getattr(save, "status", "")),
            saved=list(getattr(plan, "saved", ())),
            saved_bytes=getattr(plan, "saved_bytes", None),
            recomputed=list(getattr(plan, "recomputed", ())),
            copied_ops=list(getattr(save, "copied_ops", ())),
            checkpoint_levels=[list(level) for level in getattr(save, "checkpoint_levels", ())],
            peak_estimate=getattr(save, "peak_estimate", None),
        )
    pairs = thunder_remat.last_pair_pass(run.jitted)
    if pairs is not None:
        row["pairs"] = [
            [_field(p, "status"), list(_field(p, "recomputed") or ())] for p in getattr(pairs, "pairs", ())
        ]
    row["measured_saved_bytes"] = [run.saved.nbytes, run.saved.activation_bytes]
    row["forward_trace"] = _digest(thunder.last_traces(run.jitted)[-1])
    row["backward_trace"] = _digest(thunder.last_backward_traces(run.jitted)[-1])
    return row


def _field(record, name: str):
    """A pair record's field (records were dicts before they were dataclasses)."""
    value = record.get(name) if isinstance(record, dict) else getattr(record, name, None)
    return getattr(value, "value", value)


def compare(before_path: str, after_path: str) -> int:
    """Print every row that differs; the exit status is the number of differing rows (capped)."""
    with open(before_path) as f:
        before = json.load(f)
    with open(after_path) as f:
        after = json.load(f)
    differing = 0
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if a == b:
            continue
        differing += 1
        if a is None or b is None:
            print(f"{key}: only in {'after' if a is None else 'before'}")
            continue
        fields = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        print(f"{key}: " + "; ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in fields))
    print(f"{len(set(before) & set(after))} rows in both, {differing} differ")
    return min(differing, 100)


def _with_fixed_hash_seed() -> None:
    """Run again with ``PYTHONHASHSEED=0`` unless a seed is set: Thunder 0.2.6's own passes order
    some values by string hashes (the transformers BLOOM trace's ``update_aliases`` argument order
    changes from one process to the next, with or without thunder_remat), so two trees compare
    only under one seed."""
    if os.environ.get("PYTHONHASHSEED") is None:
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, *sys.argv])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="where the rows go (JSON)")
    p.add_argument("--models", default="", help="comma list of zoo names (default: all available)")
    p.add_argument("--executors", default=",".join(EXECUTORS), help=f"comma list of {', '.join(EXECUTORS)}")
    p.add_argument("--budgets", default=",".join(BUDGETS), help="comma list: none, fractions, bytes, peak:...")
    p.add_argument("--rows", help="a JSON file of row keys ('model | executor | budget') to run, instead of the "
                   "product of --models, --executors and --budgets")
    p.add_argument("--fresh", action="store_true",
                   help="each row in a process of its own (Thunder's traces depend on what the process jitted "
                        "before: proxy numbering, the names of tied parameters)")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two files and exit")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        p.error("--out is required unless --compare is given")
    _with_fixed_hash_seed()
    executors = [e.strip() for e in args.executors.split(",") if e.strip()]
    bad = [e for e in executors if e not in EXECUTORS]
    if bad:
        p.error(f"--executors: unknown {bad}; choose from {', '.join(EXECUTORS)}")

    from model_zoo import available, zoo_model, zoo_names

    names = [n.strip() for n in args.models.split(",") if n.strip()] or zoo_names()
    entries = [zoo_model(n) for n in names]
    budgets = [b.strip() for b in args.budgets.split(",") if b.strip()]
    if args.rows:
        with open(args.rows) as f:
            wanted = [key.split(" | ") for key in json.load(f)]
    else:
        wanted = [(entry.name, executor, budget) for entry in entries for executor in executors for budget in budgets]
    rows: dict = {}
    for name, executor, budget in wanted:
        entry = zoo_model(name)
        if not available(entry):
            log.info("%s: skipped (%s is not installed)", entry.name, entry.requires)
            continue
        if entry.thunder_error(executor):
            continue
        start = time.perf_counter()
        key = f"{entry.name} | {executor} | {budget}"
        rows[key] = _fresh_row(name, executor, budget) if args.fresh else _row(entry, executor, budget)
        log.info("[%d/%d] %s (%.0f s)", len(rows), len(wanted), key, time.perf_counter() - start)
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1, sort_keys=True)
    return 0


def _row(entry, executor: str, budget: str) -> dict:
    try:
        return fingerprint(entry, executor, budget)
    except Exception as exc:  # a row that fails is a row to compare, not a stop
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def _fresh_row(name: str, executor: str, budget: str) -> dict:
    """One row fingerprinted by a new process of this script."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "row.json")
        subprocess.run([sys.executable, os.path.abspath(__file__), "--out", out, "--models", name, "--executors",
                        executor, "--budgets", budget], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        with open(out) as f:
            (row,) = json.load(f).values()
        return row


if __name__ == "__main__":
    sys.exit(main())
