"""Time Thunder 0.2.6's built-in fusion-pair rematerialization against thunder_remat's, on the same traces.

For each model:

1. ``thunder.jit(model, executors=[ex])`` (without ``remat=True``) runs one forward under
   ``thunder_remat.inspect.measure.saved_for_backward``. While it compiles, a temporary spy installed as
   ``thunder.executors.torch_compile.rematerialize`` (the name the torch.compile fusion pass calls
   at its end, which the eager executor inherits) records the fused joint forward+backward trace
   handed to it and delegates to the function it replaced, so Thunder's own pass still runs.
2. On that captured trace, both passes are timed ``--repeat`` times (median):
   Thunder's ``thunder.core.rematerialization.rematerialize`` and thunder_remat's
   ``rematerialize_fusion_pairs`` (whole call, plus its ``solve_ms``: analysis, min cuts and
   rewrites, without re-emitting regions). Thunder's pass does not re-emit regions (its caller does
   that afterwards for every region), so the ratio is given against both our solve time and our
   total.
3. ``thunder.jit(model, executors=[ex], remat=True, remat_whole_graph=False)`` (the fusion-pair
   pass alone, to compare like with like) runs one forward under the same measure; the
   saved-for-backward bytes of both builds are reported, and the gradients of both builds are
   compared with eager PyTorch (``torch.allclose``, atol 1e-5, rtol 1e-4) for
   ``loss = out.float().pow(2).mean()``.

Usage::

    python benchmarks/pair_pass_time.py --models gpt,llama,mlp --size bench --repeat 5 --executor eager

Progress goes to stderr; the markdown table goes to stdout (and to ``--output`` if given).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import time
import warnings
from dataclasses import dataclass

log = logging.getLogger("pair_pass_time")

EXECUTORS = ("eager", "torchcompile")
ATOL, RTOL = 1e-5, 1e-4


@dataclass
class Row:
    model: str
    size: str
    executor: str
    pairs_thunder: int
    pairs_ours: int
    rewritten: int
    failed: int
    thunder_ms: float
    stage_thunder_ms: float
    stage_ours_ms: float
    solve_ms: float
    total_ms: float
    saved_thunder: int
    saved_ours: int
    grads_thunder: bool
    grads_ours: bool
    abandoned: str | None = None

    @property
    def ratio_solve(self) -> float:
        return self.thunder_ms / self.solve_ms if self.solve_ms > 0 else float("inf")

    @property
    def ratio_total(self) -> float:
        return self.thunder_ms / self.total_ms if self.total_ms > 0 else float("inf")

    @property
    def ratio_stage(self) -> float:
        return self.stage_thunder_ms / self.stage_ours_ms if self.stage_ours_ms > 0 else float("inf")


def _parse_list(text: str, allowed, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"{what}: give at least one of {', '.join(allowed)}")
    bad = [t for t in items if t not in allowed]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(map(repr, bad))}; choose from {', '.join(allowed)}")
    return items


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    from thunder_remat.models import MODEL_NAMES, SIZES

    p = argparse.ArgumentParser(
        description="Time Thunder's built-in fusion-pair rematerialization against thunder_remat's "
        "on the same fused joint forward+backward traces, and compare saved-for-backward bytes.",
    )
    p.add_argument(
        "--models",
        default="gpt",
        type=lambda s: _parse_list(s, MODEL_NAMES, "model"),
        help=f"comma-separated models from {', '.join(MODEL_NAMES)} (default: gpt)",
    )
    p.add_argument(
        "--size", default="bench", choices=list(SIZES), help="model size (default: bench)"
    )
    p.add_argument("--repeat", type=_positive_int, default=5, help="timed repetitions per pass, median reported (default: 5)")
    p.add_argument(
        "--executor",
        default="eager",
        choices=EXECUTORS,
        help="fusion executor: eager (thunder_remat's light executor, fast) or torchcompile (Inductor)",
    )
    p.add_argument("--output", help="also write the markdown table to this file")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p.parse_args(argv)


def fusion_executor(name: str):
    """Imported lazily so ``--help`` does not load Thunder."""
    from thunder_remat.executors import fusion_executor_by_name

    return fusion_executor_by_name(name)


@contextlib.contextmanager
def capture_fused_traces(sink: list, executor, unfused_sink: list):
    """Record every trace handed to ``thunder.executors.torch_compile.rematerialize`` while active,
    and every trace handed to ``executor.fusion_pass`` (the joint trace before fusion)."""
    import thunder.executors.torch_compile as tc

    previous = tc.rematerialize

    def spy(trace):
        sink.append(trace)
        return previous(trace)

    def fusion_spy(trace):
        unfused_sink.append(trace)
        return type(executor).fusion_pass(executor, trace)

    tc.rematerialize = spy
    executor.fusion_pass = fusion_spy
    try:
        yield
    finally:
        tc.rematerialize = previous
        del executor.fusion_pass


def _grads_match_eager(model, jitted_out, eager_grads) -> bool:
    import torch

    loss = jitted_out.float().pow(2).mean()
    model.zero_grad(set_to_none=True)
    loss.backward()
    ok = True
    for name, p in model.named_parameters():
        ref = eager_grads[name]
        if p.grad is None or not torch.allclose(p.grad, ref, atol=ATOL, rtol=RTOL):
            diff = float("nan") if p.grad is None else (p.grad - ref).abs().max().item()
            log.warning("gradient of %s differs from eager (max abs diff %s)", name, diff)
            ok = False
    model.zero_grad(set_to_none=True)
    return ok


def _median_ms(fn, repeat: int) -> tuple[float, object]:
    times, last = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        last = fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), last


def _build_all_regions(trace) -> None:
    """Build every region's callable once, as the first call would (no-op for built ones)."""
    for bsym in trace.bound_symbols:
        if bsym.sym.is_fusion:
            for fn in bsym._call_ctx.values():
                build = getattr(fn, "build", None)
                if build is not None:
                    build()


