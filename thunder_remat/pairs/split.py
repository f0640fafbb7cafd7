"""Split the backward's fusion regions so that saved values die with the piece that last reads them.

A fusion region is one call whose inputs are its arguments: with Thunder's torch.compile executor
on CPU the whole backward is one region, and every value the forward saved lives until it returns,
however early its last reader runs (docs/whole-graph.md, "The step's peak"). Cut into pieces run
one after another, Thunder's ``del_last_used`` frees a saved value after the piece that last
reads it; where the executor's compiler merges equal computations, two ops computing the same value
(a value recomputed again for a far reader) may be cut apart when what the compiler would hold in
between outweighs what crosses the cut. No cut falls between an op that makes a storage and an
in-place write into it, and none in a region that runs a convolution where the executor's kernel
model says so (``KernelModel.uncut_convolution_regions``), or, where the plan chose it
(``KernelModel.cut_before_gradient_convolutions``), none from the making of the operands of its
first gradient convolution on. Where to cut is
``fusion_regions.region_cut_positions`` (the rule is ``solvers.region_cuts``, plain data); each
piece is emitted through the region's own executor, in the original order, reading and returning
what the pieces around it need, so the trace computes the same values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from thunder.core.pytree import tree_flatten

from thunder_remat.fusion_regions import region_cut_positions, region_names, uncut_convolutions, written_after_made
from thunder_remat.storage import storage_map
from thunder_remat.trace_facts import gradient_values, is_backward, is_backward_region, loss_outputs

__all__ = ["split_backward_regions", "separate_forward_and_backward"]


def separate_forward_and_backward(trace, adapter_for: Callable, fusion_counter: Callable) -> tuple[list, list[str]]:
    """The bound symbols of ``trace`` with every fusion region that runs forward and backward ops
    cut where one gives way to the other, and the names of the regions cut.

    Thunder 0.2.6 fuses runs of consecutive fusible ops (its default ``fusion_type``,
    "consecutive") without looking at the backward tag, so a copy the rewrite places at the start
    of the backward, before Thunder's first ``get_grad``, joins the forward's last region; the
    forward/backward split then runs it in the forward and saves what it makes, which the plan
    recomputes in the backward. Cut apart, each piece runs where the plan (and the step-peak
    estimate, whose regions never span the two) puts it. Only regions of executors whose adapter
    says so (``FusionAdapter.separates_forward_end``)."""
    counters = _counters(trace.bound_symbols, fusion_counter)
    out, done = [], []
    for bsym in trace.bound_symbols:
        adapter = adapter_for(bsym.sym.executor) if bsym.sym.is_fusion else None
        subs = list(bsym.subsymbols) if adapter is not None and adapter.separates_forward_end else []
        switches = [k for k in range(1, len(subs)) if is_backward(subs[k]) != is_backward(subs[k - 1])]
        if switches:
            # never between the op making a storage and an in-place write into it (wrong gradients)
            fixed = written_after_made(subs, storage_map(subs, list(bsym.flat_proxy_args)))
            switches = [k for k in switches if k - 1 not in fixed]
        if not switches:
            out.append(bsym)
            continue
        for inputs, outputs, body in _pieces_at(subs, [0, *switches, len(subs)], [p.name for p in bsym.flat_proxy_outs]):
            counters[bsym.sym.executor] += 1
            out.append(adapter.fuse_piece(inputs, outputs, body, counters[bsym.sym.executor]))
        done.append(bsym.sym.name)
    return out, done


def _counters(bsyms, fusion_counter: Callable) -> dict:
    """Per executor, the highest number in the names of its regions (a new piece takes the next)."""
    counters: dict[object, int] = {}
    for bsym in bsyms:
        if bsym.sym.is_fusion:
            ex = bsym.sym.executor
            counters[ex] = max(counters.get(ex, -1), fusion_counter(bsym.sym.name))
    return counters


def split_backward_regions(trace, adapter_for: Callable, fusion_counter: Callable,
                           order_kept: bool = False, prologue=frozenset(),
                           cut_before_gradient_convolutions: bool = False) -> tuple[list, list[tuple[str, int]]]:
    """The bound symbols of ``trace`` with each backward fusion region cut where ``region_cuts``
    says, and (region name, pieces) for every region cut. ``order_kept``: the regions will run
    their ops in order (``FusionAdapter.keep_plan_order``), so no executor merges two equal
    computations and no cut is needed to keep them apart. ``prologue``: names the backward makes
    when it starts (``RematSession.prologue``): a region is also cut after the last op making one,
    as the step-peak estimate expects. ``cut_before_gradient_convolutions``: the plan's choice
    (``SavePassResult.cut_before_gradient_convolutions``) for regions the executor's kernel model
    leaves uncut where they run a convolution."""
    # the function's arguments and parameters are held anyway: a cut frees nothing of theirs
    arguments = [p for p in tree_flatten((trace.args, trace.kwargs))[0] if hasattr(p, "name")]
    held = {p.name for p in arguments}
    bsyms = list(trace.bound_symbols)
    # one storage map of the whole trace, regions read op by op: a value that is a view of one
    # made earlier (in the region or before it) holds that value's storage, as the step-peak
    # estimate counts it
    storages = storage_map([op for bsym in bsyms for op in (bsym.subsymbols if bsym.sym.is_fusion else (bsym,))],
                           arguments)
    last_reader: dict[str, int] = {}  # storage -> position of the last bound symbol reading it
    to_loss = loss_outputs(trace)
    for position, bsym in enumerate(bsyms):
        for p in bsym.flat_proxy_args:
            if position < len(bsyms) - 1 or p.name not in to_loss:
                last_reader[storages.owner_of(p.name)] = position
    counters = _counters(bsyms, fusion_counter)
    gradients = None  # computed once, where a region needs it
    out, done = [], []
    for position, bsym in enumerate(bsyms):
        adapter = adapter_for(bsym.sym.executor) if bsym.sym.is_fusion else None
        merges = adapter is not None and adapter.merges_same_computations and not order_kept
        pieces = None
        if adapter and is_backward_region(bsym):
            # an input read again after the region lives on: a cut cannot free it either
            read_later = {p.name for p in bsym.flat_proxy_args
                          if last_reader.get(storages.owner_of(p.name), -1) > position}
            kernels = adapter.kernel_model()
            if kernels is not None and cut_before_gradient_convolutions:
                kernels = replace(kernels, cut_before_gradient_convolutions=True)
                gradients = gradient_values(bsyms) if gradients is None else gradients
            uncut_from = uncut_convolutions(bsym.subsymbols, kernels, gradients)
            pieces = _pieces(bsym, held | read_later, merges, storages, prologue, uncut_from,
                             cut_before_gradient_convolutions)
        if not pieces:
            out.append(bsym)
            continue
        for inputs, outputs, body in pieces:
            counters[bsym.sym.executor] += 1
            out.append(adapter.fuse_piece(inputs, outputs, body, counters[bsym.sym.executor]))
        done.append((bsym.sym.name, len(pieces)))
    return out, done


def _pieces(region, held: set[str], keep_apart: bool, storages, prologue=frozenset(), uncut_from=(),
            cut_before_uncut: bool = True):
    """(inputs, outputs, bound symbols) of each piece of ``region``, or None when it is not cut."""
    subs = list(region.subsymbols)
    names = region_names(subs)
    proxies, reads, makes = names.proxies, names.reads, names.makes
    returned = [p.name for p in region.flat_proxy_outs]
    boundaries = [k for k, made in enumerate(makes) if prologue.intersection(made)][-1:]
    cuts = region_cut_positions(subs, region.flat_proxy_args, set(returned), held, keep_apart, names, storages,
                                boundaries, uncut_from, cut_before_uncut)
    if not cuts:
        return None
    return _pieces_at(subs, [0, *(k + 1 for k in cuts), len(subs)], returned, names)


def _pieces_at(subs, bounds: list[int], returned: list[str], names=None):
    """(inputs, outputs, bound symbols) of the pieces ``subs[bounds[i]:bounds[i + 1]]`` of a region
    returning ``returned``: each piece reads what earlier pieces or the region's inputs make and
    returns what later pieces or the region's readers need."""
    names = names if names is not None else region_names(subs)
    proxies, reads, makes = names.proxies, names.reads, names.makes
    needed_after: list[set[str]] = []  # per piece: what later pieces or the region's readers need
    later = set(returned)
    for start, end in reversed(list(zip(bounds, bounds[1:]))):
        needed_after.append(set(later))
        for row in reads[start:end]:
            later.update(row)
    needed_after.reverse()
    pieces = []
    for (start, end), after in zip(zip(bounds, bounds[1:]), needed_after):
        made = {n for row in makes[start:end] for n in row}
        ins = list(dict.fromkeys(n for row in reads[start:end] for n in row if n not in made))
        outs = [n for row in makes[start:end] for n in row if n in after]
        pieces.append(([proxies[n] for n in ins], [proxies[n] for n in dict.fromkeys(outs)], subs[start:end]))
    return pieces
