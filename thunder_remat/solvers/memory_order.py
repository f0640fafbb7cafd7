"""Orders of a run of ops that hold fewer bytes at once, from plain data.

A trace runs its backward in the order autograd wrote it: the reverse of the forward, each
gradient made where its formula was emitted. Any topological order computes the same values, and
some hold less: an op whose output outweighs what it frees (an embedding's partial gradient,
summed only at the end) is better run just before its reader, and one that frees more than it
makes is better run as soon as it can. ``sunk_order``, ``least_peak_order``,
``least_peak_order_from_the_end`` and ``oldest_inputs_order`` are greedy orders; the caller
estimates each (with the fusion regions the executor will form, which this module does not see)
and keeps the lowest, the original order included.

Nodes are numbered in their current order; ``preds[i]``: the nodes ``i`` must follow. Storages are
named by strings; a storage a node reads that no node makes is alive when the run starts and is
freed after its last reader, unless ``kept`` (returned, or read after the run): those are never
freed. A storage made and never read is freed right after the node that makes it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

__all__ = ["OrderProblem", "least_peak_order", "least_peak_order_from_the_end", "locality_order",
           "lowest_greedy_order", "oldest_inputs_order", "renumbered", "smallest_first_depth_order", "sunk_order",
           "walk_peak"]


@dataclass(frozen=True)
class OrderProblem:
    """A run of ``len(preds)`` ops to order."""

    #: per node: the nodes it must follow
    preds: tuple[frozenset[int], ...]
    #: per node: the storages it reads
    reads: tuple[frozenset[str], ...]
    #: per node: the storages it allocates
    makes: tuple[frozenset[str], ...]
    #: storage -> bytes
    sizes: dict
    #: storages never freed in the run
    kept: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        n = len(self.preds)
        if len(self.reads) != n or len(self.makes) != n:
            raise ValueError("preds, reads and makes must have one entry per node")
        for i, before in enumerate(self.preds):
            if any(not 0 <= j < n or j == i for j in before):
                raise ValueError(f"node {i} must follow nodes of the run other than itself, got {sorted(before)}")


class _Liveness:
    """Bytes alive while an order is followed: readers left per storage, freed at the last."""

    def __init__(self, problem: OrderProblem) -> None:
        self.problem = problem
        self.readers_left: dict[str, int] = {}
        made = set()
        for reads, makes in zip(problem.reads, problem.makes):
            made.update(makes)
            for s in reads:
                self.readers_left[s] = self.readers_left.get(s, 0) + 1
        self.live = sum(problem.sizes.get(s, 0) for s in self.readers_left
                        if s not in made and s not in problem.kept)

    def step(self, i: int) -> tuple[int, int]:
        """(bytes alive while node ``i`` runs, bytes freed after it) if it ran now."""
        p = self.problem
        made = sum(p.sizes.get(s, 0) for s in p.makes[i])
        freed = 0
        for s in p.reads[i] | p.makes[i]:
            if s in p.kept:
                continue
            left = self.readers_left.get(s, 0) - (1 if s in p.reads[i] else 0)
            if left == 0:
                freed += p.sizes.get(s, 0)
        return self.live + made, freed

    def run(self, i: int) -> int:
        """Run node ``i``; the bytes alive while it ran."""
        during, freed = self.step(i)
        for s in self.problem.reads[i]:
            self.readers_left[s] -= 1
        self.live = during - freed
        return during


def walk_peak(problem: OrderProblem, order) -> int:
    """The most bytes alive at once (storages alive at the start included) following ``order``."""
    liveness = _Liveness(problem)
    peak = liveness.live
    for i in order:
        peak = max(peak, liveness.run(i))
    return peak


def _successors(problem: OrderProblem) -> list[list[int]]:
    succs: list[list[int]] = [[] for _ in problem.preds]
    for i, before in enumerate(problem.preds):
        for j in before:
            succs[j].append(i)
    return succs


def least_peak_order(problem: OrderProblem) -> list[int]:
    """Greedy: of the nodes whose predecessors have run, run one that does not raise the peak so
    far (at least what the run leaves alive at its end), the one leaving the fewest bytes alive;
    when every one raises it, the one raising it least. Ties go to the earlier node, so an order
    with nothing to gain is kept."""
    n = len(problem.preds)
    succs = _successors(problem)
    readers_of: dict[str, list[int]] = {}
    for i, reads in enumerate(problem.reads):
        for s in reads:
            readers_of.setdefault(s, []).append(i)
    waiting = [len(before) for before in problem.preds]
    ready = [i for i in range(n) if waiting[i] == 0]
    liveness = _Liveness(problem)
    # the kept storages the run makes are all alive at its end: the peak is at least that from the
    # start, so nodes that fit under it go by what they leave alive (what Inductor's LPMF does)
    made_kept = set().union(*problem.makes) & problem.kept if n else set()
    peak = liveness.live + sum(problem.sizes.get(s, 0) for s in made_kept)
    # per ready node: (bytes it allocates, bytes it allocates less bytes it frees); the live bytes
    # are common to all, so only these differ. A node's entry changes when a storage it reads
    # loses a reader.
    effect: dict[int, tuple[int, int]] = {}
    order: list[int] = []
    while ready:
        room = peak - liveness.live
        best, best_key = None, None
        for i in ready:
            if i not in effect:
                during, freed = liveness.step(i)
                effect[i] = (during - liveness.live, during - liveness.live - freed)
            made, change = effect[i]
            key = (0, change, i) if made <= room else (1, made, i)
            if best_key is None or key < best_key:
                best, best_key = i, key
        ready.remove(best)
        peak = max(peak, liveness.run(best))
        order.append(best)
        for s in problem.reads[best]:  # a node's effect changes when it becomes a storage's last reader
            if liveness.readers_left[s] == 1:
                for k in readers_of[s]:
                    effect.pop(k, None)
        for k in succs[best]:
            waiting[k] -= 1
            if waiting[k] == 0:
                ready.append(k)
    if len(order) != n:
        raise ValueError("the run's ordering constraints have a cycle")
    return order


def oldest_inputs_order(problem: OrderProblem) -> list[int]:
    """First in, first out: run next the node whose predecessors ran earliest (compared as sorted
    lists of their places in the order so far), so what a node makes is read soon after; ties go
    to the earlier node."""
    n = len(problem.preds)
    succs = _successors(problem)
    waiting = [len(before) for before in problem.preds]
    place: dict[int, int] = {}

    def key(i: int):
        return (sorted(place[j] for j in problem.preds[i]), i)

    heap = [(key(i), i) for i in range(n) if waiting[i] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        _, i = heapq.heappop(heap)
        place[i] = len(order)
        order.append(i)
        for k in succs[i]:
            waiting[k] -= 1
            if waiting[k] == 0:
                heapq.heappush(heap, (key(k), k))
    if len(order) != n:
        raise ValueError("the run's ordering constraints have a cycle")
    return order


def sunk_order(problem: OrderProblem) -> list[int]:
    """The current order, except that every node allocating more bytes than it frees there (it
    is the last reader of less than it makes) runs as late as it can: just before the first node
    that reads what it makes. Its inputs then live longer and its outputs shorter, by more bytes.
    A node making a ``kept`` storage (a gradient the backward returns) keeps its place: its
    output lives to the end anyway, and sunk to the end it would hold its inputs there."""
    n = len(problem.preds)
    succs = _successors(problem)
    last_reader: dict[str, int] = {}
    for i, reads in enumerate(problem.reads):
        for s in reads:
            last_reader[s] = i
    sizes = problem.sizes

    def sinks(i: int) -> bool:
        if problem.makes[i] & problem.kept:
            return False
        made = sum(sizes.get(s, 0) for s in problem.makes[i])
        freed = sum(sizes.get(s, 0) for s in problem.reads[i] if last_reader[s] == i and s not in problem.kept)
        return made > freed

    # placed from the end: a node is ready once everything after it that needs it is placed; a
    # sinking node is placed as soon as it is ready, the others latest first (their own order)
    waiting = [len(after) for after in succs]
    heap = [((0 if sinks(i) else 1), -i) for i in range(n) if waiting[i] == 0]
    heapq.heapify(heap)
    backwards: list[int] = []
    while heap:
        _, minus = heapq.heappop(heap)
        i = -minus
        backwards.append(i)
        for j in problem.preds[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(heap, ((0 if sinks(j) else 1), -j))
    if len(backwards) != n:
        raise ValueError("the run's ordering constraints have a cycle")
    return backwards[::-1]


def least_peak_order_from_the_end(problem: OrderProblem) -> list[int]:
    """``least_peak_order`` run backwards: the order is built from its last node, each time
    choosing, of the nodes whose successors are all placed, the one to run just before them.
    Placing a node there ends its outputs' lives and starts those of the inputs no later node
    reads; the choice is the one that does not raise the peak so far (seen from the end) and
    leaves the fewest bytes alive before it, else the one raising it least. A node whose outputs
    outweigh the inputs it starts goes late, with what it needs (the group that makes a partial
    gradient read only at the end). Ties go to the later node, so an order with nothing to gain
    is kept."""
    n = len(problem.preds)
    succs = _successors(problem)
    sizes, kept = problem.sizes, problem.kept
    readers_of: dict[str, list[int]] = {}
    for i, reads in enumerate(problem.reads):
        for s in reads:
            readers_of.setdefault(s, []).append(i)
    made_in_run = set().union(*problem.makes) if n else set()
    # alive just before the earliest node placed so far; kept storages made in the run are alive
    # from their maker to the end (those made before the run are alive throughout: not counted)
    alive = {s for s in kept if s in made_in_run}
    live = sum(sizes.get(s, 0) for s in alive)
    peak = live
    waiting = [len(after) for after in succs]
    ready = [i for i in range(n) if waiting[i] == 0]
    effect: dict[int, tuple[int, int]] = {}  # node -> (bytes alive while it runs, alive before it) less ``live``
    order: list[int] = []
    while ready:
        best, best_key = None, None
        for i in ready:
            if i not in effect:
                made = problem.makes[i]
                started = sum(sizes.get(s, 0) for s in problem.reads[i] if s not in alive and s not in kept)
                unread = sum(sizes.get(s, 0) for s in made if s not in alive)  # made and never read: transient
                ended = sum(sizes.get(s, 0) for s in made if s in alive)
                effect[i] = (started + unread, started - ended)
            during, change = effect[i]
            key = (0, change, -i) if live + during <= peak else (1, during, -i)
            if best_key is None or key < best_key:
                best, best_key = i, key
        ready.remove(best)
        during, change = effect.pop(best)
        peak = max(peak, live + during)
        live += change
        entered = [s for s in problem.reads[best] if s not in alive and s not in kept]
        alive.difference_update(problem.makes[best])
        alive.update(entered)
        for s in (*entered, *problem.makes[best]):
            for k in readers_of.get(s, ()):
                effect.pop(k, None)
        order.append(best)
        for j in problem.preds[best]:
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)
    if len(order) != n:
        raise ValueError("the run's ordering constraints have a cycle")
    return order[::-1]


def smallest_first_depth_order(problem: OrderProblem) -> list[int]:
    """Depth first: visit the nodes smallest first (the bytes a node allocates and reads), each
    after its predecessors, visited smallest first too; ties go to the earlier node."""
    weight = [sum(problem.sizes.get(s, 0) for s in problem.makes[i] | problem.reads[i])
              for i in range(len(problem.preds))]
    done: set[int] = set()
    order: list[int] = []
    for root in sorted(range(len(problem.preds)), key=lambda i: (weight[i], i)):
        stack = [(root, False)]
        while stack:  # iterative, so a long chain does not hit the recursion limit
            i, expanded = stack.pop()
            if i in done:
                continue
            if expanded:
                done.add(i)
                order.append(i)
                continue
            stack.append((i, True))
            for j in sorted(problem.preds[i], key=lambda j: (weight[j], j), reverse=True):
                if j not in done:
                    stack.append((j, False))
    return order


def lowest_greedy_order(problem: OrderProblem) -> list[int]:
    """Of the current order, ``least_peak_order``, ``oldest_inputs_order`` and
    ``smallest_first_depth_order``, the one with the lowest ``walk_peak`` (the earliest of these on
    a tie): the choice Inductor's ``reorder_for_peak_memory`` makes among the same kinds of orders
    of a region's kernels (torch 2.11), to estimate a region whose order Inductor chooses."""
    best = list(range(len(problem.preds)))
    best_peak = walk_peak(problem, best)
    for order_of in (least_peak_order, oldest_inputs_order, smallest_first_depth_order):
        order = order_of(problem)
        peak = walk_peak(problem, order)
        if peak < best_peak:
            best, best_peak = order, peak
    return best


