"""nvFuser regions at trace level on a CPU machine: thunder_remat's nvFuser adapter on Thunder 0.2.6.

Runs only with ``REMAT_NVFUSER_TRACES=1`` in an environment with an nvFuser wheel (``.venv-nvfuser``:
Python 3.12, torch 2.10, nvfuser-cu128-torch210; ``.ci/run`` builds it and runs this file there).
Without the variable the module is skipped; with it, it fails instead of skipping when Thunder finds
no nvFuser, so that CI cannot pass without running it.

Thunder 0.2.6 looks for nvFuser only when ``torch.cuda.is_available()``: at ``import thunder`` (which
then imports ``nvfuserex_impl``) and again while it makes traces and FusionDefinitions. So that answer
is True for the length of Thunder's import (tests/conftest.py imports this module first, for that)
and of each compilation; nothing else about CUDA is faked. Models and inputs are fake CUDA tensors
(``FakeTensorMode``: shapes and dtypes, no memory); traces come from ``get_computation_and_inputs``,
which compiles without calling the computation; each region's FusionDefinition is built for
contiguous inputs of its traced shapes. No region is executed: there is no GPU.
"""

import contextlib
import importlib
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ENABLED = os.environ.get("REMAT_NVFUSER_TRACES") == "1"


@contextlib.contextmanager
def cuda_reported_available():
    """``torch.cuda.is_available()`` answers True inside (Thunder's nvFuser lookups ask it)."""
    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: True
    try:
        yield
    finally:
        torch.cuda.is_available = real


if not ENABLED:
    pytest.skip("nvFuser trace tests run with REMAT_NVFUSER_TRACES=1 in the nvFuser environment (see .ci/run)",
                allow_module_level=True)
if "thunder" not in sys.modules:
    with cuda_reported_available():
        import thunder  # noqa: F401  (finds nvFuser and imports its executor)

import thunder  # noqa: E402
from thunder.core.prims import OpTags  # noqa: E402
from thunder.core.proxies import TensorProxy  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import thunder_remat  # noqa: E402
from helpers import bytes_crossing, fusion_regions  # noqa: E402
from thunder_remat.executors import adapter_for  # noqa: E402
from thunder_remat.executors.nvfuser import IMPL_MODULE, NvFuserAdapter, nvfuser_available, nvfuser_module  # noqa: E402
from thunder_remat.models import build_model, example_batch  # noqa: E402
from model_zoo import available, zoo_model  # noqa: E402

pytestmark = pytest.mark.jit

NVFUSER_EX = thunder.get_executor("nvfuser")
if NVFUSER_EX is None:
    raise RuntimeError("REMAT_NVFUSER_TRACES=1 but Thunder found no nvFuser executor: install an nvFuser wheel "
                       "for this torch (see .ci/run) and keep tests/conftest.py importing this module first")

MODELS = ("gpt", "llama", "mlp")
GOLDEN = Path(__file__).parent / "golden"
#: the compilations compared: thunder_remat's pair pass alone, Thunder's own pass, thunder_remat's defaults
VARIANTS = {
    # the pair pass alone: no whole-graph plan, backward regions not cut (the defaults cut them)
    "ours": {"remat": True, "remat_whole_graph": False, "remat_split_regions": False},
    "thunder": {},
    "defaults": {"remat": True},
    # the defaults with backward regions left whole: what the two passes hand over before the cuts
    "uncut": {"remat": True, "remat_split_regions": False},
}


#: zoo models (tests/model_zoo.py, real model code) tested too; skipped (which fails .ci/run) where
#: litgpt or transformers is not installed
ZOO_MODELS = ("litgpt pythia-14m", "transformers BERT")


def fake_cuda_model(name: str, dropout: float | None = None):
    """The tiny built-in or zoo model ``name`` and the keyword arguments of one call, as fake CUDA
    tensors (real CPU tensors give only their shapes and dtypes)."""
    mode = FakeTensorMode()
    if name in MODELS:
        with mode, torch.device("cuda"):
            model = build_model(name, "tiny", dropout=dropout)
        inputs = {"x" if name == "mlp" else "idx": example_batch(model)}
    else:
        entry = zoo_model(name)
        if not available(entry):
            pytest.skip(f"{name} needs {entry.requires}, not installed here")
        with mode, torch.device("cuda"):
            model, _ = entry.make("tiny")
        _, inputs = entry.make("tiny")
    with mode:
        fake = {k: torch.zeros(v.shape, dtype=v.dtype, device="cuda") if isinstance(v, torch.Tensor) else v
                for k, v in inputs.items()}
    return model, fake