def _fusion_stage(ex, unfused_trace, *, ours: bool):
    """Thunder's fusion stage on the joint trace, region callables built once at the end.

    Without thunder_remat: the executor's fusion pass (fuse every region, Thunder's pair pass,
    ``update_fusion_call_ctx``). With it: the same fusion pass while thunder_remat is active (its
    pair pass gated off, region builds deferred), then our pair pass, then one build per region.
    """
    import thunder_remat.executors
    import thunder_remat.plugin
    from thunder_remat import RematConfig
    from thunder_remat.executors.hooks.builtin_pass import activated
    from thunder_remat.pairs.run import rematerialize_fusion_pairs

    if not ours:
        fused = ex.fusion_pass(unfused_trace)
    else:
        with activated():
            fused = ex.fusion_pass(unfused_trace)
            fused = rematerialize_fusion_pairs(
                fused,
                RematConfig(),
                adapter_for=thunder_remat.executors.adapter_for,
                finalize=thunder_remat.plugin._finalize,
            ).trace
    _build_all_regions(fused)
    return fused


def bench_model(name: str, size: str, executor: str, repeat: int) -> Row:
    import thunder
    from thunder.core.rematerialization import find_fusion_producer_consumer_pairs
    from thunder.core.rematerialization import rematerialize as thunder_rematerialize

    import thunder_remat.executors
    import thunder_remat.plugin
    from thunder_remat import RematConfig
    from thunder_remat.executors.hooks.builtin_pass import activated
    from thunder_remat.pairs.run import rematerialize_fusion_pairs
    from thunder_remat.inspect.measure import saved_for_backward
    from thunder_remat.models import build_model, example_batch

    ex = fusion_executor(executor)
    model = build_model(name, size)
    x = example_batch(model)

    out = model(x)
    out.float().pow(2).mean().backward()
    eager_grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    log.info("%s/%s/%s: jit without remat (Thunder's pass), capturing the fused joint trace", name, size, executor)
    captured: list = []
    start = time.perf_counter()
    unfused: list = []
    with capture_fused_traces(captured, ex, unfused):
        jitted = thunder.jit(model, executors=[ex])
        out_thunder, saved_thunder = saved_for_backward(jitted, x)
    log.info("  compiled and ran in %.1f s; %d trace(s) captured", time.perf_counter() - start, len(captured))
    if not captured:
        raise RuntimeError(
            f"no fused trace reached thunder.executors.torch_compile.rematerialize for {name}/{size}/{executor}"
        )
    if len(captured) > 1:
        log.info("  using the largest of %d captured traces", len(captured))
    trace = max(captured, key=lambda t: len(t.bound_symbols))
    unfused_trace = max(unfused, key=lambda t: len(t.bound_symbols))
    grads_thunder = _grads_match_eager(model, out_thunder, eager_grads)
    del jitted, out_thunder

    pairs_thunder = len(find_fusion_producer_consumer_pairs(trace))
    log.info("  timing Thunder's rematerialize x%d (%d pairs)", repeat, pairs_thunder)
    thunder_ms, thunder_out = _median_ms(lambda: thunder_rematerialize(trace), repeat)

    log.info("  timing thunder_remat's rematerialize_fusion_pairs x%d", repeat)
    config = RematConfig()
    results = []

    def ours():
        # As in the pipeline: thunder_remat active, so torch.compile region builds are deferred.
        with activated():
            r = _ours_once()
        results.append(r)
        return r

    def _ours_once():
        return rematerialize_fusion_pairs(
            trace,
            config,
            adapter_for=thunder_remat.executors.adapter_for,
            finalize=thunder_remat.plugin._finalize,
        )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        total_ms, result = _median_ms(ours, repeat)
    for w in {str(w.message) for w in caught}:
        log.warning("  pair pass warned: %s", w)
    solve_ms = statistics.median(r.timings.analysis_ms + r.timings.solve_ms + r.timings.rewrite_ms for r in results)

    log.info("  timing the whole fusion stage with region builds, Thunder's and ours, x%d", repeat)
    stage_thunder_ms, _ = _median_ms(lambda: _fusion_stage(ex, unfused_trace, ours=False), repeat)
    stage_ours_ms, _ = _median_ms(lambda: _fusion_stage(ex, unfused_trace, ours=True), repeat)
    log.info(
        "  Thunder %.1f ms, ours solve %.1f ms / total %.1f ms (re-emit %.1f ms); crossing bytes %d -> %d",
        thunder_ms, solve_ms, total_ms, statistics.median(r.timings.reemit_ms for r in results),
        result.bytes_before, result.bytes_after,
    )

    log.info("%s/%s/%s: jit with remat=True, remat_whole_graph=False (thunder_remat's pair pass)", name, size, executor)
    start = time.perf_counter()
    jitted = thunder.jit(model, executors=[ex], remat=True, remat_whole_graph=False)
    out_ours, saved_ours = saved_for_backward(jitted, x)
    log.info("  compiled and ran in %.1f s", time.perf_counter() - start)
    grads_ours = _grads_match_eager(model, out_ours, eager_grads)
    log.info(
        "  saved for backward: Thunder %d tensors / %d B, ours %d tensors / %d B",
        saved_thunder.count, saved_thunder.nbytes, saved_ours.count, saved_ours.nbytes,
    )
    return Row(
        model=name,
        size=size,
        executor=executor,
        pairs_thunder=pairs_thunder,
        pairs_ours=len(result.pairs),
        rewritten=sum(p.status.value == "rewritten" for p in result.pairs),
        failed=sum(p.status.value == "failed" for p in result.pairs),
        thunder_ms=thunder_ms,
        stage_thunder_ms=stage_thunder_ms,
        stage_ours_ms=stage_ours_ms,
        solve_ms=solve_ms,
        total_ms=total_ms,
        saved_thunder=saved_thunder.nbytes,
        saved_ours=saved_ours.nbytes,
        grads_thunder=grads_thunder,
        grads_ours=grads_ours,
        abandoned=result.failure,
    )


