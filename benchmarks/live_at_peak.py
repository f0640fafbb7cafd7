"""What makes a step's measured peak: the blocks alive at it, with the ops that allocated them.

One configuration of ``peak_frontier.py`` (same models, shapes, loss and configurations), one
warm step measured with ``thunder_remat.inspect.measure.allocations_live_at_peak`` (CPU). Prints
the peak, how much of it is parameter gradients (told apart by their storages), and every other
block alive at the peak with the profiler ranges around its allocation (a Thunder backward, a
torch.compile region's call, the aten op). Match the blocks to the trace
(``thunder.last_backward_traces``) or to Inductor's generated code (``TORCH_LOGS=output_code``).

    python benchmarks/live_at_peak.py --model "transformers BERT" --config thunder-tc --budget 1 [--tokens 64]
"""

from __future__ import annotations

import argparse
import sys

import peak_frontier


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt", help="as peak_frontier.py's --model")
    p.add_argument("--config", default="thunder-tc", choices=list(peak_frontier.ALL_CONFIGS))
    p.add_argument("--budget", type=float, default=None,
                   help="fraction for torch.compile and thunder_remat (none: Thunder alone, or 1.0 for torch.compile)")
    p.add_argument("--min-bytes", type=int, default=1024, help="blocks smaller than this are summed, not listed")
    args, shape = p.parse_known_args(argv)  # the rest (--size, --layers, --width, --tokens, --batch) as peak_frontier.py
    if args.budget is not None and not 0.0 <= args.budget <= 1.0:
        p.error(f"--budget must be a fraction in [0, 1], got {args.budget}")

    import torch

    from thunder_remat.inspect.measure import allocations_live_at_peak

    torch.set_num_threads(2)
    work = peak_frontier.workload(peak_frontier.parse_args(["-", "--model", args.model, *shape]))
    budget = args.budget
    if budget is None and args.config in ("inductor", "aot_eager"):
        budget = 1.0
    prepared = peak_frontier.prepare_step(work, args.config, budget)
    model = prepared.model
    with torch._functorch.config.patch(**prepared.partitioner_settings):
        model.zero_grad(set_to_none=True)
        prepared.step()  # compiles
        model.zero_grad(set_to_none=True)
        peak, live = allocations_live_at_peak(prepared.step)
    gradients = {q.grad.untyped_storage().data_ptr() for q in model.parameters() if q.grad is not None}
    grad_bytes = sum(q.grad.untyped_storage().nbytes() for q in model.parameters() if q.grad is not None)
    is_grad = [block for block in live if block.address in gradients]
    others = [block for block in live if block.address not in gradients]
    print(f"{work.label}: {prepared.system}, {prepared.executor}, budget {prepared.label}")
    print(f"peak {peak.peak_bytes} B; alive there: {sum(b.nbytes for b in live)} B in {len(live)} blocks, "
          f"{sum(b.nbytes for b in is_grad)} B of them parameter gradients (all gradients: {grad_bytes} B)")
    small = [b for b in others if b.nbytes < args.min_bytes]
    for block in others:
        if block.nbytes >= args.min_bytes:
            print(f"  {block.nbytes:>9} B  #{block.order:<5} {' > '.join(block.ranges[-3:])}")
    print(f"  {sum(b.nbytes for b in small):>9} B  in {len(small)} blocks under {args.min_bytes} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