@dataclass
class Build:
    jitted: object
    forward: object
    backward: object
    #: the fused joint trace handed to thunder_remat's pair pass (None when it did not run)
    pair_input: object
    #: the traces Thunder's own pair pass (``thunder.core.rematerialization.rematerialize``) read
    thunder_pass_traces: list


@contextlib.contextmanager
def spying():
    """Record what Thunder's pair pass and thunder_remat's pair pass are called on. Thunder's is
    watched inside the original ``rematerialize`` (its first step), behind any gate."""
    import thunder.core.rematerialization as builtin

    import thunder_remat.plugin as plugin

    theirs, ours = [], []
    find, pair_pass = builtin.find_fusion_producer_consumer_pairs, plugin.rematerialize_fusion_pairs

    def find_spy(trace, *args, **kwargs):
        theirs.append(trace)
        return find(trace, *args, **kwargs)

    def pair_pass_spy(trace, *args, **kwargs):
        ours.append(trace)
        return pair_pass(trace, *args, **kwargs)

    builtin.find_fusion_producer_consumer_pairs, plugin.rematerialize_fusion_pairs = find_spy, pair_pass_spy
    try:
        yield theirs, ours
    finally:
        builtin.find_fusion_producer_consumer_pairs, plugin.rematerialize_fusion_pairs = find, pair_pass


def compile_traces(name: str, variant: str, *, dropout: float | None = None, **options) -> Build:
    """Traces of one training step of a tiny model on fake CUDA tensors, through nvFuser (never run)."""
    model, inputs = fake_cuda_model(name, dropout)
    jitted = thunder.jit(model, executors=[NVFUSER_EX], **VARIANTS[variant], **options)
    with cuda_reported_available(), spying() as (theirs, ours):
        thunder.compile_data(jitted).get_computation_and_inputs(**inputs)
    return Build(jitted, thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1],
                 ours[-1] if ours else None, theirs)


_BUILDS: dict = {}


def build(name: str, variant: str, dropout: float | None = None) -> Build:
    """``compile_traces``, once per module (compiling is most of this file's time)."""
    key = (name, variant, dropout)
    if key not in _BUILDS:
        _BUILDS[key] = compile_traces(name, variant, dropout=dropout)
    return _BUILDS[key]


def regions(trace) -> dict:
    return {b.sym.name: b for b in trace.bound_symbols if b.sym.is_fusion}


def nvfuser_traces(traces) -> list:
    """The traces among ``traces`` that hold nvFuser regions."""
    return [t for t in traces if any(b.sym.executor is NVFUSER_EX for b in regions(t).values())]


def fusion_definition(region):
    """Build (not execute) a region's nvFuser FusionDefinition, for contiguous inputs of the traced
    shapes, through the callable Thunder's ``nvFuserExecutor.fuse`` put in the region."""
    describe = importlib.import_module(nvfuser_module()).compute_tensor_descriptor

    def descriptor(arg):
        if not isinstance(arg, TensorProxy):
            return None
        shape, strides, step = tuple(arg.shape), [], 1
        for size in reversed(shape):
            strides.insert(0, step)
            step *= size
        contiguity, order = describe(shape, strides)
        return tuple(contiguity), tuple(order), ()  # () : not a DTensor

    with cuda_reported_available():
        return region._call_ctx[region.sym.name].get_fd(tuple(descriptor(a) for a in region.args))


def signature(region) -> tuple:
    return [p.name for p in region.flat_proxy_args], [p.name for p in region.flat_proxy_outs]


def kept_ops(trace) -> dict:
    """Output name of every random op (tagged RANDOM_OP) or reduction inside a region -> the
    regions computing it."""
    out: dict = {}
    for name, region in regions(trace).items():
        for sub in region.subsymbols:
            if {OpTags.RANDOM_OP, OpTags.REDUCTION_OP} & set(sub.sym.tags or ()):
                for p in sub.flat_proxy_outs:
                    out.setdefault(p.name, []).append(name)
    return out


def test_thunder_uses_nvfuser_and_thunder_remat_gates_its_pass():
    import thunder.executors.nvfuserex_impl as impl

    assert nvfuser_available() and nvfuser_module() in ("nvfuser_direct", "nvfuser")
    assert sys.modules.get(IMPL_MODULE) is impl
    assert getattr(impl.rematerialize, "_thunder_remat_gate", False), "Thunder's nvFuser pass is not gated"
    assert isinstance(adapter_for(NVFUSER_EX), NvFuserAdapter)