def markdown_table(rows: list[Row], repeat: int) -> str:
    header = (
        "| model | size | executor | #pairs (Thunder / ours, rewritten) | Thunder pass ms | ours solve ms "
        "| ours total ms | ratio Thunder/ours (solve / total) | saved bytes Thunder | saved bytes ours "
        "| grads equal eager (Thunder / ours) | fusion stage with builds ms (Thunder / ours) "
        "| ratio fusion stage Thunder/ours |"
    )
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    yn = {True: "yes", False: "NO"}
    for r in rows:
        pairs = f"{r.pairs_thunder} / {r.pairs_ours}, {r.rewritten}"
        if r.failed:
            pairs += f" ({r.failed} failed)"
        if r.abandoned:
            pairs += " (abandoned)"
        lines.append(
            f"| {r.model} | {r.size} | {r.executor} | {pairs} | {r.thunder_ms:.1f} | {r.solve_ms:.1f} "
            f"| {r.total_ms:.1f} | {r.ratio_solve:.1f}x / {r.ratio_total:.1f}x | {r.saved_thunder:,} "
            f"| {r.saved_ours:,} | {yn[r.grads_thunder]} / {yn[r.grads_ours]} | {r.stage_thunder_ms:.1f} / {r.stage_ours_ms:.1f} "
            f"| {r.ratio_stage:.1f}x |"
        )
    lines.append("")
    lines.append(
        f"Times are medians of {repeat} runs on the same captured trace. The fusion stage is the "
        "fusion executor's whole fusion pass on the joint trace plus our pair pass when on, with every "
        "region's callable built once (Inductor itself compiles later, on the first call, in both)."
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    warnings.filterwarnings("ignore", message="transformer_engine module not found")
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    if not args.verbose:
        logging.getLogger("thunder_remat").setLevel(logging.WARNING)

    import thunder
    import torch

    import thunder_remat

    log.info(
        "python %s, torch %s, lightning-thunder %s, thunder_remat %s",
        sys.version.split()[0], torch.__version__, getattr(thunder, "__version__", "?"), thunder_remat.__version__,
    )
    try:
        fusion_executor(args.executor)
    except (ImportError, RuntimeError) as exc:
        log.error("executor %s is not usable: %s", args.executor, exc)
        return 2

    rows = []
    for name in args.models:
        rows.append(bench_model(name, args.size, args.executor, args.repeat))
    table = markdown_table(rows, args.repeat)
    print(table)
    if args.output:
        with open(args.output, "w") as f:
            f.write(table + "\n")
        log.info("table written to %s", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
