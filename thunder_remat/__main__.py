"""The main job: jit a built-in model with and without thunder_remat and compare.

    python -m thunder_remat                 # tiny GPT, light eager fusion executor
    python -m thunder_remat --model llama --size small --executor torchcompile

Prints a before/after table: tensors and bytes saved for backward (measured in a real forward
with saved_tensors_hooks), fusion pairs visited/rewritten, pass time, and whether gradients
equal the run without the pass. Exits with status 1 if they do not.
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
    p.add_argument("--dropout", type=float, default=0.0, help="dropout probability for gpt (default: 0)")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the pass does")
    return p.parse_args(argv)


def measure(args, executor, **options) -> dict:
    import thunder
    import torch

    import thunder_remat
    from thunder_remat.measure import saved_for_backward
    from thunder_remat.models import build_model, example_batch

    model = build_model(args.model, args.size, dropout=args.dropout or None).to(args.device)
    x = example_batch(model).to(args.device)
    jm = thunder.jit(model, executors=[executor], **options)
    start = time.perf_counter()
    torch.manual_seed(0)
    out, saved = saved_for_backward(jm, x)
    out.float().pow(2).mean().backward()
    result = thunder_remat.last_pair_pass(jm)
    return {
        "saved": saved,
        "grads": [p.grad.detach().clone() for p in model.parameters()],
        "first_step_s": time.perf_counter() - start,
        "pairs": result,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    print(f"thunder-remat: {args.model} ({args.size}) with the {args.executor} fusion executor on {args.device}", file=sys.stderr)
    import torch

    import thunder_remat  # noqa: F401  (registers the plugin)

    from thunder_remat.executors import fusion_executor_by_name

    try:
        executor = fusion_executor_by_name(args.executor)
    except RuntimeError as exc:
        raise SystemExit(f"thunder-remat: {exc}") from None
    print("  [1/2] compiling and running without thunder_remat (Thunder's built-in pass) ...", file=sys.stderr)
    before = measure(args, executor)
    print("  [2/2] compiling and running with thunder_remat ...", file=sys.stderr)
    after = measure(args, executor, remat=True)

    same = all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(before["grads"], after["grads"]))
    pairs = after["pairs"]
    rows = [
        ("tensors saved for backward", before["saved"].count, after["saved"].count),
        ("bytes saved for backward", before["saved"].nbytes, after["saved"].nbytes),
        ("fusion pairs visited / rewritten", "-", f"{len(pairs.pairs)} / {sum(p.status == 'rewritten' for p in pairs.pairs)}"),
        ("bytes crossing fusion pairs (before -> after the pass)", "-", f"{pairs.bytes_before} -> {pairs.bytes_after}"),
        ("pair pass time (ms)", "-", f"{pairs.solve_ms:.1f} (+{pairs.reemit_ms:.1f} re-emit)"),
        ("first step incl. compile (s)", f"{before['first_step_s']:.1f}", f"{after['first_step_s']:.1f}"),
        ("gradients equal to the run without the pass", "-", "yes" if same else "NO"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'':{width}}  {'Thunder':>14}  {'thunder_remat':>22}")
    for label, b, a in rows:
        print(f"{label:{width}}  {str(b):>14}  {str(a):>22}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