@pytest.mark.parametrize("name", MODELS + ZOO_MODELS)
def test_nvfuser_regions_and_rewritten_pairs(name):
    b = build(name, "ours")
    for trace in (b.forward, b.backward):
        found = regions(trace)
        assert len(found) >= 2 and all(r.sym.executor is NVFUSER_EX for r in found.values()), list(found)
    result = thunder_remat.last_pair_pass(b.jitted)
    assert result is not None and result.failure is None
    assert result.pairs and not [p for p in result.pairs if p.status.value == "failed"]
    rewritten = [p for p in result.pairs if p.status.value == "rewritten"]
    assert rewritten and all(p.recomputed for p in rewritten)
    assert result.bytes_after < result.bytes_before


@pytest.mark.parametrize("name", MODELS + ZOO_MODELS)
def test_every_region_builds_its_fusion_definition(name):
    b = build(name, "ours")
    result = thunder_remat.last_pair_pass(b.jitted)
    before, after = regions(b.pair_input), regions(result.trace)
    # a producer left with no outputs is dropped; every other region of a rewritten pair is re-emitted
    reemitted = {n for p in result.pairs if p.status.value == "rewritten" for n in (p.producer, p.consumer)} & set(after)
    assert reemitted
    for n in reemitted:  # a new region callable, made by nvFuserExecutor.fuse for the rewritten body
        assert after[n]._call_ctx[n] is not before[n]._call_ctx[n]
        assert signature(after[n]) != signature(before[n])
    final = {**regions(b.forward), **regions(b.backward)}
    assert reemitted <= set(final)
    for n, region in final.items():
        fd = fusion_definition(region)
        assert len(fd.fusion.inputs()) == len(region.args), n
        assert len(fd.fusion.outputs()) == len(region.flat_proxy_outs), n


@pytest.mark.parametrize("name, dropout", [("gpt", 0.1), ("llama", None), ("mlp", None)])
def test_no_random_op_or_reduction_moves_between_regions(name, dropout):
    """Random ops and reductions stay in the region Thunder put them in. nvFuser's dropout draws
    with ``uniform_philox`` (Thunder 0.2.6's ``replace_uniform``; the op carries no RANDOM_OP tag):
    counter-based, so a consumer may draw it again, from the same seed and offset."""
    b = build(name, "ours", dropout)
    result = thunder_remat.last_pair_pass(b.jitted)
    before, after = kept_ops(b.pair_input), kept_ops(result.trace)
    assert before and after == before
    assert not {n for p in result.pairs for n in p.recomputed} & set(before)
    draws: dict = {}
    for region in regions(result.trace).values():
        for sub in region.subsymbols:
            if sub.sym.name == "uniform_philox":
                draws.setdefault(sub.output.name, set()).add(repr((sub.args, sub.kwargs)))
    assert all(len(calls) == 1 for calls in draws.values()), draws
    assert bool(draws) == bool(dropout)


@pytest.mark.parametrize("name", MODELS + ZOO_MODELS)
def test_thunder_nvfuser_pass_does_not_run_with_thunder_remat(name):
    assert nvfuser_traces(build(name, "ours").thunder_pass_traces) == []
    assert nvfuser_traces(build(name, "defaults").thunder_pass_traces) == []
    assert len(nvfuser_traces(build(name, "thunder").thunder_pass_traces)) == 1  # the spy sees it when it runs


@pytest.mark.parametrize("name", MODELS + ZOO_MODELS)
def test_pair_pass_output_verifies(name):
    b = build(name, "ours")
    assert thunder_remat.verify(b.pair_input, thunder_remat.last_pair_pass(b.jitted).trace) == []


@pytest.mark.parametrize("name", MODELS)
def test_defaults_run_both_passes_on_nvfuser_regions(name):
    b = build(name, "defaults")
    plan = thunder_remat.last_save_plan(b.jitted)
    assert plan is not None and plan.failure is None
    result = thunder_remat.last_pair_pass(b.jitted)
    assert result.pairs and result.failure is None
    assert thunder_remat.verify(b.pair_input, result.trace) == []
    ours, theirs = bytes_crossing(b.forward, b.backward), bytes_crossing(*_final(name, "thunder"))
    uncut = bytes_crossing(*_final(name, "uncut"))
    # the plan and the pair pass hand over fewer bytes than Thunder's pass; the cuts then trade
    # bytes crossing between pieces for saved values freed earlier (each cut only where what it
    # frees outweighs what crosses), and change nothing the forward saves
    assert uncut.saved < theirs.saved and uncut.total < theirs.total, (uncut, theirs)
    assert ours.saved == uncut.saved and ours.forward == uncut.forward and ours.backward >= uncut.backward
    # backward regions cut where saved values die (pairs.split) are nvFuser regions like the others
    for n, region in {**regions(b.forward), **regions(b.backward)}.items():
        fd = fusion_definition(region)
        assert len(fd.fusion.inputs()) == len(region.args), n
        assert len(fd.fusion.outputs()) == len(region.flat_proxy_outs), n


def _final(name, variant):
    b = build(name, variant)
    return b.forward, b.backward


