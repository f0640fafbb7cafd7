"""Rewrite: make the backward recompute the forward ops a ``SavePlan`` chose, just before first use.

Every backward bound symbol that reads a value produced by a recomputed forward op gets, right
before it, a copy of that op (and, first, of the recomputed ops it depends on), tagged
``BACKWARD`` and writing fresh names (``rc_<name>``); the reader is switched to the copies. The
forward's own op stays for the forward outputs that need it; when nothing forward needs it,
Thunder's dead-code elimination drops it, so the value is no longer saved for backward.
Recomputing at first use keeps each recomputed value alive for as short a time as possible; with
a reuse window, cheap values whose next use is far away are recomputed again there instead of
being kept alive in between.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from thunder.core.proxies import variableify
from thunder.core.symbol import BoundSymbolTag
from thunder.core.trace import from_trace, tracectx

from thunder_remat.trace_facts import TraceNames, trace_names

__all__ = ["CopySchedule", "schedule_copies", "build", "prologue_names", "reads_recomputed", "remade_at_every_far_use",
           "MAX_CHEAP_COPIES", "COPY_PREFIX"]


#: a cheap op that reads a recomputed value is copied at most this many times: then its latest
#: copy is reused, however stale. Without a bound, each far use of the end of a chain of cheap ops
#: (the residual stream at budget 0.0) recomputes the whole chain again, copies growing with the
#: square of the depth. An op that reads no recomputed value is no chain: a copy costs the op alone,
#: so one that makes storage of its own (an embedding lookup) may be made again at every far use
#: instead of held, and so may a view of what it makes (``remade_at_every_far_use``).
MAX_CHEAP_COPIES = 4

#: the names the rewrite gives its copies start with this (``rc_<name>``, ``rc_<name>_0``, ...)
COPY_PREFIX = "rc_"


@dataclass
class CopySchedule:
    """Where the backward recomputes what, by names only: no bound symbol is built.

    Copies are numbered in the order they are made; a copy's ``inputs`` and a reader's ``reads``
    map an input's name to the copy whose output it reads instead of the forward's value.
    ``estimate`` (the step peak, thunder_remat.whole_graph.peak) and ``build`` both read it, so the
    "auto" checkpoint search builds only the rewrite it keeps.
    """

    trace: object
    #: (forward op index, {input name: copy number}) per copy
    copies: list = field(default_factory=list)
    #: trace position of a backward reader -> the copies made just before it, in order
    before: dict = field(default_factory=dict)
    #: trace position of a backward reader -> {input name: copy number} it reads instead
    reads: dict = field(default_factory=dict)
    #: the names the trace's bound symbols read and write (shared by the schedules of one trace)
    names: TraceNames | None = field(default=None, repr=False)
    #: the copies numbered below it make the outermost checkpoints when the backward starts
    #: (``schedule_copies(early=True)``): the backward's prologue
    prologue: int = 0

    def trace_names(self) -> TraceNames:
        if self.names is None:
            self.names = trace_names(self.trace)
        return self.names

    @property
    def emitted(self) -> list[int]:
        """The forward op of every copy, in order."""
        return [i for i, _ in self.copies]

    def copy_positions(self) -> list[int]:
        """Where each copy lands in the trace ``build`` makes, in copy order."""
        positions, shift = [], 0
        for position in sorted(self.before):
            for _ in self.before[position]:
                positions.append(position + shift)
                shift += 1
        return positions


def schedule_copies(trace, recomputed_indices, *, window: int | None = None, cheap=frozenset(), checkpoints=(),
                    segments=frozenset(), max_cheap_copies: int = MAX_CHEAP_COPIES,
                    names: TraceNames | None = None, early: bool = False,
                    unbounded=frozenset(), views=frozenset()) -> CopySchedule:
    """Where the backward recomputes the forward bsyms at ``recomputed_indices``.

    Each op is copied at the first backward use of its outputs and the copy is reused after that,
    except with ``window``: a copy of a ``cheap`` op (one the policies do not protect: pointwise,
    views) left unread for more than ``window`` backward bound symbols is not reused; the op runs
    again where it is next needed, from copies of its inputs (again recomputing the cheap ones
    that went stale). The stale copy is then freed after its last read instead of living until the
    far use, which bounds how much recomputed data a long backward holds; after
    ``max_cheap_copies`` copies of one op its latest is reused, except for ``unbounded`` ops (that
    make storage of their own) reading no recomputed value, and the ``views`` of what they make:
    made again at every far use (``remade_at_every_far_use``). Other ops (matmuls) are
    copied once, except ``segments`` ops: a stale copy of one made only to compute a checkpoint
    op is made again near its next use, and that copy is kept. An op of a write group
    (``_write_groups``) is made again only with its whole group, when a segment op of the group
    was made only to compute a checkpoint op. So the backward first recomputes
    the checkpoints, holding only them, then each segment from its checkpoints where it is needed
    (checkpointing).

    ``checkpoints`` is a sequence of op-index sets, outermost level first. Copies of a level's ops
    are reused, unless the copy was made only to compute an op of an outer level: then it is made
    again (from the outer checkpoints) near its next use. With one level that is plain
    checkpointing; with more, each level is recomputed from the one before only where it is
    first needed, as if the outer level had been saved by the forward.

    So no op that reads a recomputed value is copied more than ``max(max_cheap_copies,
    len(checkpoints) + 1)`` times, and no other more than once per backward reader.
    ``early``: the outermost level is made, in forward order, when the backward starts (placed
    before its first reader; the reuse window counts from the first reader of a recomputed value),
    where the backward holds least (what it takes to make them is freed before the backward's own
    work starts), instead of at first use.
    ``names``: the trace's ``trace_names``, when the caller schedules the same trace more than once.
    """
    schedule = CopySchedule(trace, names=names)
    if not recomputed_indices:
        return schedule
    scheduler = _CopyScheduler(schedule, recomputed_indices, window=window, cheap=cheap, checkpoints=checkpoints,
                               segments=segments, max_cheap_copies=max_cheap_copies, unbounded=unbounded,
                               views=views)
    scheduler.run(early)
    return schedule


@dataclass
class _LatestCopy:
    """The newest copy of one forward op while the schedule is made."""

    #: its number in ``CopySchedule.copies``
    copy: int
    #: rewritten position of its last read so far (the reader it was made or reused for)
    last_read: int
    #: the checkpoint level of the op it was made to compute (``beyond``: made for a backward use)
    made_for: int


class _CopyScheduler:
    """Fills one ``CopySchedule`` (see ``schedule_copies`` for the rules)."""

    def __init__(self, schedule: CopySchedule, recomputed_indices, *, window, cheap, checkpoints, segments,
                 max_cheap_copies: int, unbounded, views) -> None:
        trace = schedule.trace
        self.schedule, self.window, self.cheap = schedule, window, cheap
        self.segments, self.max_cheap_copies, self.checkpoints = segments, max_cheap_copies, checkpoints
        recompute = {i: trace.bound_symbols[i] for i in recomputed_indices}
        self.names = schedule.trace_names()
        self.producer_index = {p.name: i for i, b in recompute.items() for p in b.flat_proxy_outs}
        self.reads_of = {i: self.names.reads[i] for i in recompute}
        self.pinned, self.first_readers, self.groups = _write_groups(recompute, self.reads_of, self.names)
        self.unbounded = remade_at_every_far_use(unbounded, views, self.reads_of, self.producer_index)
        self.level: dict[int, int] = {}  # checkpoint op -> its level (1: outermost)
        for depth, ops in enumerate(checkpoints, start=1):
            for i in ops:
                self.level.setdefault(i, depth)
        self.beyond = len(checkpoints) + 1  # the level of ops that are no checkpoint
        self.latest: dict[int, _LatestCopy] = {}
        self.made: dict[int, int] = {}  # op index -> copies made of it
        self.length = 0  # bound symbols of the rewritten trace so far
        self.pending: list[int] = []  # copies to place before the reader being processed

    def run(self, early: bool) -> None:
        schedule, names = self.schedule, self.names
        placed = 0  # bound symbols of the trace before ``position``: the rewritten length is placed + copies
        readers = [p for p in names.backward_readers if any(n in self.producer_index for n in names.reads[p])]
        # Every copy placed before one reader is read there: each is emitted at the reader's
        # position as it was before them (``at``), so a reader of two values, or of one value
        # twice, never finds the copy it made for its first read stale at its second.
        if early and self.checkpoints and readers:
            self.length, placed = readers[0], readers[0]
            at = self.length
            for i in sorted(self.checkpoints[0]):
                self.emit(i, at, self.beyond)
            schedule.prologue = len(schedule.copies)
        for position in names.backward_readers:
            self.length += position - placed
            placed = position
            at = self.length
            reads = {}
            for name in names.reads[position]:
                j = self.producer_index.get(name)
                if j is not None:
                    reads[name] = self.emit(j, at, self.beyond)
            if self.pending:
                schedule.before[position] = list(self.pending)
                self.pending.clear()
            if reads:
                schedule.reads[position] = reads

    def fresh_enough(self, i: int, latest: _LatestCopy, pos: int) -> bool:
        if self.window is None or pos - latest.last_read <= self.window:
            return True
        if i in self.pinned:  # made again only with its whole write group, as checkpointing would
            return not self.group_made_for_outer_level(i)
        if i in self.cheap:
            return i not in self.unbounded and self.made[i] >= self.max_cheap_copies
        if i in self.level or i in self.segments:  # stale and made for an outer level: make it again
            return latest.made_for >= self.level.get(i, self.beyond)
        return True  # a collective (ZeRO-3 re-gather): never issued twice

    def group_made_for_outer_level(self, i: int) -> bool:
        """Op ``i``'s write group (``_write_groups``) has a protected op (a segment or checkpoint op)
        whose latest copy was made only to compute an outer checkpoint level: the group is made
        again, as a whole, near its next use."""
        for j in self.groups.get(i, ()):
            latest = self.latest.get(j)
            if (latest is not None and (j in self.segments or j in self.level)
                    and latest.made_for < self.level.get(j, self.beyond)):
                return True
        return False

    def emit(self, i: int, pos: int, made_for: int) -> int:
        """The copy of op ``i`` a reader at rewritten position ``pos`` reads: the latest if fresh
        enough, else a new one (and, first, what it reads)."""
        latest = self.latest.get(i)
        if latest is not None and self.fresh_enough(i, latest, pos):
            latest.last_read = pos
            return latest.copy
        if latest is not None and i in self.pinned:
            # a stale op of a write group: the whole group again, in forward order, on a fresh
            # storage (a copy of part of it would write the old storage again, or read it after
            # the write); each member reads the new copies of the members before it
            for j in self.groups[i]:
                if j in self.latest:
                    self.copy(j, pos, made_for)
            return self.latest[i].copy
        return self.copy(i, pos, made_for)

    def copy(self, i: int, pos: int, made_for: int) -> int:
        """A new copy of op ``i`` for a reader at ``pos`` (and, first, what it reads)."""
        under = min(made_for, self.level.get(i, self.beyond))
        inputs = {}
        for name in self.reads_of[i]:
            j = self.producer_index.get(name)
            if j is not None and j != i:
                inputs[name] = self.emit(j, pos, under)
        for j in self.first_readers.get(i, ()):  # they read what this write overwrites: before it, once
            if j not in self.latest:
                self.emit(j, pos, under)
        self.schedule.copies.append((i, inputs))
        copy = len(self.schedule.copies) - 1
        self.pending.append(copy)
        self.length += 1
        self.made[i] = self.made.get(i, 0) + 1
        self.latest[i] = _LatestCopy(copy, pos, made_for)
        return copy


def reads_recomputed(reads_of: dict, producer_index: dict) -> frozenset[int]:
    """The recomputed ops (``reads_of``: op -> names it reads) that read a value another recomputed
    op makes (``producer_index``: name -> op): copying one again copies a chain."""
    return frozenset(i for i, reads in reads_of.items() if any(producer_index.get(n, i) != i for n in reads))


def remade_at_every_far_use(own_storage, views, reads_of: dict, producer_index: dict) -> frozenset[int]:
    """The recomputed ops (``reads_of``: op -> names it reads; ``producer_index``: name -> recomputed
    op) whose stale copies are made again at every far use, however many copies that makes: those of
    ``own_storage`` (ops that make storage of their own) that read no recomputed value (a copy costs
    the op alone), and the ``views`` of what such an op makes, through views (a copy costs the op
    and its views; reusing a stale view would hold the viewed storage as long as the view). A view
    of no recomputed value (a broadcast parameter) holds nothing and is reused. Every other op that
    reads a recomputed value is a chain, bounded by ``MAX_CHEAP_COPIES``."""
    remade = set(own_storage) - reads_recomputed(reads_of, producer_index)
    for i in sorted(set(views) & reads_of.keys()):  # forward order: a view of a view follows it
        viewed = {producer_index[name] for name in reads_of[i] if producer_index.get(name, i) != i}
        # a view of no recomputed value (a broadcast parameter) holds nothing: reused, as before
        if viewed and viewed <= remade:
            remade.add(i)
    return frozenset(remade)


def _write_groups(recompute: dict, reads_of: dict, names: TraceNames) -> tuple[set[int], dict[int, list[int]],
                                                                                dict[int, tuple[int, ...]]]:
    """The recomputed ops that touch a storage a recomputed write overwrites (``pinned``); per such
    write, the recomputed ops that read what it overwrites (in forward order); and per pinned op,
    its write group: the ops touching that storage, the write among them, in forward order (ops of
    two writes' groups share one group).

    A write's copy changes the storage of its destination's copy. So each op that makes or reads
    a value of that storage from before the write is copied with the write, and a copy of any of
    them is only made again with the whole group, on a storage of its own: a second copy of part
    of the chain would write the same storage again, or read it after the write. For the same
    reason the readers of the overwritten values are copied before the write is.
    """
    pinned: set[int] = set()
    first_readers: dict[int, list[int]] = {}
    group_of: dict[int, set[int]] = {}
    for write, overwritten in names.overwritten_by.items():
        if write not in recompute:
            continue
        members = set()
        for i in sorted(recompute):
            touches = overwritten.intersection(reads_of[i]) or overwritten.intersection(names.tensor_outs[i])
            if touches:
                members.add(i)
                if i < write and overwritten.intersection(reads_of[i]):
                    first_readers.setdefault(write, []).append(i)
        for i in list(members):  # merge with the groups of other writes these ops touch
            members |= group_of.get(i, set())
        for i in members:
            group_of[i] = members
        pinned |= members
    return pinned, first_readers, {i: tuple(sorted(group)) for i, group in group_of.items()}


def prologue_names(schedule: CopySchedule, built) -> frozenset[str]:
    """The names the copies of ``schedule``'s prologue write in ``built`` (``build(schedule)``)."""
    bsyms = built.bound_symbols
    return frozenset(p.name for position in schedule.copy_positions()[:schedule.prologue]
                     for p in bsyms[position].flat_proxy_outs)


def build(schedule: CopySchedule):
    """The rewritten joint trace a schedule describes: each copy a ``BACKWARD`` bound symbol
    writing fresh names (``rc_<name>``, then ``rc_<name>_0``, ...), each reader switched to it."""
    trace = schedule.trace
    if not schedule.copies:
        return trace
    new = from_trace(trace)
    # A name set of its own: a rewrite that is tried and dropped leaves no names behind, and each
    # copy's name is found in one or two lookups (a counter per value).
    new.names = set(trace.names)
    copies_of: dict[str, int] = {}

    def copy_name(name: str) -> str:
        k = copies_of.get(name, -1)
        candidate = f"{COPY_PREFIX}{name}" if k < 0 else f"{COPY_PREFIX}{name}_{k}"
        while new.has_name(candidate):
            k += 1
            candidate = f"{COPY_PREFIX}{name}_{k}"
        copies_of[name] = k + 1
        return candidate

    outputs: list[dict] = []  # per copy: output name -> its new proxy

    def swap_for(bsym, sources: dict) -> dict:
        return {variableify(p): outputs[sources[p.name]][p.name] for p in bsym.flat_proxy_args if p.name in sources}

    new.bound_symbols = []
    for position, bsym in enumerate(trace.bound_symbols):
        for k in schedule.before.get(position, ()):
            i, inputs = schedule.copies[k]
            original = trace.bound_symbols[i]
            swap = swap_for(original, inputs)
            with tracectx(new):
                outs = {p.name: p.replace_name(copy_name(p.name)) for p in original.flat_proxy_outs}
            swap.update({variableify(p): outs[p.name] for p in original.flat_proxy_outs})
            copy = original.from_bsym_swap_proxies(swap, skip_inputs=False, skip_output=False, skip_subsymbols=False)
            copy.tags.add(BoundSymbolTag.BACKWARD)
            copy.tags.discard(BoundSymbolTag.RECOMPUTE_IN_BACKWARD)
            new.bound_symbols.append(copy)
            outputs.append(outs)
        reads = schedule.reads.get(position)
        if reads:
            bsym = bsym.from_bsym_swap_proxies(swap_for(bsym, reads), skip_inputs=False, skip_output=True,
                                               skip_subsymbols=False)
        new.bound_symbols.append(bsym)
    return new