def locality_order(problem: OrderProblem) -> list[int]:
    """Each node just before its first successor, placed from the end (Inductor's
    ``reorder_for_locality`` FX pass on a region's graph, torch 2.11): walking back from the run's
    end, a node whose successors all come at or after the node being visited moves right before
    it, and is visited next. A node making a ``kept`` storage (read after the run) counts the
    run's end as a successor, so such nodes gather at the end (so does a node making nothing, a
    view, that reads a kept storage, and then what makes it). A node making more than one
    storage stays (in the FX graph its outputs are separate nodes, which do not move)."""
    n = len(problem.preds)
    succs = _successors(problem)
    # a node making nothing (a view) that reads a kept storage stands for the view the end returns
    to_end = [bool(makes & problem.kept) or (not makes and bool(reads & problem.kept))
              for reads, makes in zip(problem.reads, problem.makes)]
    head, end = -1, n  # end: the run's end, what returns the kept storages
    prev = {i: i - 1 for i in range(n + 1)}  # the order as a linked list, head to end
    after = {i - 1: i for i in range(n + 1)}

    def unlink(i: int) -> None:
        after[prev[i]], prev[after[i]] = after[i], prev[i]

    def link_before(i: int, node: int) -> None:
        before_node = prev[node]
        after[before_node], prev[i] = i, before_node
        after[i], prev[node] = node, i

    seen: set[int] = set()
    node = end
    while node != head:
        seen.add(node)
        before = [i for i in range(n) if to_end[i]] if node == end else sorted(problem.preds[node])
        for p in before:
            if len(problem.makes[p]) > 1 or not all(k in seen for k in succs[p]) or (to_end[p] and end not in seen):
                continue
            unlink(p)
            link_before(p, node)
        node = prev[node]
    order, i = [], after[head]
    while i != end:
        order.append(i)
        i = after[i]
    return order


def renumbered(problem: OrderProblem, order: list[int]) -> OrderProblem:
    """``problem`` with its nodes numbered in ``order`` (a topological order of it): node ``k`` of
    the result is node ``order[k]``, so greedy orders break ties by ``order``."""
    place = {node: k for k, node in enumerate(order)}
    return OrderProblem(tuple(frozenset(place[j] for j in problem.preds[i]) for i in order),
                        tuple(problem.reads[i] for i in order), tuple(problem.makes[i] for i in order),
                        problem.sizes, problem.kept)
