"""Measured step peak against warm step time: eager, checkpointing, torch.compile, Thunder, thunder_remat.

For one model, each configuration is built fresh (same seed, same weights), run twice (compile,
warm up), timed over ``--reps`` warm steps (median), then one more step runs with the model's
gradients set to None under ``thunder_remat.inspect.measure.allocator_step_peak``: every
allocation and free on the device, compiled code (Inductor's buffers, Thunder's fusion regions)
included; the peak is the most bytes allocated at once above what was allocated when the step
began (on CPU from the profiler's memory events, on CUDA from ``max_memory_allocated``). A step
is ``loss = out.float().pow(2).mean(); loss.backward()``, the loss computed by the caller outside
the compiled model (``--loss-inside``: the model and its loss compiled as one module, so that
Thunder's trace, and thunder_remat's estimate, see the loss and its backward); its gradients are
compared with eager PyTorch (allclose, ``--atol``/``--rtol``). Configurations:

* ``eager``: plain PyTorch;
* ``checkpoint``: eager with ``torch.utils.checkpoint`` (non-reentrant) around every block (the
  built-in models' ``blocks``, litgpt's ``transformer.h``, transformers' ``layers``/``layer``/``h``/``block``,
  an encoder-decoder's two stacks);
* ``inductor`` / ``aot_eager``: ``torch.compile(backend=...)`` with
  ``torch._functorch.config.activation_memory_budget`` at each ``--budgets`` fraction;
* ``thunder``: ``thunder.jit`` with Thunder's default executors (no fusion on CPU), without and
  with thunder_remat (``remat=True, remat_memory_budget=b``);
* ``thunder-tc``: the same with ``executors=[torch_compile_ex]`` (Thunder's torch.compile
  executor: fusion regions compiled by Inductor);
* ``thunder-attn`` / ``thunder-tc-attn`` (not run unless named): the two above with
  ``thunder_remat.executors.cpu_attention`` first, so attention runs as one op with PyTorch's CPU
  flash kernels and its backward reads the output and log-sum-exp, not the probabilities, as
  eager PyTorch and Thunder's sdpa executor on GPU do (Thunder 0.2.6 decomposes attention on CPU).

Also reported: the activation bytes the forward saves for backward (saved_tensors_hooks, storages
not shared with inputs or parameters), the estimated flops of what the backward recomputes (one
rule for both: ``thunder_remat.cost.op_flops``; torch.compile's recomputed nodes through
``torch_partition.py``, thunder_remat's every copy, ``rewritten_cost``) and, for thunder_remat, its
own step-peak estimate
(``last_save_plan(jm).peak_estimate``; where the plan made none, the walk of its rewritten joint
trace, ``whole_graph.peak.estimate_peak_bytes``, marked ``*``). Both model the backward fusion
regions the executor is expected to form (a region holds what it reads until it returns; none
with the default executors): docs/whole-graph.md, "The step's peak".

Models: the built-in ``mlp``, ``gpt``, ``llama`` (``--size`` preset, ``--layers`` overrides its
depth), any zoo model by name (``tests/model_zoo.py``, e.g. ``"litgpt Llama-3.2-1B"``, shaped by
``--layers --width --tokens --batch``), and ``litgpt-llama`` for the zoo's LLaMA-style litgpt model.

Usage::

    python benchmarks/peak_frontier.py out.md --model gpt --size small
    python benchmarks/peak_frontier.py out.md --model llama --configs inductor,thunder --match-torch
    python benchmarks/peak_frontier.py out.md --model litgpt-llama --layers 8 --width 128 --tokens 128 --batch 4 \\
        --configs eager,thunder-tc --budgets 1,0.5,0.15,0 --plot out.png
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

# the zoo (tests/model_zoo.py) is shared with the tests, not installed with the package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

log = logging.getLogger("peak_frontier")

BUDGETS = (1.0, 0.5, 0.15, 0.05, 0.0)
CONFIGS = ("eager", "checkpoint", "inductor", "aot_eager", "thunder", "thunder-tc")
#: every configuration that runs thunder.jit (with and without thunder_remat); the "-attn" ones run only when named
THUNDER_CONFIGS = ("thunder", "thunder-tc", "thunder-attn", "thunder-tc-attn")
ALL_CONFIGS = tuple(dict.fromkeys(CONFIGS + THUNDER_CONFIGS))
BUILT_IN = ("mlp", "gpt", "llama")
ALIASES = {"litgpt-llama": "litgpt Llama-3.2-1B"}
#: attribute paths where a model keeps its repeated blocks (every match counts: T5 has two stacks)
BLOCK_PATHS = ("blocks", "transformer.h", "model.layers", "layers", "encoder.layer", "transformer.layers", "h",
               "transformer.layer", "encoder.block", "decoder.block", "model.encoder.block", "model.decoder.block")


def parse_args(argv=None):
    import model_zoo as zoo
    from thunder_remat.models import SIZES

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("output", help="path of the markdown table to write")
    p.add_argument("--model", default="gpt",
                   help=f"built-in {list(BUILT_IN)}, a zoo model name, or {list(ALIASES)} (default: gpt)")
    p.add_argument("--size", default="small", choices=list(SIZES), help="built-in models' preset (default: small)")
    p.add_argument("--layers", type=int, help="number of blocks (built-in: overrides the preset; zoo: default 2)")
    p.add_argument("--width", type=int, default=64, help="zoo models' width (default: 64)")
    p.add_argument("--tokens", type=int, default=16, help="zoo models' sequence length (default: 16)")
    p.add_argument("--batch", type=int, default=2, help="zoo models' batch (default: 2)")
    p.add_argument("--budgets", default=",".join(map(str, BUDGETS)),
                   help="comma list of fractions in [0, 1], for torch.compile and thunder_remat alike")
    p.add_argument("--peaks", default="",
                   help="comma list of step-peak budgets for thunder_remat alone, as sizes (e.g. 1.2MB,900kB): "
                        "each runs as remat_memory_budget='peak:<size>'")
    p.add_argument("--auto-peaks", type=int, default=0, metavar="N",
                   help="also run thunder_remat (each Thunder executor) at N step-peak budgets spaced evenly "
                        "between the lowest and highest peak it estimated at --budgets (default: 0)")
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help=f"comma list of {list(CONFIGS)} (default: all) or {list(THUNDER_CONFIGS[2:])}")
    p.add_argument("--match-torch", action="store_true",
                   help="also run thunder_remat (each Thunder executor in --configs) with a peak budget equal to "
                        "each peak torch.compile (inductor) measured: the recompute it needs for the same peak")
    p.add_argument("--loss-inside", action="store_true",
                   help="compile the model and its loss as one module (default: the loss runs outside, in eager)")
    p.add_argument("--reps", type=int, default=3, help="warm steps timed per configuration (default: 3)")
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default: 2)")
    p.add_argument("--plot", help="also draw measured peak against warm step time to this image")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = p.parse_args(argv)

    args.model = ALIASES.get(args.model, args.model)
    if args.model not in BUILT_IN and args.model not in zoo.zoo_names(outside=True):
        p.error(f"unknown --model {args.model!r}; choose from {list(BUILT_IN)}, {list(ALIASES)} "
                f"or the zoo: {zoo.zoo_names(outside=True)}")
    if args.model not in BUILT_IN and not zoo.available(zoo.zoo_model(args.model)):
        p.error(f"--model {args.model!r} needs {zoo.zoo_model(args.model).requires}, which is not installed")
    if args.auto_peaks < 0:
        p.error(f"--auto-peaks must be 0 or a positive integer, got {args.auto_peaks}")
    for name in ("layers", "width", "tokens", "batch", "reps", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name} must be a positive integer, got {value}")
    try:
        args.budgets = [float(b) for b in args.budgets.split(",") if b.strip()]
    except ValueError:
        p.error(f"--budgets must be a comma list of numbers in [0, 1], got {args.budgets!r}")
    if not args.budgets or any(not 0.0 <= b <= 1.0 for b in args.budgets):
        p.error(f"--budgets must be a non-empty comma list of fractions in [0, 1], got {args.budgets}")
    from thunder_remat.budget import parse_budget

    args.peaks = [f"peak:{size.strip()}" for size in args.peaks.split(",") if size.strip()]
    for peak in args.peaks:
        try:
            parse_budget(peak)
        except ValueError as exc:
            p.error(f"--peaks: {exc}")
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in args.configs if c not in ALL_CONFIGS]
    if bad or not args.configs:
        p.error(f"unknown --configs {bad}; choose from {list(ALL_CONFIGS)}")
    return args


@dataclass
class Workload:
    """How to build a fresh copy of the model, its inputs, and the loss of its output."""

    label: str
    build: object  # () -> (model, args tuple, kwargs dict)
    loss: object  # output -> scalar tensor


def workload(args) -> Workload:
    """The model of ``--model`` shaped by the arguments, its loss outside or (``--loss-inside``) inside."""
    work = _model_workload(args)
    return with_loss_inside(work) if args.loss_inside else work


def _model_workload(args) -> Workload:
    import torch

    if args.model in BUILT_IN:
        from thunder_remat.models import BUILDERS, SIZES, ModelSpec, example_batch

        spec = SIZES[args.size]
        if args.layers is not None:
            spec = ModelSpec(**{**spec.__dict__, "n_layer": args.layers})

        def build():
            torch.manual_seed(0)
            model = BUILDERS[args.model](spec)
            model.spec = spec
            return model, (example_batch(model),), {}

        label = (f"built-in {args.model} ({spec.n_layer} layers, width {spec.n_embd}, seq {spec.seq_len}, "
                 f"batch {spec.batch})")
        return Workload(label, build, lambda out: out.float().pow(2).mean())

    import model_zoo as zoo

    entry = zoo.zoo_model(args.model)
    shape = zoo.ZooShape(batch=args.batch, tokens=args.tokens, width=args.width, layers=args.layers or 2)

    def build():
        torch.manual_seed(0)
        model = entry.build(shape)
        return model, (), entry.inputs(shape, torch.Generator().manual_seed(1))

    label = f"{args.model} ({shape.layers} layers, width {shape.width}, seq {shape.tokens}, batch {shape.batch})"
    return Workload(label, build, lambda out: entry.output(out).float().pow(2).mean())


def with_loss_inside(work: Workload) -> Workload:
    """``work`` with its loss computed inside the module that configurations compile."""
    from model_zoo import WithLoss

    def build():
        model, inputs, kwargs = work.build()
        return WithLoss(model, work.loss), inputs, kwargs

    return Workload(work.label + ", loss inside the compiled module", build, lambda out: out)


def find_blocks(model):
    """The model's repeated blocks (of every ``BLOCK_PATHS`` list it has), or None."""
    from torch import nn

    model = getattr(model, "inner", model)  # --loss-inside: model_zoo.WithLoss
    blocks = {}
    for path in BLOCK_PATHS:
        node = model
        for part in path.split("."):
            node = getattr(node, part, None)
            if node is None:
                break
        if isinstance(node, nn.ModuleList):
            blocks.update((id(block), block) for block in node)
    return list(blocks.values()) or None


