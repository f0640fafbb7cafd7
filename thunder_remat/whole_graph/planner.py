"""Choose what the forward saves: minimum cuts over the whole forward, under a memory budget.

Plain data in (``SaveProblem``), plain data out (``SavePlan``); no thunder import.

The flow network has two nodes per forward value, ``in`` and ``out``, joined by an edge whose
capacity is the storage bytes saving it keeps alive (inputs cost nothing, they are held anyway; a
view may not be saved at all: its base is saved instead, or the view is made again in the
backward, which costs nothing). Each operation links its inputs' ``out`` to its outputs' ``in``
with uncuttable edges. The source feeds the ``in`` of every input and of every value whose
producer may not be recomputed (banned); the ``out`` of every value the backward reads feeds the
sink. A minimum cut is the cheapest set of values to save: everything between the cut and the
backward is recomputed there.

Bans come from policies. *Hard* bans (random without exact replay, in place, collectives, Thunder's
``DONT_RECOMPUTE_IN_BACKWARD``) always hold. *Soft* bans (matmuls, small reductions) hold in the
fastest plan; under a tight budget a knapsack decides which of them to keep: each soft-banned op
kept costs its output bytes and spares its recompute time. A second family of plans weighs
recompute directly: with a price ``w`` per unit of recompute cost, each op's value pays
``w * cost`` when it ends up recomputed (an edge from the source), so one min cut minimizes
``saved bytes + w * recompute``; a sweep of prices traces the lower hull of the trade-off. The
plans of both families, plus the fastest and the smallest, form a Pareto frontier; a budget picks
the plan with the least recompute whose saved bytes fit, so saved bytes never grow as the budget
falls.

Neither family lands on every byte count: a budget between two frontier plans would otherwise get
the lower one and leave the difference unused. So the gap the budget falls in is filled first,
from the plan just above it: that plan with each one of its kept soft bans dropped, two chains
that drop them one after another (smallest outputs first; least recompute per byte first) down to
the plan below, and knapsacks whose capacity steps through the gap (see ``PlanSearch.gap_plans``). The
filling depends only on the gap, not on where in it the budget lies, so saved bytes still never
grow as the budget falls.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from thunder_remat.solvers.split_network import SplitNetwork, ValueNetwork
from thunder_remat.whole_graph.problem import ForwardOp, SaveProblem
from thunder_remat.budget import Budget, BudgetKind
from thunder_remat.solvers.knapsack import solve_knapsack
from thunder_remat.solvers.maxflow import CutResult, FlowNetwork, cut_from_source_side

__all__ = ["SavePlan", "SaveNetworks", "Frontier", "BudgetChoice", "PlanSearch", "build_frontier",
           "choose_fastest", "is_fastest_budget", "target_bytes"]

log = logging.getLogger(__name__)

#: knapsack capacities tried between the smallest and the fastest plan
FRONTIER_STEPS = 16
#: recompute prices tried (geometric, spanning the ops' bytes-per-cost ratios)
PRICE_STEPS = 24
#: knapsack capacities tried inside the gap a budget falls in
GAP_STEPS = 16


@dataclass(frozen=True)
class SavePlan:
    """One choice of saved values."""

    #: values the forward saves and the backward reads (inputs included), sorted by name
    saved: tuple[str, ...]
    #: forward ops (indices into ``SaveProblem.ops``) the backward runs again, in forward order
    recomputed: tuple[int, ...]
    #: bytes of saved values that are not inputs (the activations held between forward and backward)
    saved_bytes: int
    #: estimated cost of the recomputation (sum of the recomputed ops' flop estimates)
    recompute_cost: float
    #: ops kept from being recomputed: the soft bans this plan keeps (above the fastest plan, also
    #: ops a peak budget with room saves to spare their recompute: ``PlanSearch.plans_above_fastest``)
    kept_bans: frozenset[int]
    #: the cut's value: saved bytes + price * recompute cost
    cut_value: float
    #: price per unit of recompute cost the cut was solved with (0: bytes only)
    price: float = 0.0
    #: the cut itself: which nodes of ``SaveNetworks`` were on the source side (``np.packbits``), so
    #: a drawing shows this cut without solving it again
    source_side: bytes = field(default=b"", repr=False, compare=False)

    @property
    def key(self) -> tuple:
        return (self.saved, self.recomputed)


@dataclass(frozen=True)
class Frontier:
    """The plans a budget chooses from, sorted by saved bytes (ascending)."""

    plans: tuple[SavePlan, ...]
    fastest: SavePlan
    smallest: SavePlan
    solve_ms: float
    #: the networks of the problem the plans solve; with them, a budget between two plans fills
    #: their gap (``PlanSearch``)
    networks: SaveNetworks | None = field(default=None, repr=False, compare=False)
    #: the knapsack solver the plans were found with
    solver: str = "dp"

    @property
    def problem(self) -> SaveProblem | None:
        return None if self.networks is None else self.networks.problem


@dataclass(frozen=True)
class BudgetChoice:
    plan: SavePlan
    #: the byte target the budget stood for (None: no budget, the fastest plan)
    target_bytes: int | None
    feasible: bool
    #: the plans chosen from; None when the budget asked for the fastest plan, which needs no frontier
    frontier: Frontier | None = field(default=None, repr=False)
    #: the networks ``plan`` was solved on (its cut: ``networks.cut_of(plan)``)
    networks: SaveNetworks | None = field(default=None, repr=False, compare=False)
    #: the plan above whose saved values are the only ones ``plan`` may save, when it was chosen
    #: nested within that plan's rewrite (``frontier_walk``); None: chosen from the whole frontier
    within: SavePlan | None = field(default=None, repr=False)


def is_fastest_budget(budget) -> bool:
    return budget is None or (BudgetKind(budget[0]) is BudgetKind.FRACTION and budget[1] == 1.0)


def choose_fastest(problem: SaveProblem, budget) -> BudgetChoice:
    """The fastest plan, for budget None or 1.0, with one min cut instead of a whole frontier."""
    networks = SaveNetworks(problem)
    plan = networks.plan({op.index for op in _soft_banned(problem)})
    return BudgetChoice(plan, None if budget is None else plan.saved_bytes, True, None, networks)


def _soft_banned(problem: SaveProblem) -> list[ForwardOp]:
    return [op for op in problem.ops if op.soft_ban and not op.hard_ban]


def _knapsack_plans(solved: _Solved, capacities, solver: str) -> list[SavePlan]:
    """One plan per capacity: the soft bans a knapsack keeps within that many bytes of their
    outputs (keeping the most recompute cost), as a min cut."""
    problem = solved.networks.problem
    soft = _soft_banned(problem)
    weights = [float(problem.storage_bytes(op.outputs)) for op in soft]
    values = [op.cost for op in soft]
    plans = []
    for capacity in capacities:
        kept = solve_knapsack(values, weights, capacity, solver).kept
        plans.append(solved.plan({soft[i].index for i in kept}))
    return plans


class _Solved:
    """The plans one search has solved, by (kept bans, price): a search asks for some twice (a
    knapsack keeps a set a chain already reached); they are freed with the search."""

    def __init__(self, networks: SaveNetworks) -> None:
        self.networks, self.plans = networks, {}

    def plan(self, kept_bans, price: float = 0.0) -> SavePlan:
        key = (frozenset(kept_bans), price)
        if key not in self.plans:
            self.plans[key] = self.networks.plan(kept_bans, price)
        return self.plans[key]


class SaveNetworks:
    """Every flow network of one problem, on one set of edges: the budget search solves hundreds
    of cuts that differ only in which soft bans hold and in the recompute price, so the edges any
    of them may use are laid out once and each cut only sets capacities (an edge a cut does not
    use has none).

    ``plan(kept_bans, price)``: the plan of the ``problem`` with ``kept_bans`` soft bans in force.
    A kept ban gives its op's outputs their saved bytes and an edge from the source. ``price`` > 0
    also charges ``price * op cost`` for every op left on the recompute side (an edge source -> the
    in-node of its first output; its other outputs are tied to that node, so a multi-output op is
    charged once and recomputed whole).
    """

    def __init__(self, problem: SaveProblem) -> None:
        self.problem = problem
        names = sorted(problem.values)
        self.names = tuple(names)
        split = SplitNetwork(names)
        self.split = split
        self.source, self.sink = split.source, split.sink
        self.labels = split.labels()
        producer = problem.producer_of()
        self.op_cost = {op.index: op.cost for op in problem.ops}
        self.op_indices = sorted(self.op_cost)
        position = {index: k for k, index in enumerate(self.op_indices)}
        #: per value (in node order): where in ``op_indices`` the op that makes it is, -1 for inputs
        self.value_op = np.array([position[producer[n].index] if n in producer else -1 for n in names],
                                 dtype=np.int64)
        #: per op a kept soft ban can make banned: (value edge, source edge, bytes if saved) per output
        self.bannable: dict[int, list[tuple[int, int, float]]] = {}
        ban_sources, priced = [], []
        must_save = set(problem.must_save)

        for name in names:
            value = problem.values[name]
            op = producer.get(name)
            if value.is_input or op is None:
                split.available(name)
                split.value(name, 0.0)
                continue
            # A view is not saved: its base is, or the backward makes it again (for free). Only a
            # view whose op may not run again (or a write's output: the data its storage now holds)
            # is saved, at the bytes of the storage it keeps alive. An overwritten value never is,
            # nor one a nested problem leaves out (``problem.nested_within``).
            saved_bytes = float(value.held_bytes) if problem.may_save(name) else math.inf
            free_bytes = math.inf if (op.force_recompute or value.maybe_view) and op.writes is None else saved_bytes
            if op.hard_ban is not None or name in must_save:  # available from the forward as it is
                split.value(name, saved_bytes)
                split.available(name)
            else:
                split.value(name, free_bytes)
                ban_sources.append((op.index, name, saved_bytes))
                if op.cost > 0.0:
                    priced.append((op.index, op.cost, name, op.outputs[0]))
            split.made_from(sorted(set(op.inputs)), name)
            if op.writes is not None:
                split.made_with(op.writes, name)
        for name in sorted(set(problem.needed_by_backward)):
            split.needed(name)
        self.value_edge = split.value_edge
        self.shared_edges = len(split.edges)
        # edges only some cuts use, with no capacity until a cut gives them one
        for op_index, name, saved_bytes in ban_sources:
            source_edge = split.available(name, 0.0)
            self.bannable.setdefault(op_index, []).append((self.value_edge[name], source_edge, saved_bytes))
        price_edges, price_costs, price_ops, tie_edges, tie_ops = [], [], [], [], []
        for op_index, cost, name, first in priced:
            if name == first:
                price_edges.append(split.available(name, 0.0))
                price_costs.append(cost)
                price_ops.append(op_index)
            else:
                node, first_node = split.in_node(name), split.in_node(first)
                tie_edges += [split.edge(first_node, node, 0.0), split.edge(node, first_node, 0.0)]
                tie_ops += [op_index, op_index]
        self.price_edges, self.price_costs, self.price_ops = (np.array(price_edges, dtype=np.int64),
                                                              np.array(price_costs, dtype=float),
                                                              np.array(price_ops, dtype=np.int64))
        self.tie_edges, self.tie_ops = np.array(tie_edges, dtype=np.int64), np.array(tie_ops, dtype=np.int64)
        self.base_capacities = np.array(split.capacities, dtype=float)
        self.solver = split.cut_solver()

    def capacities(self, kept_bans, price: float = 0.0) -> np.ndarray:
        """Every edge's capacity with ``kept_bans`` in force and ``price`` charged."""
        kept = sorted(frozenset(kept_bans) & self.bannable.keys())
        caps = self.base_capacities.copy()
        for op_index in kept:
            for value_edge, source_edge, saved_bytes in self.bannable[op_index]:
                caps[value_edge] = saved_bytes
                caps[source_edge] = math.inf
        if price > 0.0:
            charged = ~np.isin(self.price_ops, kept)
            caps[self.price_edges[charged]] = price * self.price_costs[charged]
            caps[self.tie_edges[~np.isin(self.tie_ops, kept)]] = math.inf
        return caps

    def network(self, kept_bans, price: float = 0.0) -> ValueNetwork:
        """The plain record of one network (for drawings and checks; ``plan`` needs none): the
        shared edges and the other edges this cut gives a capacity."""
        caps = self.capacities(kept_bans, price)
        used = np.flatnonzero((np.arange(len(caps)) < self.shared_edges) | (caps > 0)).tolist()
        network = FlowNetwork(len(self.labels), tuple(self.solver.edges[e] for e in used),
                              tuple(caps[used].tolist()), self.source, self.sink)
        return ValueNetwork(network, self.labels, self.value_edge)

    def plan(self, kept_bans, price: float = 0.0) -> SavePlan:
        return self.plan_from_cut(self.solver.cut(self.capacities(kept_bans, price)), kept_bans, price)

    def plan_from_cut(self, cut: CutResult, kept_bans, price: float = 0.0) -> SavePlan:
        problem = self.problem
        if not cut.is_finite:
            stale = sorted(set(problem.needed_by_backward) & problem.overwritten)
            why = (f"; the backward reads {', '.join(stale)} from before an in-place write overwrote its storage "
                   "(Thunder alone hands the backward the overwritten data: check the gradients)") if stale else ""
            raise ValueError("no finite cut: a value the backward reads can neither be saved nor recomputed" + why)
        decided = self.split.decode(cut)
        saved = [self.names[i] for i in np.flatnonzero(decided.crossing).tolist()]
        made_again = np.zeros(len(self.op_indices), dtype=bool)
        made_again[self.value_op[decided.made_again & (self.value_op >= 0)]] = True
        # the ints of the problem's own op indices: the plans kept share them (hundreds, at depth)
        recomputed = [self.op_indices[k] for k in np.flatnonzero(made_again).tolist()]
        return SavePlan(
            saved=tuple(saved),
            recomputed=tuple(recomputed),
            saved_bytes=problem.storage_bytes(saved),
            recompute_cost=float(sum(map(self.op_cost.__getitem__, recomputed))),
            kept_bans=frozenset(kept_bans),
            cut_value=cut.value,
            price=price,
            source_side=np.packbits(cut.source_mask).tobytes(),
        )

    def cut_of(self, plan: SavePlan) -> tuple[ValueNetwork, CutResult]:
        """The network ``plan`` was solved on and its stored cut (``plan`` must come from here)."""
        network = self.network(plan.kept_bans, plan.price)
        mask = np.unpackbits(np.frombuffer(plan.source_side, dtype=np.uint8), count=len(self.labels)).astype(bool)
        return network, cut_from_source_side(network.network, mask)


