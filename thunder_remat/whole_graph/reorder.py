"""Run the backward of a rewritten joint trace in an order that holds less at once.

Autograd emits each gradient where its formula falls, in reverse forward order. Any order that
respects data dependencies computes the same values; the step-peak estimate (with the fusion
regions the executor will form from that order) decides between the trace's own order and the
greedy orders of ``solvers.memory_order``. Below the fastest plan the regions then run in that order
(``remat_keep_plan_order``); at the fastest plan Inductor may still reorder inside a region.

Nothing moves across an op that writes in place, draws random numbers, communicates, makes no
output, does not belong to the backward, or makes a value of the backward's prologue (the
checkpoints it makes when it starts): each of those keeps its place, and every other op stays on
its side of it.
"""

from __future__ import annotations

from collections.abc import Callable

from thunder.core.trace import from_trace

from thunder_remat.whole_graph.checkpoints import AUTO_MIN_GAIN
from thunder_remat.solvers.memory_order import (OrderProblem, least_peak_order, least_peak_order_from_the_end,
                                                oldest_inputs_order, sunk_order)
from thunder_remat.trace_facts import TagReader, forward_storages, in_place_destination, is_backward, trace_names

__all__ = ["ORDERS", "backward_order_problem", "lowest_peak_order", "reordered"]

#: the orders tried, by name, after the trace's own ("trace")
ORDERS = (("sunk", sunk_order), ("least peak", least_peak_order),
          ("least peak from the end", least_peak_order_from_the_end), ("oldest inputs", oldest_inputs_order))

#: tags of ops that keep their place (see the module docstring)
_FIXED_TAGS = frozenset({"IN_PLACE", "RANDOM_OP", "COLLECTIVE"})


def backward_order_problem(trace, prologue=frozenset()) -> tuple[int, OrderProblem] | None:
    """(position of the backward's first op, the ``OrderProblem`` of the backward's ops up to the
    trace's return), or None for a trace with no backward to order."""
    bsyms = trace.bound_symbols
    start = next((i for i, b in enumerate(bsyms[:-1]) if is_backward(b)), None)
    if start is None or len(bsyms) - 1 - start < 2:
        return None
    names = trace_names(trace)
    storages = forward_storages(trace, with_backward=True)
    owner, held = storages.owner, storages.held

    def storage(name: str) -> str:
        return owner.get(name, name)

    tags = TagReader()
    end = len(bsyms) - 1
    producer: dict[str, int] = {}
    preds, reads, makes = [], [], []
    since_fixed: list[int] = []  # nodes after the last fixed one
    last_fixed = None
    for node, position in enumerate(range(start, end)):
        bsym = bsyms[position]
        before = {producer[n] for n in names.reads[position] if n in producer}
        fixed = (not is_backward(bsym) or not bsym.flat_proxy_outs or in_place_destination(bsym) is not None
                 or bool(tags(bsym) & _FIXED_TAGS) or any(p.name in prologue for p in bsym.flat_proxy_outs))
        if last_fixed is not None:
            before.add(last_fixed)
        if fixed:
            before.update(since_fixed)
            last_fixed, since_fixed = node, []
        else:
            since_fixed.append(node)
        preds.append(frozenset(before))
        reads.append(frozenset(storage(n) for n in names.tensor_reads[position]) - held)
        makes.append(frozenset(n for n in names.tensor_outs[position] if storage(n) == n and n not in held))
        for p in bsym.flat_proxy_outs:
            producer[p.name] = node
    kept = frozenset(storage(n) for n in names.tensor_reads[end]) - held
    sizes = {s: storages.owner_bytes.get(s, 0) for group in (*reads, *makes) for s in group}
    return start, OrderProblem(tuple(preds), tuple(reads), tuple(makes), sizes, kept)


def reordered(trace, start: int, order) -> object:
    """``trace`` with its ops from ``start`` up to the return run in ``order`` (node numbers from
    ``start``)."""
    bsyms = trace.bound_symbols
    new = from_trace(trace)
    new.names = set(trace.names)
    backward = bsyms[start:-1]
    new.bound_symbols = [*bsyms[:start], *(backward[k] for k in order), bsyms[-1]]
    return new


def lowest_peak_order(trace, estimate: Callable[[object], int], prologue=frozenset(),
                      min_gain: float = AUTO_MIN_GAIN) -> tuple[object, int, str]:
    """(the trace in the order with the lowest ``estimate`` of its step peak, that estimate, the
    order's name: ``"trace"`` or one of ``ORDERS``). An order replaces the trace's own only when its
    estimate is at least ``min_gain`` lower (the estimate is good to a few percent, as for
    checkpoints: a reorder the estimate barely preferred measured 4% higher on the zoo's RoBERTa
    at 0.0); the first of equal orders wins."""
    own = estimate(trace)
    best, best_peak, best_name = trace, own, "trace"
    found = backward_order_problem(trace, prologue)
    if found is None:
        return best, best_peak, best_name
    start, problem = found
    identity = list(range(len(problem.preds)))
    for name, make in ORDERS:
        order = make(problem)
        if order == identity:
            continue
        candidate = reordered(trace, start, order)
        peak = estimate(candidate)
        if peak < best_peak and peak <= (1.0 - min_gain) * own:
            best, best_peak, best_name = candidate, peak, name
    return best, best_peak, best_name