def checkpoint_blocks(model) -> int:
    """Wrap every block's forward in non-reentrant ``torch.utils.checkpoint``; returns how many."""
    import torch.utils.checkpoint as cp

    blocks = find_blocks(model)
    if blocks is None:
        return 0
    for block in blocks:
        forward = block.forward

        def checkpointed(*a, _forward=forward, **k):
            return cp.checkpoint(_forward, *a, use_reentrant=False, **k)

        block.forward = checkpointed
    return len(blocks)


@dataclass
class Row:
    system: str
    executor: str
    budget: str
    peak: int | None = None
    estimate: str = "-"
    #: ``estimate`` in bytes (the plan's, or the ``*`` walk): what ``--auto-peaks`` spaces budgets by
    estimate_bytes: int | None = None
    saved: int | None = None
    step_ms: float | None = None
    first_ms: float | None = None
    grads: str = "-"
    note: str = ""
    #: estimated flops of the forward ops run again in the backward, one rule for both
    #: (thunder_remat.cost.op_flops; torch.compile: benchmarks/torch_partition.py)
    recompute: float | None = None


def compile_config(config: str, budget: float | None):
    """(system, executor, budget label, model -> callable) of one configuration."""
    import torch

    if config == "eager":
        return "eager", "-", "-", lambda m: m
    if config == "checkpoint":
        def wrap(m):
            if not checkpoint_blocks(m):
                raise ValueError(f"found no blocks to checkpoint (looked at {BLOCK_PATHS})")
            return m
        return "eager + checkpoint per block", "-", "-", wrap
    if config in ("inductor", "aot_eager"):
        def wrap(m, backend=config):
            torch._dynamo.reset()
            return torch.compile(m, backend=backend)
        return "torch.compile", config, f"{budget:g}", wrap
    import thunder

    executors = thunder_executors(config)
    name = executor_label(config)
    options = {} if budget is None else {"remat": True, "remat_memory_budget": budget}
    system = "Thunder" if budget is None else "thunder_remat"

    def wrap(m):
        return thunder.jit(m, executors=executors, **options) if executors else thunder.jit(m, **options)

    return system, name, _label(budget), wrap