def recompute_prices(problem: SaveProblem, steps: int = PRICE_STEPS) -> list[float]:
    """Prices per unit of recompute cost worth trying: a geometric grid from a quarter of the
    smallest to four times the largest bytes-per-cost ratio of a recomputable op (below the
    smallest, every op is cheaper to recompute than to save; above the largest, none is)."""
    ratios = [
        problem.storage_bytes(op.outputs) / op.cost
        for op in problem.ops
        if op.hard_ban is None and op.cost > 0 and problem.storage_bytes(op.outputs) > 0
    ]
    if not ratios or steps < 2:
        return []
    low, high = min(ratios) / 4.0, max(ratios) * 4.0
    return [low * (high / low) ** (k / (steps - 1)) for k in range(steps)]


def build_frontier(problem: SaveProblem, solver: str = "dp", steps: int = FRONTIER_STEPS) -> Frontier:
    """The fastest plan, the smallest plan, and knapsack and priced plans between them, Pareto-filtered."""
    start = time.perf_counter()
    soft = _soft_banned(problem)
    networks = SaveNetworks(problem)
    solved = _Solved(networks)
    fastest = solved.plan({op.index for op in soft})
    smallest = solved.plan(set())
    plans = {fastest.key: fastest, smallest.key: smallest}
    if soft and fastest.saved_bytes > smallest.saved_bytes:
        total = sum(problem.storage_bytes(op.outputs) for op in soft)
        for plan in _knapsack_plans(solved, (total * k / steps for k in range(1, steps)), solver):
            plans.setdefault(plan.key, plan)
        for price in recompute_prices(problem):
            plan = solved.plan(set(), price)
            plans.setdefault(plan.key, plan)
    # The fastest plan (budget 1.0, one min cut) anchors the top of the frontier: a plan that saves
    # more, or recomputes less, would make a smaller budget save more or recompute less than 1.0.
    in_range = [p for p in plans.values() if p is smallest or (
        p.saved_bytes <= fastest.saved_bytes and p.recompute_cost >= fastest.recompute_cost)]
    if len(in_range) < sum(p.saved_bytes <= fastest.saved_bytes for p in plans.values()):
        log.debug("a priced plan beats the fastest plan on both bytes and recompute; it is not offered")
    pareto = _pareto(in_range)
    return Frontier(tuple(pareto), fastest, smallest, (time.perf_counter() - start) * 1e3, networks, solver=solver)


