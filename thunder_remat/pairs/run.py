"""The fusion-pair pass: for every producer/consumer pair of fusion regions, a min cut decides
which values cross and which the consumer recomputes.

Pairs are visited in trace order (producer position, then consumer position). A pair whose
analysis, solve or rewrite fails is left untouched with a warning; if re-emitting a rewritten
region through its executor fails, the whole pass is abandoned and the input trace is returned.
Either way the program computes what it computed before.
"""

from __future__ import annotations

import enum
import logging
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from thunder_remat.config import RematConfig
from thunder_remat.pairs.analysis import build_pair_problem
from thunder_remat.pairs.rewrite import rewrite_pair
from thunder_remat.pairs.solve import solve_pair
from thunder_remat.records import PassResult, PassStatus, RematSession
from thunder_remat.trace_facts import TagReader, in_place_destination, is_backward_region, leaf_ops

__all__ = ["PairStatus", "PairRecord", "PairPassResult", "find_fusion_pairs", "rematerialize_fusion_pairs"]

log = logging.getLogger(__name__)


class PairStatus(enum.Enum):
    #: the consumer now recomputes some of the producer's values
    REWRITTEN = "rewritten"
    #: the cut hands over what the consumer read before
    UNCHANGED = "unchanged"
    #: analysis, solve or rewrite failed for this pair (``failure`` says why); it is left as it was
    FAILED = "failed"
    #: a forward region feeding a backward one while the whole-graph pass chose what the forward
    #: saves (recomputing in the backward region would change that choice), or any region feeding
    #: a backward one while a plan below the fastest placed the backward's values and estimated
    #: its peak with these regions (recomputing would hold what the estimate did not count)
    KEPT_FOR_SAVE_PLAN = "kept: into a backward region, the whole-graph plan placed its values"


@dataclass(frozen=True)
class PairRecord:
    """What happened to one pair (kept for reports, drawings and tests)."""

    producer: str
    consumer: str
    status: PairStatus
    #: why the pair failed (status FAILED), else None
    failure: str | None = None
    cut_value: float = 0.0
    bytes_before: int = 0
    bytes_after: int = 0
    handed_over: tuple[str, ...] = ()
    recomputed: tuple[str, ...] = ()
    #: why the consumer recomputes ``recomputed`` (empty when it recomputes nothing)
    recompute_reason: str = ""
    #: the solved value network (``ValueNetwork``) and its CutResult, for drawings
    network: object = field(default=None, repr=False, compare=False)
    cut: object = field(default=None, repr=False, compare=False)

    def summary(self) -> dict:
        """The record as plain data (``explain(...).to_dict()``): the decision, not the network."""
        return {"producer": self.producer, "consumer": self.consumer, "status": self.status.value,
                "failure": self.failure, "cut_value": self.cut_value, "bytes_before": self.bytes_before,
                "bytes_after": self.bytes_after, "handed_over": list(self.handed_over),
                "recomputed": list(self.recomputed)}


#: why a consumer region recomputes a producer's values: the pair's minimum cut
RECOMPUTED_IN_CONSUMER = "fewer bytes cross between the two regions (the pair's minimum cut)"


@dataclass
class PairPassResult(PassResult):
    """What the fusion-pair pass did (``PassResult``: status, failure, timings)."""

    STAGES: ClassVar[tuple[str, ...]] = ("analysis", "solve", "rewrite", "reemit")

    pairs: list[PairRecord] = field(default_factory=list)
    #: (region name, pieces) of every backward region cut so saved values die early (pairs.split)
    split_regions: list[tuple[str, int]] = field(default_factory=list)

    @property
    def bytes_before(self) -> int:
        return sum(p.bytes_before for p in self.pairs)

    @property
    def bytes_after(self) -> int:
        return sum(p.bytes_after for p in self.pairs)

    def provenance(self) -> str:
        rewritten = sum(p.status is PairStatus.REWRITTEN for p in self.pairs)
        t = self.timings
        text = (
            f"thunder_remat fusion-pair rematerialization (took {t.analysis_ms + t.solve_ms + t.rewrite_ms:.1f} ms, "
            f"re-emitting regions {t.reemit_ms:.1f} ms; "
            f"{len(self.pairs)} pairs visited, {rewritten} rewritten; "
            f"bytes crossing {self.bytes_before} -> {self.bytes_after})"
        )
        if self.split_regions:
            text += "; backward regions cut: " + ", ".join(f"{name} into {n}" for name, n in self.split_regions)
        if self.failure:
            text += f"; abandoned: {self.failure}"
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
    for bsym in leaf_ops(bsyms):
        name = getattr(in_place_destination(bsym), "name", None)
        if name is not None:
            writes[name] += 1
    return dict(writes)