def _compiles_regions(config: str) -> bool:
    """A Thunder configuration with Thunder's torch.compile executor."""
    return "tc" in config.split("-")


def executor_label(config: str) -> str:
    """How the table names a Thunder configuration's executors."""
    fusion = "torch.compile ex" if _compiles_regions(config) else "default"
    return fusion + (" + attn" if config.endswith("-attn") else "")


def thunder_executors(config: str):
    """The executors a Thunder configuration passes to ``thunder.jit`` (``None``: Thunder's defaults)."""
    import thunder

    executors = None
    if _compiles_regions(config):
        from thunder.executors.torch_compile import torch_compile_ex

        executors = [torch_compile_ex]
    if config.endswith("-attn"):
        from thunder_remat.executors.cpu_attention import cpu_attention_ex

        executors = [cpu_attention_ex, *(executors or thunder.get_default_executors())]
    return executors


def _label(budget) -> str:
    """A budget as the table shows it: a fraction, or a peak budget's string."""
    if budget is None:
        return "-"
    return budget if isinstance(budget, str) else f"{budget:g}"


@dataclass
class PreparedStep:
    """One configuration, built and wrapped, not yet run: ``step()`` runs a training step;
    torch.compile's partitioner reads its budget from ``partitioner_settings`` while it compiles."""
    work: Workload
    system: str
    executor: str
    label: str
    model: object
    inputs: tuple
    kwargs: dict
    run: object
    partitioner_settings: dict

    def step(self) -> None:
        self.work.loss(self.run(*self.inputs, **self.kwargs)).backward()