class PlanSearch:
    """Chooses plans from one frontier: the one object of the solve stage that runs min cuts after
    the frontier is built (to fill the gap a budget falls in, once per gap). The pass owns one per
    compilation and hands what it chose to the later stages as records (``BudgetChoice``, the
    anchor plans of ``anchor_plans``); no record refers back to it.
    """

    def __init__(self, frontier: Frontier) -> None:
        self.frontier = frontier
        #: plans found filling gaps, by the index of the plan above the gap
        self._gaps: dict[int, tuple[SavePlan, ...]] = {}
        self._above: tuple[SavePlan, ...] | None = None

    @property
    def gaps(self) -> dict[int, tuple[SavePlan, ...]]:
        """The gaps filled so far: the index of the plan above each -> the plans found in it."""
        return dict(self._gaps)

    def plans_above_fastest(self) -> tuple[SavePlan, ...]:
        """Plans that save more than the fastest plan and recompute less, by saved bytes ascending
        (solved once per search): a peak budget with room above the fastest plan's peak takes the
        least recompute that fits, which a fraction never offers (1.0 is the fastest plan).

        Every soft ban of the fastest plan kept, and each op left recomputed charged ``price *
        cost``, for the prices of ``recompute_prices``: the highest charges more than saving any
        op's outputs costs, so the last plan recomputes only what costs nothing (views). Those are
        the corners of the trade-off; between two of them, a chain from the one that recomputes more
        bans its ops the other does not recompute, most recompute spared per byte first, in up to
        ``GAP_STEPS`` steps (``_fill_above``). Pareto plans only.
        """
        if self._above is None:
            frontier = self.frontier
            fastest, networks = frontier.fastest, frontier.networks
            found: dict = {}
            if networks is not None:
                solved = _Solved(networks)
                corners = {fastest.key: fastest}
                for price in recompute_prices(networks.problem):
                    plan = solved.plan(fastest.kept_bans, price)
                    corners.setdefault(plan.key, plan)
                corners = _pareto(corners.values())
                for lower, upper in zip(corners, corners[1:]):
                    for plan in (lower, upper, *_fill_above(solved, lower, upper)):
                        found.setdefault(plan.key, plan)
            self._above = tuple(_pareto(p for p in found.values() if p.saved_bytes > fastest.saved_bytes
                                        and p.recompute_cost < fastest.recompute_cost))
            log.debug("%d plans above the fastest plan", len(self._above))
        return self._above

    def gap_plans(self, target: int) -> tuple[SavePlan, ...]:
        """The Pareto plans strictly between the two frontier plans around ``target`` bytes (none
        without a problem, or when ``target`` is below the smallest or at or above the largest plan).

        From the plan above the gap: the plan with one of its kept soft bans dropped (budgets just
        below it; the ``GAP_STEPS`` bans with the smallest outputs); two chains that drop them one
        after another until a plan saves no more than the one below the gap - smallest outputs first
        (small steps down), and least recompute per byte of output first (the cheapest bytes first,
        for budgets further down); and ``GAP_STEPS`` knapsacks whose capacity steps from the upper
        plan's kept bytes down by the gap's width, which may also swap one kept ban for another.
        ``GAP_STEPS`` single drops, two chains as long as the drops it takes to cross the gap, and
        ``GAP_STEPS`` knapsacks and cuts; computed once per gap. (A chain that cuts only every few
        drops misses plans: on the 6-layer GPT the 0.2 plan that makes the best backward checkpoints.)
        """
        frontier = self.frontier
        plans = frontier.plans
        if frontier.problem is None or not plans or target < plans[0].saved_bytes or target >= plans[-1].saved_bytes:
            return ()
        upper = next(k for k, p in enumerate(plans) if p.saved_bytes > target)
        if upper not in self._gaps:
            start = time.perf_counter()
            low, high = plans[upper - 1].saved_bytes, plans[upper].saved_bytes
            found = _fill(frontier.networks, plans[upper], low, frontier.solver)
            # A plan recomputing less than the upper plan would let a budget in this gap recompute
            # less than one above it; like plans beating the fastest, it is not offered. Of the rest
            # only the Pareto plans are kept: one another beats on both bytes and recompute is never
            # the cheapest that fits (about half of a gap's plans at 32 layers).
            least = plans[upper].recompute_cost
            self._gaps[upper] = tuple(_pareto(p for p in found if low < p.saved_bytes < high
                                              and p.recompute_cost >= least))
            log.debug("filled the gap %d..%d B with %d plans in %.1f ms", low, high, len(self._gaps[upper]),
                      (time.perf_counter() - start) * 1e3)
        return self._gaps[upper]

    def choose(self, budget) -> BudgetChoice:
        """The plan with the least recompute that fits the budget; if none fits, the smallest plan.

        ``budget`` is ``None`` (fastest plan), a ``Budget`` (or the tuple ``(kind, amount)``): a
        fraction in [0, 1] or bytes.
        """
        frontier = self.frontier
        target = target_bytes(frontier, budget)
        if is_fastest_budget(budget):
            return BudgetChoice(frontier.fastest, target, True, frontier, frontier.networks)
        fitting = [p for p in frontier.plans if p.saved_bytes <= target]
        if fitting and fitting[-1].saved_bytes < target:
            # the gap above the largest plan that fits holds plans that may fit too; when that plan
            # saves exactly the target (budget 0.0: the smallest plan), none of them can
            fitting += [p for p in self.gap_plans(target) if p.saved_bytes <= target]
        if not fitting:
            return BudgetChoice(frontier.plans[0], target, False, frontier, frontier.networks)
        best = min(fitting, key=lambda p: (p.recompute_cost, p.saved_bytes, p.key))
        return BudgetChoice(best, target, True, frontier, frontier.networks)

    def choose_capped(self, budget, ceiling: int) -> BudgetChoice:
        """``choose`` for a fraction budget (None: 1.0) whose scale runs from the smallest plan to
        the fastest plan saving at most ``ceiling`` bytes (never below the smallest plan)."""
        fraction = 1.0 if budget is None else float(budget[1])
        low, high = self.frontier.smallest.saved_bytes, self.frontier.fastest.saved_bytes
        top = min(high, max(ceiling, low))
        if top >= high:
            return self.choose(Budget.fraction(fraction))
        target = int(math.floor(low + fraction * (top - low) + 1e-9))
        return self.choose(Budget.bytes(target))

    def anchor_plans(self, fractions) -> dict[float, SavePlan]:
        """The plan each budget fraction chooses, for the checkpoint stage's anchors (which then
        needs no min cut of its own)."""
        return {float(f): self.choose(Budget.fraction(f)).plan for f in fractions}