@pytest.mark.parametrize("name", MODELS + ZOO_MODELS)
def test_bytes_crossing_not_above_thunders_pass(name):
    """On the GPT's attention (nvFusion2 -> nvFusion10) the pair pass used to recompute the softmax
    in the backward from the scores and two statistics (1,280 B more), pricing the softmax output
    in full although a view of it that the region emits for the forward keeps its storage alive;
    a value sharing an external output's storage now crosses for free."""
    ours, theirs = bytes_crossing(*_final(name, "ours")), bytes_crossing(*_final(name, "thunder"))
    assert ours.total <= theirs.total, (ours, theirs)


@pytest.mark.parametrize("name", MODELS + ZOO_MODELS)
def test_saved_bytes_not_above_thunders_pass(name):
    ours, theirs = bytes_crossing(*_final(name, "ours")), bytes_crossing(*_final(name, "thunder"))
    assert ours.saved <= theirs.saved, (ours, theirs)


@pytest.mark.parametrize("name", MODELS)
def test_thunder_alone_figure_matches_thunders_compilation(name):
    """thunder_remat's own figure of what Thunder alone saves (reports use it) is what a compilation
    without thunder_remat saves, on nvFuser regions too."""
    with cuda_reported_available():
        figure = thunder_remat.plugin.thunder_alone_saved_bytes(build(name, "ours").jitted)
    assert figure == bytes_crossing(*_final(name, "thunder")).saved


def describe(b: Build) -> str:
    flat, _ = thunder.core.pytree.tree_flatten(b.forward.output[1])
    lines = [f"saved: {' '.join(sorted(p.name for p in flat if isinstance(p, TensorProxy)))}"]
    for label, trace in (("forward", b.forward), ("backward", b.backward)):
        for name, (ins, outs, ops) in fusion_regions(trace).items():
            lines.append(f"{label} {name}({', '.join(ins)}) -> ({', '.join(outs)}): {' '.join(ops)}")
    return "\n".join(lines) + "\n"


def test_golden_gpt_regions():
    """Region names, inputs, outputs and ops of the tiny GPT through nvFuser, Thunder's pass against
    thunder_remat's (regenerate with THUNDER_REMAT_UPDATE_GOLDENS=1 after a deliberate change)."""
    text = (f"# before (Thunder's built-in nvFuser pass)\n{describe(build('gpt', 'thunder'))}"
            f"# after (thunder_remat, pair pass alone)\n{describe(build('gpt', 'ours'))}")
    path = GOLDEN / "nvfuser_gpt.txt"
    if os.environ.get("THUNDER_REMAT_UPDATE_GOLDENS"):
        path.write_text(text)
    assert text == path.read_text(), f"golden {path.name} differs:\n{text}"


LATE_IMPORT = textwrap.dedent("""
    import sys, torch
    import thunder, thunder_remat
    import thunder.core.rematerialization as builtin
    from torch._subclasses.fake_tensor import FakeTensorMode
    from thunder_remat.models import build_model, example_batch

    assert "thunder.executors.nvfuserex_impl" not in sys.modules  # CUDA absent at import: no nvFuser
    mode = FakeTensorMode()
    with mode, torch.device("cuda"):
        model = build_model("mlp", "tiny")
    batch = example_batch(model)
    with mode:
        x = torch.zeros(batch.shape, dtype=batch.dtype, device="cuda")
    torch.cuda.is_available = lambda: True  # after making the fake tensors, which would try CUDA
    import thunder.executors.nvfuserex_impl as impl  # imported late, by hand
    assert not getattr(impl.rematerialize, "_thunder_remat_gate", False)
    calls = []
    find = builtin.find_fusion_producer_consumer_pairs
    builtin.find_fusion_producer_consumer_pairs = lambda *a, **k: calls.append(1) or find(*a, **k)
    jitted = thunder.jit(model, executors=[thunder.get_executor("nvfuser")], remat=True, remat_whole_graph=False)
    thunder.compile_data(jitted).get_computation_and_inputs(x)
    assert getattr(impl.rematerialize, "_thunder_remat_gate", False), "not gated"
    assert calls == [], "Thunder's pass ran"
    assert thunder_remat.last_pair_pass(jitted).pairs
    print("ok")
""")


def test_gate_goes_on_when_thunder_imports_nvfuser_late():
    """Where Thunder's nvFuser executor is imported after thunder_remat (by hand), the gate goes on
    at the first compilation thunder_remat is active in."""
    env = {k: v for k, v in os.environ.items() if k != "REMAT_NVFUSER_TRACES"}
    done = subprocess.run([sys.executable, "-c", LATE_IMPORT], env=env, cwd=Path(__file__).parent,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