def prepare_step(work: Workload, config: str, budget: float | None) -> PreparedStep:
    """Build ``work``'s model and wrap it as ``config`` runs it at ``budget`` (shared with
    live_at_peak.py, so both measure the same step)."""
    system, executor, label, wrap = compile_config(config, budget)
    model, inputs, kwargs = work.build()
    settings = {"activation_memory_budget": budget} if config in ("inductor", "aot_eager") else {}
    return PreparedStep(work, system, executor, label, model, inputs, kwargs, wrap(model), settings)


def run_config(work: Workload, config: str, budget: float | None, reference, args, device) -> Row:
    import torch

    import thunder_remat
    from thunder_remat.inspect.measure import allocator_step_peak, saved_for_backward

    prepared = prepare_step(work, config, budget)
    system, model, inputs, kwargs, run, step = (prepared.system, prepared.model, prepared.inputs, prepared.kwargs,
                                                prepared.run, prepared.step)
    row = Row(system, prepared.executor, prepared.label)
    with torch._functorch.config.patch(**prepared.partitioner_settings):
        start = time.perf_counter()
        if config in ("inductor", "aot_eager"):
            from torch_partition import capture_partitions

            with capture_partitions() as partitions:
                step()  # compiles
            row.recompute = sum(p.recompute_flops() for p in partitions)
        else:
            step()  # compiles
        row.first_ms = 1e3 * (time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
        step()
        grads = [p.grad for p in model.parameters()]
        from model_zoo import same_gradients

        ok = same_gradients(grads, reference, atol=args.atol, rtol=args.rtol)
        worst = max((float((g - r).abs().max()) for g, r in zip(grads, reference) if g is not None and r is not None),
                    default=0.0)
        row.grads = f"{'yes' if ok else 'NO'} ({worst:.1e})"
        times = []
        for _ in range(args.reps):
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        row.step_ms = 1e3 * statistics.median(times)
        model.zero_grad(set_to_none=True)
        out, saved = saved_for_backward(run, *inputs, held=list(model.parameters()) + list(model.buffers()), **kwargs)
        row.saved = saved.activation_bytes
        del out
        # two measured steps, the larger kept: on CPU a step now and then comes out lower than the
        # same step measured again (allocations the profiler did not record; seen on HF Falcon,
        # 346 kB against 476 kB, not explained), never higher
        peaks = []
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            peaks.append(allocator_step_peak(step, device).peak_bytes)
        if max(peaks) - min(peaks) > 1024:
            log.warning("%s %s %s: two measured steps disagree (%s B); the larger is kept", system,
                        prepared.executor, prepared.label, " / ".join(f"{p:,}" for p in peaks))
        row.peak = max(peaks)
    if system == "thunder_remat":
        plan = thunder_remat.last_save_plan(run)
        if plan is not None and plan.peak_estimate is not None:
            row.estimate = _mb(plan.peak_estimate)
            row.estimate_bytes = plan.peak_estimate
        elif plan is not None and plan.trace is not None:
            from thunder_remat.plugin import expected_regions
            from thunder_remat.whole_graph.peak import estimate_peak_bytes

            executors = thunder_executors(config)
            regions = expected_regions(plan.trace, executors, plan=plan) if _compiles_regions(config) else None
            row.estimate_bytes = estimate_peak_bytes(plan.trace, regions, plan.prologue)
            row.estimate = _mb(row.estimate_bytes) + "*"
        if isinstance(budget, str) and row.peak is not None and row.estimate_bytes is not None:
            from thunder_remat.budget import parse_budget

            limit = parse_budget(budget).amount
            fits = "fits" if row.estimate_bytes <= limit else "fits no plan"
            row.note = f"estimate {fits}; measured {100 * (row.peak / limit - 1):+.1f}% of the budget"
        if plan is not None and plan.failure:
            row.note = f"plan failed: {plan.failure}"
        if plan is not None and plan.choice is not None:
            row.recompute = plan.rewritten_cost  # every copy the rewrite made
    return row


AUTO_PEAKS = object()  # a place in the plan for --auto-peaks


def auto_peaks(rows, config: str, n: int) -> list[str]:
    """``n`` peak budgets spaced evenly strictly between the lowest and highest estimate that
    thunder_remat made at the fractions with ``config``'s executor: each lies where some plan
    fits by the estimate, so the measured peak can be held to it."""
    executor = executor_label(config)
    estimates = [r.estimate_bytes for r in rows
                 if r.system == "thunder_remat" and r.executor == executor and r.estimate_bytes is not None
                 and not r.budget.startswith("peak:")]
    if len(set(estimates)) < 2:
        return []
    low, high = min(estimates), max(estimates)
    return [f"peak:{low + (high - low) * k // (n + 1)}B" for k in range(1, n + 1)]


def _mb(n) -> str:
    return "-" if n is None else f"{n / 1e6:.3f}"


def table(rows, work, device) -> str:
    lines = [f"Model: {work.label}, fp32, {device}. Peak: allocator bytes above the step's start "
             "(gradients set to None before the step; the larger of two measured steps). Estimate: thunder_remat's own, with the fusion regions "
             "the executor is expected to form (* = walk of the rewritten joint trace).", "",
             "| system | executor | budget | measured peak MB | thunder_remat estimate MB | saved activations MB "
             "| est. recompute flops | warm step ms | first call s | grads = eager (max abs diff) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        step = "-" if r.step_ms is None else f"{r.step_ms:.1f}"
        first = "-" if r.first_ms is None else f"{r.first_ms / 1e3:.1f}"
        grads = r.grads + (f"; {r.note}" if r.note else "")
        recompute = "-" if r.recompute is None else f"{r.recompute:.3g}"
        lines.append(f"| {r.system} | {r.executor} | {r.budget} | {_mb(r.peak)} | {r.estimate} | {_mb(r.saved)} "
                     f"| {recompute} | {step} | {first} | {grads} |")
    return "\n".join(lines) + "\n"


def plot(rows, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    groups = {}
    for r in rows:
        if r.peak is not None and r.step_ms is not None:
            groups.setdefault(f"{r.system} ({r.executor})" if r.executor != "-" else r.system, []).append(r)
    for name, rs in groups.items():
        ax.plot([r.step_ms for r in rs], [r.peak / 1e6 for r in rs], "o-" if len(rs) > 1 else "o", label=name)
        for r in rs:
            if r.budget != "-":
                ax.annotate(r.budget, (r.step_ms, r.peak / 1e6), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("warm step time (ms)")
    ax.set_ylabel("measured step peak (MB)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(args.threads)
    device = "cpu"
    work = workload(args)
    log.info("model: %s", work.label)
    model, inputs, kwargs = work.build()
    work.loss(model(*inputs, **kwargs)).backward()
    reference = [p.grad for p in model.parameters()]
    del model

    plan = []
    for config in args.configs:
        if config in ("eager", "checkpoint"):
            plan.append((config, None))
        elif config in ("inductor", "aot_eager"):
            plan.extend((config, b) for b in args.budgets)
        else:
            plan.extend([(config, None)] + [(config, b) for b in (*args.budgets, *args.peaks)])
            if args.auto_peaks:
                plan.append((config, AUTO_PEAKS))  # replaced by the peaks once the fractions have run
    rows = []
    thunders = [c for c in args.configs if c in THUNDER_CONFIGS]
    i = 0
    while i < len(plan):
        config, budget = plan[i]
        i += 1
        if budget is AUTO_PEAKS:
            peaks = auto_peaks(rows, config, args.auto_peaks)
            log.info("%s: peak budgets between its estimates: %s", config, peaks or "none (one estimate)")
            plan[i:i] = [(config, peak) for peak in peaks]
            continue
        log.info("[%d/%d] %s%s", i, len(plan), config, "" if budget is None else f" at budget {_label(budget)}")
        try:
            row = run_config(work, config, budget, reference, args, device)
        except Exception as exc:  # one configuration failing must not lose the others
            log.exception("%s at %s failed", config, budget)
            system, executor, label, _ = compile_config(config, budget)
            row = Row(system, executor, label, note=f"failed: {type(exc).__name__}: {str(exc)[:120]}")
        log.info("  peak %s MB, estimate %s, step %s ms, grads %s", _mb(row.peak), row.estimate,
                 "-" if row.step_ms is None else f"{row.step_ms:.1f}", row.grads)
        rows.append(row)
        if args.match_torch and config == "inductor" and row.peak is not None:
            plan.extend((c, f"peak:{row.peak}B") for c in thunders)  # run after the planned rows
        with open(args.output, "w") as f:  # written after every row: a long run can be read as it goes
            f.write(table(rows, work, device))
    if args.plot:
        plot(rows, args.plot, work.label)
        log.info("plot: %s", args.plot)
    print(table(rows, work, device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
