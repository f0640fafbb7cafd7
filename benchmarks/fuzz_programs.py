"""The long property-test profile: many random programs through thunder.jit with and without thunder_remat.

Same generator and checks as tests/test_properties.py (tests/random_programs.py), with more
examples and no derandomization. Prints one line per 25 programs and a summary; exits 1 on the
first failing program, printing it.

Usage::

    python benchmarks/fuzz_programs.py --programs 2000 --seed 0 [--budget 1.0] [--executor eager]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--programs", type=int, default=2000, help="number of programs to generate (default 2000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=float, default=1.0, help="remat_memory_budget fraction (default 1.0)")
    p.add_argument("--executor", choices=["eager", "torchcompile"], default="eager")
    args = p.parse_args(argv)
    if args.programs < 1 or not 0.0 <= args.budget <= 1.0:
        p.error("--programs must be >= 1 and --budget in [0, 1]")
    warnings.filterwarnings("ignore", message="transformer_engine")

    from hypothesis import HealthCheck, Phase, given, seed, settings

    from random_programs import check, programs
    from thunder_remat.executors import fusion_executor_by_name

    executor = fusion_executor_by_name(args.executor)
    counts = {"run": 0, "passed": 0}
    start = time.perf_counter()

    @seed(args.seed)
    @settings(max_examples=args.programs, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(program=programs())
    def fuzz(program):
        counts["run"] += 1
        check(program, executor, budget=args.budget)
        counts["passed"] += 1
        if counts["passed"] % 25 == 0:
            print(f"{counts['passed']} programs passed ({counts['run'] - counts['passed']} rejected: Thunder "
                  f"cannot run them without thunder_remat), {time.perf_counter() - start:.0f} s", flush=True)

    try:
        fuzz()
    except Exception as exc:
        print(f"FAILED after {counts['passed']} passing programs: {type(exc).__name__}: {exc}", flush=True)
        for note in getattr(exc, "__notes__", ()):  # hypothesis names the failing program here
            print(note, flush=True)
        return 1
    print(f"done: {counts['passed']} programs passed, {counts['run'] - counts['passed']} rejected, "
          f"executor {args.executor}, budget {args.budget}, seed {args.seed}, {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
