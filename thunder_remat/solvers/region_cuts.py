"""Where to cut a backward fusion region so that what it reads can be freed before it ends.

A fusion region is one call: every value it reads from before it (the saved activations, most of
all) lives until it returns, even when its last reader inside the region runs early. Cut into
pieces, run one after another, a value lives only until the piece that last reads it returns.
A cut also has a price: every value made before it and read after it must exist in memory between
the pieces (inside one region the compiler may never materialize it), unless the region returns it
anyway.

Plain data in, cut positions out. The rule is greedy and local: walking the region's ops in order,
cut after an op when the bytes of inputs whose last read has passed since the previous cut, but no
more than the rest of the region makes (freed memory lowers the peak only under what comes after),
exceed the bytes that would cross the cut. A value that crosses a cut is an input of the piece
after it, held until that piece returns, and counts as one: a later cut after its last read frees
it.

Some ops are better run in different pieces: two ops that compute the same value from the same
inputs (a value recomputed again for a far reader) are one computation to a compiler that sees
both, which may compute it once, early, and keep it until the far reader (Inductor fuses ops that
read the same buffers). ``apart`` names such pairs with the bytes the earlier result would be
held for: at the latest position a cut between them can take, those bytes count as freed, like a
dead input's, so the cut is made only when they (with what else it frees) exceed what crosses.

No cut is placed where ``fixed`` says: after an op that makes a storage and before an in-place
write into it, so that a piece never writes into memory an earlier piece made; and, where the
compiler's memory around some op is not modelled (a convolution's layout conversions), from the
making of that op's operands on (``uncut_from``): the part before it is still cut by the rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["region_cuts", "apart_pairs", "made_then_written", "uncut_from"]


def region_cuts(reads: Sequence[Sequence[str]], makes: Sequence[Sequence[str]], sizes: Mapping[str, int],
                freeable: frozenset[str] | set[str], outputs: frozenset[str] | set[str],
                apart: Sequence[tuple[int, int, int]] = (), fixed: frozenset[int] | set[int] = frozenset(),
                boundaries: Sequence[int] = ()) -> list[int]:
    """Positions ``k`` (0-based, in op order) after which to cut a region of ``len(reads)`` ops.

    ``boundaries``: positions after which the region is always cut (unless ``fixed`` forbids it),
    each part then cut alone as a region of its own: what an earlier part made is an input of the
    parts that read it, freed by the cut after its last read, as the region's own inputs are.
    (The backward's prologue, the checkpoints it makes when it starts, ends at a boundary: the
    regions after it then hold those values as they would hold the saved values of the plan the
    checkpoints stand for.) Other arguments as ``_greedy_cuts``.
    """
    n = len(reads)
    ends = sorted({k for k in boundaries if 0 <= k < n - 1 and k not in fixed})
    if not ends:
        return _greedy_cuts(reads, makes, sizes, freeable, outputs, apart, fixed)
    bounds = [0, *(k + 1 for k in ends), n]
    made_before: set[str] = set()
    read_from: list[set[str]] = [set() for _ in range(len(bounds))]  # per part: storages read in it or later
    for part in range(len(bounds) - 2, -1, -1):
        read_from[part] = set(read_from[part + 1]).union(*reads[bounds[part]:bounds[part + 1]])
    cuts: list[int] = []
    for part, (start, end) in enumerate(zip(bounds, bounds[1:])):
        later = read_from[part + 1]
        inputs = (set(freeable) | made_before) - later - set(outputs)
        part_outputs = set(outputs) | later
        local_apart = [(i - start, j - start, b) for i, j, b in apart if start <= i < j < end]
        local_fixed = {k - start for k in fixed if start <= k < end}
        found = _greedy_cuts(reads[start:end], makes[start:end], sizes, inputs, part_outputs, local_apart, local_fixed)
        cuts += [start + k for k in found]
        if end < n:
            cuts.append(end - 1)
        made_before.update(*makes[start:end])
    return cuts


def _greedy_cuts(reads: Sequence[Sequence[str]], makes: Sequence[Sequence[str]], sizes: Mapping[str, int],
                 freeable: frozenset[str] | set[str], outputs: frozenset[str] | set[str],
                 apart: Sequence[tuple[int, int, int]] = (), fixed: frozenset[int] | set[int] = frozenset()) -> list[int]:
    """The greedy rule (module docstring) on one region.

    ``reads``/``makes``: the storages each op reads and allocates (a view reads its base and
    allocates nothing; a value and its views are one storage, freed after the last read of any of
    them); ``sizes``: bytes per storage (0 if absent); ``freeable``: the region's inputs whose
    memory is freed once nothing reads them (not parameters or other storages held anyway);
    ``outputs``: what the region returns (alive after it); ``apart``: triples
    ``(i, j, bytes)``, ``i < j``: a cut after op ``i`` and before op ``j`` frees ``bytes`` (weighed
    at the latest position between that ``fixed`` allows; none: the pair is dropped); ``fixed``:
    positions after which no cut may fall.
    """
    n = len(reads)
    if n < 2:
        return []
    last: dict[str, int] = {}
    for k, names in enumerate(reads):
        for name in names:
            last[name] = k
    freed = [0] * n  # bytes of freeable inputs whose last read is op k
    counted: set[str] = set()
    for name, k in last.items():
        if name in freeable and name not in counted:
            counted.add(name)
            freed[k] += sizes.get(name, 0)
    crossing = [0] * (n + 1)  # difference array: a value made at d and last read at l crosses d..l-1
    spans_from: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # d -> (l, bytes) of values made at d
    for d, names in enumerate(makes):
        for name in names:
            end = last.get(name, d)
            if name not in outputs and end > d:  # an output exists between the pieces anyway
                crossing[d] += sizes.get(name, 0)
                crossing[end] -= sizes.get(name, 0)
                spans_from[d].append((end, sizes.get(name, 0)))
    rest = [0] * (n + 1)  # bytes the ops after k make: what freed memory would otherwise sit under
    for k in range(n - 1, -1, -1):
        rest[k] = rest[k + 1] + sum(sizes.get(name, 0) for name in makes[k])
    due: dict[int, list[tuple[int, int]]] = {}  # k -> (i, bytes) of pairs whose last chance is a cut at k
    for i, j, nbytes in apart:
        at = next((k for k in range(min(j, n - 1) - 1, max(i, 0) - 1, -1) if k not in fixed), None)
        if at is not None:
            due.setdefault(at, []).append((i, nbytes))
    cuts, live, since = [], 0, 0
    open_spans: list[tuple[int, int]] = []  # values made since the last cut, not yet past a cut
    for k in range(n - 1):
        open_spans += spans_from[k]
        live += crossing[k]
        since += freed[k]
        if k in fixed:
            continue
        apart_gain = sum(nbytes for i, nbytes in due.get(k, ()) if not cuts or cuts[-1] < i)
        if min(since + apart_gain, rest[k + 1]) > live:
            cuts.append(k)
            since = 0
            # what crosses this cut is an input of the next piece, held by it until it returns:
            # a later cut after its last read frees it, as it frees the region's own inputs
            for end, nbytes in open_spans:
                if end > k:
                    freed[end] += nbytes
            open_spans = []
    return cuts


def apart_pairs(same: Sequence[tuple[int, int]], made: Mapping[int, Mapping[str, int]] | Sequence[Mapping[str, int]],
                last_read: Mapping[str, int],
                outputs: frozenset[str] | set[str]) -> list[tuple[int, int, int]]:
    """The ``apart`` triples of ``region_cuts``: ``(i, j, bytes)``, a cut after op ``i`` and before
    op ``j`` frees ``bytes``, for each pair in ``same`` (ops computing the same values, ``i < j``)
    whose earlier results nothing reads from ``j`` on (computing them once would hold them until
    ``j``). ``made``: per op (at least each pair's first), what it makes -> bytes (empty ones
    ignored); ``last_read``: value ->
    the last op reading it; ``outputs``: what the region returns (alive after it anyway)."""
    apart = []
    for i, j in same:
        results = {name: nbytes for name, nbytes in made[i].items() if nbytes}
        if not results or any(name in outputs or last_read.get(name, -1) >= j for name in results):
            continue  # the first result lives past the second anyway: computing it once costs nothing
        apart.append((max([i, *(last_read.get(name, i) for name in results)]), j, sum(results.values())))
    return apart


def made_then_written(makes: Sequence[Sequence[str]], writes: Sequence[str | None]) -> set[int]:
    """The ``fixed`` positions of ``region_cuts``: after the op that first makes a storage and
    before an op that writes into it in place. ``makes``: the storages each op makes (views name
    their base); ``writes``: the storage each op writes in place, or None."""
    made_at: dict[str, int] = {}
    for k, names in enumerate(makes):
        for name in names:
            made_at.setdefault(name, k)
    fixed: set[int] = set()
    for k, written in enumerate(writes):
        start = made_at.get(written) if written is not None else None
        if start is not None and start < k:
            fixed.update(range(start, k))
    return fixed


def uncut_from(reads: Sequence[Sequence[str]], makes: Sequence[Sequence[str]], marked: Sequence[bool],
               cut_before: bool = True) -> set[int]:
    """The ``fixed`` positions of ``region_cuts`` that keep the first ``marked`` op of a region, and
    every op from the first one making a storage it reads, in the region's last piece: no cut
    after any of them (``cut_before`` False: no cut anywhere in a region holding a marked op).
    ``reads``/``makes``: as ``region_cuts``; ``marked``: per op, whether a cut near it cannot be
    priced; nothing is fixed if none is."""
    first = next((k for k, m in enumerate(marked) if m), None)
    if first is None:
        return set()
    if not cut_before:
        return set(range(len(reads)))
    operands = set(reads[first])
    start = next((k for k in range(first) if operands.intersection(makes[k])), first)
    return set(range(start, len(reads)))