def _fill(networks: SaveNetworks, upper: SavePlan, floor_bytes: int, solver: str) -> list[SavePlan]:
    problem = networks.problem
    ops = {op.index: op for op in problem.ops}

    def size(index):
        return problem.storage_bytes(ops[index].outputs)

    def smallest_first(index):
        return (size(index), index)

    def cheapest_per_byte_first(index):
        return (ops[index].cost / size(index) if size(index) else math.inf, index)

    solved = _Solved(networks)
    found = {}
    # one ban dropped: the smallest outputs first, they land just below the upper plan
    for index in sorted(sorted(upper.kept_bans, key=smallest_first)[:GAP_STEPS]):
        plan = solved.plan(upper.kept_bans - {index}, upper.price)
        found.setdefault(plan.key, plan)
    for order in (smallest_first, cheapest_per_byte_first):  # bans dropped one after another
        ordered = sorted(upper.kept_bans, key=order)
        kept = set(upper.kept_bans) - set(ordered[:1])  # the first drop alone is above
        for index in ordered[1:]:
            kept.discard(index)
            plan = solved.plan(kept, upper.price)
            if plan.saved_bytes <= floor_bytes:
                break
            found.setdefault(plan.key, plan)
    # knapsacks whose capacity steps through the gap (bans may also be swapped, not only dropped)
    top = sum(size(index) for index in upper.kept_bans)
    steps = (top - k * (upper.saved_bytes - floor_bytes) / (GAP_STEPS + 1) for k in range(1, GAP_STEPS + 1))
    for plan in _knapsack_plans(solved, (c for c in steps if c >= 0), solver):
        found.setdefault(plan.key, plan)
    return list(found.values())


