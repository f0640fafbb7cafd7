"""The fusion-pair pass: for every producer/consumer pair of fusion regions, a min cut decides
which values cross and which the consumer recomputes.

Pairs are visited in trace order (producer position, then consumer position). A pair whose
analysis, solve or rewrite fails is left untouched with a warning; if re-emitting a rewritten
region through its executor fails, the whole pass is abandoned and the input trace is returned.
Either way the program computes what it computed before.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from thunder_remat.config import RematConfig
from thunder_remat.flow_graph import solve_pair
from thunder_remat.joint_analysis import in_place_destination, is_backward_region
from thunder_remat.pair_problem import TagCache, build_pair_problem
from thunder_remat.rewrite import rewrite_pair

__all__ = ["PairRecord", "PairPassResult", "find_fusion_pairs", "rematerialize_fusion_pairs"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PairRecord:
    """What happened to one pair (kept for reports and tests)."""

    producer: str
    consumer: str
    status: str  # "rewritten", "unchanged", "failed: <reason>" or SAVED_SET_PLANNED
    cut_value: float = 0.0
    bytes_before: int = 0
    bytes_after: int = 0
    handed_over: tuple[str, ...] = ()
    recomputed: tuple[str, ...] = ()
    #: the solved flow network (PairNetwork) and its CutResult, for drawings
    network: object = field(default=None, repr=False, compare=False)
    cut: object = field(default=None, repr=False, compare=False)


@dataclass
class PairPassResult:
    trace: object
    pairs: list[PairRecord] = field(default_factory=list)
    #: analysis, min cuts and rewrites
    solve_ms: float = 0.0
    #: rebuilding the changed regions through their executors
    reemit_ms: float = 0.0
    abandoned: str | None = None

    @property
    def bytes_before(self) -> int:
        return sum(p.bytes_before for p in self.pairs)

    @property
    def bytes_after(self) -> int:
        return sum(p.bytes_after for p in self.pairs)

    def provenance(self) -> str:
        rewritten = sum(p.status == "rewritten" for p in self.pairs)
        text = (
            f"thunder_remat fusion-pair rematerialization (took {self.solve_ms:.1f} ms, "
            f"re-emitting regions {self.reemit_ms:.1f} ms; "
            f"{len(self.pairs)} pairs visited, {rewritten} rewritten; "
            f"bytes crossing {self.bytes_before} -> {self.bytes_after})"
        )
        if self.abandoned:
            text += f"; abandoned: {self.abandoned}"
        return text


def find_fusion_pairs(bsyms) -> list[tuple[int, int]]:
    """(producer index, consumer index) for fusion regions where the consumer reads a producer output."""
    readers = _readers(bsyms)
    pairs = set()
    for i, bsym in enumerate(bsyms):
        if not bsym.sym.is_fusion:
            continue
        for out in bsym.flat_proxy_outs:
            for j in readers.get(out.name, ()):
                if j != i and bsyms[j].sym.is_fusion:
                    pairs.add((i, j))
    return sorted(pairs)


def _readers(bsyms) -> dict[str, set[int]]:
    readers: dict[str, set[int]] = defaultdict(set)
    for i, bsym in enumerate(bsyms):
        for p in bsym.flat_proxy_args:
            readers[p.name].add(i)
    return readers


def _written_in_place(bsyms) -> dict[str, int]:
    """How many in-place writes each value receives anywhere in the trace (as the destination)."""
    writes: dict[str, int] = defaultdict(int)

    def visit(bsym) -> None:
        if bsym.sym.is_fusion:
            for sub in bsym.subsymbols:
                visit(sub)
            return
        name = getattr(in_place_destination(bsym), "name", None)
        if name is not None:
            writes[name] += 1

    for bsym in bsyms:
        visit(bsym)
    return dict(writes)


#: status of a pair from a forward region into a backward one when the whole-graph pass chose
#: what the forward saves: recomputing in the backward region would change that choice
SAVED_SET_PLANNED = "kept: forward -> backward, the whole-graph plan chose what is saved"


def rematerialize_fusion_pairs(
    trace,
    config: RematConfig,
    *,
    adapter_for: Callable,
    finalize: Callable,
    saved_set_planned: bool = False,
) -> PairPassResult:
    """Run the pass on ``trace``.

    ``adapter_for(executor)`` gives the executor adapter (``can_fuse``, ``reemit``);
    ``finalize(trace, bsyms)`` builds the output trace (dead-code elimination included).
    ``saved_set_planned``: the whole-graph pass chose what the forward saves for this trace;
    pairs from a forward region into a backward region are then left as they are, so that the
    forward hands the backward exactly the plan's values.
    """
    start = time.perf_counter()
    bsyms = list(trace.bound_symbols)
    result = PairPassResult(trace)
    pairs = find_fusion_pairs(bsyms)
    if not pairs:
        result.solve_ms = (time.perf_counter() - start) * 1e3
        return result
    readers = _readers(bsyms)
    tags_of = TagCache()
    written = _written_in_place(bsyms)
    changed: set[int] = set()

    for pi, ci in pairs:
        producer, consumer = bsyms[pi], bsyms[ci]
        consumer_reads = {p.name for p in consumer.flat_proxy_args}
        if not any(o.name in consumer_reads for o in producer.flat_proxy_outs):
            continue
        name = f"{producer.sym.name} -> {consumer.sym.name}"
        if saved_set_planned and not is_backward_region(producer) and is_backward_region(consumer):
            result.pairs.append(PairRecord(producer.sym.name, consumer.sym.name, SAVED_SET_PLANNED))
            continue
        try:
            external = {o.name for o in producer.flat_proxy_outs if readers.get(o.name, set()) - {pi, ci}}
            same = producer.sym.executor is consumer.sym.executor
            consumer_adapter = adapter_for(consumer.sym.executor)
            problem = build_pair_problem(
                producer,
                consumer,
                external_outputs=external,
                written=written,
                consumer_can_fuse=consumer_adapter.can_fuse,
                same_executor=same,
                producer_input_discount=config.producer_input_discount,
                tags_of=tags_of,
                policies=config.policies,
            )
            pair_network, cut, plan = solve_pair(problem)
            rewritten = rewrite_pair(producer, consumer, plan, external_outputs=external, pinned=problem.pinned,
                                     crossing_bytes=problem.crossing_bytes)
        except Exception as exc:  # containment: a pair we cannot handle keeps Thunder's regions
            warnings.warn(f"thunder_remat: left fusion pair {name} untouched: {type(exc).__name__}: {exc}")
            result.pairs.append(PairRecord(producer.sym.name, consumer.sym.name, f"failed: {exc}"))
            continue
        status = "rewritten" if rewritten.recomputed else "unchanged"
        result.pairs.append(
            PairRecord(
                producer.sym.name,
                consumer.sym.name,
                status,
                cut.value,
                rewritten.bytes_before,
                rewritten.bytes_after,
                rewritten.handed_over,
                rewritten.recomputed,
                network=pair_network,
                cut=cut,
            )
        )
        log.debug("pair %s: %s, cut %s, recomputed %s", name, status, cut.value, rewritten.recomputed)
        if not rewritten.recomputed:
            continue
        for i, new in ((pi, rewritten.producer), (ci, rewritten.consumer)):
            for p in bsyms[i].flat_proxy_args:
                readers[p.name].discard(i)
            for p in new.flat_proxy_args:
                readers[p.name].add(i)
            bsyms[i] = new
            changed.add(i)

    result.solve_ms = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    try:
        for i in sorted(changed):
            bsyms[i] = adapter_for(bsyms[i].sym.executor).reemit(bsyms[i])
        result.trace = finalize(trace, bsyms)
    except Exception as exc:
        warnings.warn(
            f"thunder_remat: re-emitting rewritten fusion regions failed ({type(exc).__name__}: {exc}); "
            "the fusion-pair pass is abandoned for this trace and Thunder's regions are kept"
        )
        result.trace = trace
        result.abandoned = f"{type(exc).__name__}: {exc}"
    result.reemit_ms = (time.perf_counter() - start) * 1e3
    return result