def rematerialize_fusion_pairs(
    trace,
    config: RematConfig,
    *,
    adapter_for: Callable,
    finalize: Callable,
    session: RematSession = RematSession(),
) -> PairPassResult:
    """Run the pass on ``trace``.

    ``adapter_for(executor)`` gives the executor adapter (``can_fuse``, ``reemit``);
    ``finalize(trace, bsyms)`` builds the output trace (dead-code elimination included).
    ``session``: what the whole-graph pass decided for this compilation. With a plan
    (``saved_set_planned``) pairs from a forward region into a backward region are left as they
    are, so that the forward hands the backward exactly the plan's values; with a plan below the
    fastest (``planned_below_fastest``) pairs between backward regions too, so that the regions
    hold what the plan's peak estimate counted.
    """
    bsyms = list(trace.bound_symbols)
    result = PairPassResult(trace)
    timings = result.timings
    with timings.stage("analysis"):
        pairs = find_fusion_pairs(bsyms)
        readers = _readers(bsyms)
        written = _written_in_place(bsyms)
    if not pairs:
        return result
    tags_of = TagReader()
    changed: set[int] = set()

    for pi, ci in pairs:
        producer, consumer = bsyms[pi], bsyms[ci]
        consumer_reads = {p.name for p in consumer.flat_proxy_args}
        if not any(o.name in consumer_reads for o in producer.flat_proxy_outs):
            continue
        name = f"{producer.sym.name} -> {consumer.sym.name}"
        if is_backward_region(consumer) and (session.planned_below_fastest or (session.saved_set_planned
                                                                               and not is_backward_region(producer))):
            result.pairs.append(PairRecord(producer.sym.name, consumer.sym.name, PairStatus.KEPT_FOR_SAVE_PLAN))
            continue
        try:
            with timings.stage("analysis"):
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
                    policies=config.policies,
                    tags_of=tags_of,
                )
            with timings.stage("solve"):
                pair_network, cut, plan = solve_pair(problem)
            with timings.stage("rewrite"):
                rewritten = rewrite_pair(producer, consumer, plan, external_outputs=external, pinned=problem.pinned,
                                         crossing_bytes=problem.crossing_bytes)
        except Exception as exc:  # containment: a pair we cannot handle keeps Thunder's regions
            warnings.warn(f"thunder_remat: left fusion pair {name} untouched: {type(exc).__name__}: {exc}")
            result.pairs.append(PairRecord(producer.sym.name, consumer.sym.name, PairStatus.FAILED,
                                           failure=f"{type(exc).__name__}: {exc}"))
            continue
        status = PairStatus.REWRITTEN if rewritten.recomputed else PairStatus.UNCHANGED
        result.pairs.append(
            PairRecord(
                producer.sym.name,
                consumer.sym.name,
                status,
                None,
                cut.value,
                rewritten.bytes_before,
                rewritten.bytes_after,
                rewritten.handed_over,
                rewritten.recomputed,
                RECOMPUTED_IN_CONSUMER if rewritten.recomputed else "",
                network=pair_network,
                cut=cut,
            )
        )
        log.debug("pair %s: %s, cut %s, recomputed %s", name, status.value, cut.value, rewritten.recomputed)
        if not rewritten.recomputed:
            continue
        for i, new in ((pi, rewritten.producer), (ci, rewritten.consumer)):
            for p in bsyms[i].flat_proxy_args:
                readers[p.name].discard(i)
            for p in new.flat_proxy_args:
                readers[p.name].add(i)
            bsyms[i] = new
            changed.add(i)

    with timings.stage("reemit"):
        try:
            for i in sorted(changed):
                bsyms[i] = adapter_for(bsyms[i].sym.executor).reemit(bsyms[i])
            result.trace = finalize(trace, bsyms)
            result.status = PassStatus.REWRITTEN if changed else PassStatus.UNCHANGED
        except Exception as exc:
            warnings.warn(
                f"thunder_remat: re-emitting rewritten fusion regions failed ({type(exc).__name__}: {exc}); "
                "the fusion-pair pass is abandoned for this trace and Thunder's regions are kept"
            )
            result.fail(trace, f"{type(exc).__name__}: {exc}")
    return result