def _fill_above(solved: _Solved, lower: SavePlan, upper: SavePlan) -> list[SavePlan]:
    """Plans between two corners of the trade-off above the fastest plan: ``lower`` with the ops it
    recomputes and ``upper`` does not banned (those with a cost and bytes of output), most
    recompute spared per byte first, cumulatively in up to ``GAP_STEPS`` steps, each a min cut at
    ``lower``'s price."""
    problem = solved.networks.problem
    ops = {op.index: op for op in problem.ops}
    size = {i: problem.storage_bytes(ops[i].outputs) for i in set(lower.recomputed) - set(upper.recomputed)}
    # a ban that spares no recompute, or saves no bytes (a view), is no step of its own
    order = sorted((i for i, n in size.items() if n > 0 and ops[i].cost > 0),
                   key=lambda i: (-ops[i].cost / size[i], i))
    step = max(1, math.ceil(len(order) / GAP_STEPS))
    return [solved.plan(lower.kept_bans | set(order[:k]), lower.price) for k in range(step, len(order), step)]


def _pareto(plans) -> list[SavePlan]:
    """Plans no other plan beats on both saved bytes and recompute, by bytes ascending."""
    ordered = sorted(plans, key=lambda p: (p.saved_bytes, p.recompute_cost, p.key))
    kept: list[SavePlan] = []
    for plan in ordered:
        if not kept or plan.recompute_cost < kept[-1].recompute_cost:
            kept.append(plan)
    return kept


def target_bytes(frontier: Frontier, budget) -> int | None:
    """Bytes a budget stands for: a fraction between the smallest and the fastest plan, or bytes."""
    if budget is None:
        return None
    kind, amount = budget
    if BudgetKind(kind) is BudgetKind.FRACTION:
        low, high = frontier.smallest.saved_bytes, frontier.fastest.saved_bytes
        return int(math.floor(low + amount * (high - low) + 1e-9))
    return int(amount)
