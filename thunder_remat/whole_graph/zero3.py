"""FSDP ZeRO-3 in the whole-graph pass: parameters are re-gathered in the backward instead of saved.

Analysis marks the all-gathers of sharded parameters (and their waits) as recomputed by rule;
after the rewrite has placed each re-gather right before its first backward use,
``prefetch_regathers`` issues them a few waits early so communication overlaps compute.
"""

from __future__ import annotations

from thunder.core.trace import from_trace

from thunder_remat.trace_facts import collective_name, is_backward

__all__ = ["REGATHER", "regathered_ops", "prefetch_regathers"]

REGATHER = "ZeRO-3: the sharded parameter is re-gathered in the backward"


def regathered_ops(forward, inputs) -> set[int]:
    """Positions of the all-gathers of forward inputs (sharded parameters) and of their waits.

    A structural rule (the same on every rank, whatever the sizes): under FSDP ZeRO-3 these are
    re-issued in the backward instead of saving the gathered parameter.
    """
    futures, chosen = set(), set()
    for i, bsym in forward:
        name = collective_name(bsym)
        reads = [p.name for p in bsym.flat_proxy_args]
        if name == "all_gather" and reads and all(r in inputs for r in reads):
            chosen.add(i)
            futures.update(p.name for p in bsym.flat_proxy_outs)
        elif name == "wait" and reads and all(r in futures for r in reads):
            chosen.add(i)
    return chosen


def prefetch_regathers(trace, depth: int, copies):
    """Issue each backward re-gather (FSDP ZeRO-3) up to ``depth`` waits early.

    ``copies``: the positions of the copies the rewrite made (``CopySchedule.copy_positions``);
    the re-gathers are the all-gathers among them. The rewrite places every re-gathered
    all-gather right before its wait, so one is in flight at a time. With ``depth`` > 1, the k-th
    all-gather moves to just before the wait of the (k - depth + 1)-th, so at most ``depth`` are in
    flight and communication overlaps the compute between waits. An all-gather reads only a
    sharded parameter (a forward input), so moving it earlier keeps every value defined before use.
    """
    if depth <= 1:
        return trace
    bsyms = list(trace.bound_symbols)
    gathers = [(i, bsyms[i].flat_proxy_outs[0].name) for i in sorted(copies)
               if collective_name(bsyms[i]) == "all_gather" and bsyms[i].flat_proxy_outs]
    waits = {}
    for i, bsym in enumerate(bsyms):
        if is_backward(bsym) and collective_name(bsym) == "wait":
            for p in bsym.flat_proxy_args:
                waits.setdefault(p.name, i)
    chain = [(g, waits[f]) for g, f in gathers if f in waits]
    if len(chain) < 2:
        return trace
    moves = {}  # all-gather index -> index of the wait it must precede
    for k, (g, _) in enumerate(chain):
        target = chain[max(0, k - depth + 1)][1]
        if target < g:
            moves[g] = target
    order = []
    before: dict[int, list[int]] = {}
    for g, target in moves.items():
        before.setdefault(target, []).append(g)
    for i in range(len(bsyms)):
        if i in moves:
            continue
        order.extend(sorted(before.get(i, ())))
        order.append(i)
    new = from_trace(trace)
    new.bound_symbols = [bsyms[i] for i in order]
    return new
