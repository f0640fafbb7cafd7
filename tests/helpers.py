"""Small helpers shared by the tests: running a function with and without thunder_remat."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import networkx as nx
import thunder
import torch

import thunder_remat
from thunder_remat.inspect.measure import saved_for_backward


@dataclass
class Run:
    jitted: object
    outputs: tuple
    grads: tuple
    saved_bytes: int
    saved_count: int


def run(fn, args, *, executors, seed=None, **options) -> Run:
    """jit ``fn``, run forward (measuring saved tensors) and backward of a sum-of-squares loss."""
    args = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)
    jitted = thunder.jit(fn, executors=executors, **options)
    if seed is not None:
        torch.manual_seed(seed)
    out, saved = saved_for_backward(jitted, *args)
    outs = out if isinstance(out, tuple) else (out,)
    sum(o.float().pow(2).sum() for o in outs).backward()
    grads = tuple(a.grad for a in args if a.requires_grad)
    return Run(jitted, tuple(o.detach() for o in outs), grads, saved.nbytes, saved.count)


@dataclass
class Step:
    jitted: object
    out: object
    grads: list
    saved: object
    model: object


def train_built_in(name: str, *, executors, dropout=None, seed=None, **options) -> Step:
    """One training step of a built-in model at its tiny size: jit, forward (measuring what it
    saves), backward of the mean square of its output. The one harness the jit tests share."""
    from thunder_remat.models import build_model, example_batch

    model = build_model(name, "tiny", dropout=dropout)
    x = example_batch(model)
    jm = thunder.jit(model, executors=list(executors), **options)
    if seed is not None:
        torch.manual_seed(seed)
    out, saved = saved_for_backward(jm, x)
    out.float().pow(2).mean().backward()
    return Step(jm, out.detach(), [p.grad.clone() for p in model.parameters()], saved, model)


def assert_same_numbers(a: Run, b: Run, *, exact: bool = False) -> None:
    for x, y in zip(a.outputs + a.grads, b.outputs + b.grads):
        if exact:
            assert torch.equal(x, y)
        else:
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


def saved_names(jitted) -> list[str]:
    """Names of the tensors the forward trace returns for backward."""
    fw = thunder.last_traces(jitted)[-1]
    flat, _ = thunder.core.pytree.tree_flatten(fw.output[1])
    return sorted(p.name for p in flat if isinstance(p, thunder.core.proxies.TensorProxy))


def fusion_regions(trace) -> dict[str, tuple[list[str], list[str], list[str]]]:
    """region name -> (input names, output names, names of ops in its body)."""
    return {
        f"{b.sym.executor.name}:{b.sym.name}": ([p.name for p in b.flat_proxy_args], [p.name for p in b.flat_proxy_outs], [s.sym.name for s in b.subsymbols])
        for b in trace.bound_symbols
        if b.sym.is_fusion
    }


def _networkx_graph(network) -> tuple[nx.DiGraph, dict[tuple[int, int], float]]:
    """The FlowNetwork as a networkx graph, parallel edges summed (an infinite edge has no
    capacity attribute: networkx treats it as infinite), and the summed capacities."""
    caps: dict[tuple[int, int], float] = {}
    for edge, cap in zip(network.edges, network.capacities):
        caps[edge] = caps.get(edge, 0.0) + cap
    g = nx.DiGraph()
    g.add_nodes_from(range(network.num_nodes))
    for (u, v), cap in caps.items():
        g.add_edge(u, v, **({} if cap == float("inf") else {"capacity": cap}))
    return g, caps


#: network digest -> networkx's cut value: a pass solves the same network again and again (each
#: budget of a sweep, each candidate of the checkpoint search), and the zoo's have thousands of edges
_CUT_VALUES: dict[bytes, float] = {}


def networkx_cut_value(network) -> float:
    """A second solver for the cut value: networkx (Boykov-Kolmogorov augmenting paths, another
    algorithm than igraph's) on the same FlowNetwork, once per distinct network."""
    key = hashlib.sha256(repr((network.num_nodes, network.edges, network.capacities, network.source,
                               network.sink)).encode()).digest()
    if key not in _CUT_VALUES:
        g, _ = _networkx_graph(network)
        try:
            value = float(nx.minimum_cut_value(g, network.source, network.sink,
                                               flow_func=nx.algorithms.flow.boykov_kolmogorov))
        except nx.NetworkXUnbounded:
            value = float("inf")
        _CUT_VALUES[key] = value
    return _CUT_VALUES[key]


def networkx_largest_source_side(network) -> frozenset[int]:
    """A second solver for the tie-break: every node that cannot reach the sink in the residual
    graph of networkx's maximum flow (the same set for every maximum flow; finite capacities)."""
    g, caps = _networkx_graph(network)
    _, flow = nx.maximum_flow(g, network.source, network.sink)
    residual = nx.DiGraph()
    residual.add_nodes_from(range(network.num_nodes))
    for (u, v), cap in caps.items():
        if cap - flow[u][v] > 0:
            residual.add_edge(u, v)
        if flow[u][v] > 0:
            residual.add_edge(v, u)
    reaches_sink = nx.ancestors(residual, network.sink) | {network.sink}
    return frozenset(range(network.num_nodes)) - reaches_sink


def last_pairs(jitted):
    result = thunder_remat.last_pair_pass(jitted)
    assert result is not None, "thunder_remat's pair pass did not run"
    return result


def joint_trace(fn, args, *, executors=(), with_jitted=False, **options):
    """The joint forward+backward trace Thunder hands to thunder_remat's whole-graph pass for ``fn``
    (and the pass's result on it; and the jitted function, with ``with_jitted``), from one
    jit-and-call with ``remat=True``."""
    import thunder_remat.plugin as plugin

    seen = []
    original = plugin.plan_saved_values

    def spy(trace, config, **kwargs):
        result = original(trace, config, **kwargs)
        seen.append((trace, result))
        return result

    plugin.plan_saved_values = spy
    try:
        jitted = thunder.jit(fn, executors=list(executors), remat=True, **options)
        jitted(*args)
    finally:
        plugin.plan_saved_values = original
    assert seen, "the whole-graph pass did not run"
    return (*seen[-1], jitted) if with_jitted else seen[-1]


def forward_tensors(joint, inputs: dict) -> dict:
    """Run the forward part of a joint trace op by op with Thunder's torch executor and return
    every tensor it makes, by name. ``inputs``: a tensor for each forward input name."""
    from thunder.core.proxies import TensorProxy

    from thunder_remat.executors.eager import _region_callable
    from thunder_remat.trace_facts import split_joint

    forward, _, names = split_joint(joint)
    proxies = {p.name: p for b in joint.bound_symbols[:-1] for p in b.flat_proxy_outs if p.name in names}
    proxies.update({p.name: p for p in joint.bound_symbols[-1].args[0]["flat_args"] if hasattr(p, "name")})
    args = [proxies[n] for n in inputs]
    made = {}
    for _, bsym in forward:
        for p in bsym.flat_proxy_outs:
            if isinstance(p, TensorProxy) and p.name not in proxies:
                made.setdefault(p.name, p)
    run = _region_callable([b for _, b in forward], args, list(made.values()))
    return dict(zip(made, run(*inputs.values())))


def trace_inputs(trace) -> list:
    """The tensors a trace unpacks from its arguments: parameters and inputs for a forward trace,
    saved values and cotangents for a backward one."""
    from thunder.core.proxies import TensorProxy

    return [p for b in trace.bound_symbols if b.sym.id in (thunder.prims.PrimIDs.UNPACK_TRIVIAL,
                                                           thunder.prims.PrimIDs.UNPACK_SEQUENCE)
            for p in b.flat_proxy_outs if isinstance(p, TensorProxy)]


def region_crossing_bytes(trace) -> int:
    """Bytes of the distinct storages one fusion region of ``trace`` writes and another reads
    (views count their base once; storages of the trace's inputs count nothing)."""
    from thunder_remat.storage import storage_map

    storages = storage_map(trace.bound_symbols[:-1], trace_inputs(trace))
    written = {p.name: i for i, b in enumerate(trace.bound_symbols) if b.sym.is_fusion for p in b.flat_proxy_outs}
    read = {p.name for i, b in enumerate(trace.bound_symbols) if b.sym.is_fusion
            for p in b.flat_proxy_args if written.get(p.name, i) != i}
    return storages.bytes_held(read)


def saved_storage_bytes(forward) -> int:
    """Bytes of the distinct storages a forward trace hands its backward (parameters and inputs
    count nothing: they are held anyway)."""
    from thunder_remat.storage import storage_map

    flat, _ = thunder.core.pytree.tree_flatten(forward.output[1])
    storages = storage_map(forward.bound_symbols[:-1], trace_inputs(forward))
    return storages.bytes_held(p.name for p in flat if isinstance(p, thunder.core.proxies.TensorProxy))


@dataclass(frozen=True)
class Crossing:
    """Storage bytes crossing region boundaries in one compilation's final traces."""

    forward: int  # region to region inside the forward
    saved: int  # forward to backward (saved for backward)
    backward: int  # region to region inside the backward

    @property
    def total(self) -> int:
        return self.forward + self.saved + self.backward


def bytes_crossing(forward, backward) -> Crossing:
    return Crossing(region_crossing_bytes(forward), saved_storage_bytes(forward), region_crossing_bytes(backward))


def most_copies_of_a_chained_op(plan) -> int:
    """The most copies the rewrite of ``plan`` (a ``SavePassResult``) made of one recomputed op that
    reads another recomputed op's value: the ops ``rewrite.MAX_CHEAP_COPIES`` bounds (an op that
    reads none is made again at each far use, and so are the views of what it makes)."""
    from collections import Counter

    from thunder_remat.whole_graph.checkpoints import storage_makers_and_views
    from thunder_remat.whole_graph.rewrite import reads_recomputed, remade_at_every_far_use

    recomputed = set(plan.choice.plan.recomputed)
    ops = [op for op in plan.problem.ops if op.index in recomputed]
    producer = {name: op.index for op in ops for name in op.outputs}
    reads = {op.index: op.inputs for op in ops}
    chained = reads_recomputed(reads, producer) - remade_at_every_far_use(
        *storage_makers_and_views(plan.problem, recomputed), reads, producer)
    return max((n for i, n in Counter(plan.copied_ops).items() if i in chained), default=0)


def executed_tensors(trace) -> dict:
    """Run an executed trace (``thunder.last_traces(fn)[-1]``, ``last_backward_traces``) on random
    inputs of its arguments' shapes and return every tensor its top-level statements assign, by
    name, all kept alive (so no storage is reused). Each top-level assignment of the generated
    source is followed by a call recording what it made."""
    import re

    from thunder.core.proxies import NumberProxy, TensorProxy
    from thunder.core.pytree import tree_flatten, tree_unflatten

    from thunder_remat.cost import dim_size

    def value(p):
        if isinstance(p, TensorProxy):
            shape, dtype = tuple(dim_size(d) for d in p.shape), thunder.torch.to_torch_dtype(p.dtype)
            return torch.randn(shape, dtype=dtype) if dtype.is_floating_point else torch.zeros(shape, dtype=dtype)
        return p.value if isinstance(p, NumberProxy) else p

    made = {}
    ctx = dict(trace.python_ctx(), _record=lambda name, v: made.setdefault(name, v) if isinstance(v, torch.Tensor) else None)
    lines = []
    for line in trace.python(include_decorators=True).splitlines():
        lines.append(line)
        assigned = re.match(r"^  (\(?[\w, ]+\)?) = ", line)
        if assigned:
            lines.extend(f"  _record({name!r}, {name})" for name in re.findall(r"\w+", assigned.group(1)))
    source = "\n".join(lines)
    exec(compile(source, "<executed trace>", "exec"), ctx)
    function = ctx[re.search(r"^def (\w+)\(", source, re.M).group(1)]
    flat, spec = tree_flatten((trace.args, trace.kwargs))
    args, kwargs = tree_unflatten([value(p) for p in flat], spec)
    function(*args, **kwargs)
    return made
