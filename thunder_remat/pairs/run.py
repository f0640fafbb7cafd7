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
    #: regions Thunder fused across the forward/backward boundary, cut there (pairs.split)
    separated_regions: list[str] = field(default_factory=list)

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
        if self.separated_regions:
            text += "; cut where the forward ends: " + ", ".join(self.separated_regions)
        if self.split_regions:
            text += "; backward regions cut: " + ", ".join(f"{name} into {n}" for name, n in self.split_regions)
        if self.failure:
            text += f"; abandoned: {self.failure}"
        return text


def find_fusion_pairs(bsyms, readers: dict[str, set[int]] | None = None) -> list[tuple[int, int]]:
    """(producer index, consumer index) for fusion regions where the consumer reads a producer
    output; ``readers``: ``_readers(bsyms)`` when the caller has it."""
    readers = _readers(bsyms) if readers is None else readers
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
    """Value name -> positions of the bound symbols that read it."""
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


@dataclass
class _PairVisit:
    """What visiting the pairs of one trace works on: the bound symbols as rewritten so far, who
    reads each value, and what the pass's rules need of the trace."""

    bsyms: list
    readers: dict[str, set[int]]
    written: dict[str, int]
    config: RematConfig
    session: RematSession
    adapter_for: Callable
    tags_of: TagReader = field(default_factory=TagReader)
    changed: set[int] = field(default_factory=set)

    def replace(self, i: int, new) -> None:
        """Bound symbol ``i`` becomes ``new`` (the readers follow)."""
        for p in self.bsyms[i].flat_proxy_args:
            self.readers[p.name].discard(i)
        for p in new.flat_proxy_args:
            self.readers[p.name].add(i)
        self.bsyms[i] = new
        self.changed.add(i)

    def kept_for_save_plan(self, producer, consumer) -> bool:
        """The whole-graph plan placed what this pair's consumer reads (``RematSession``)."""
        if not is_backward_region(consumer):
            return False
        return self.session.planned_below_fastest or (self.session.saved_set_planned
                                                      and not is_backward_region(producer))


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
    result = PairPassResult(trace)
    with result.timings.stage("analysis"):
        bsyms = list(trace.bound_symbols)
        readers = _readers(bsyms)
        pairs = find_fusion_pairs(bsyms, readers)
        visit = _PairVisit(bsyms, readers, _written_in_place(bsyms), config, session, adapter_for)
    if not pairs:
        return result
    for pi, ci in pairs:
        record = _visit_pair(visit, pi, ci, result.timings)
        if record is not None:
            result.pairs.append(record)
    _reemit(visit, trace, finalize, result)
    return result


def _visit_pair(visit: _PairVisit, pi: int, ci: int, timings) -> PairRecord | None:
    """Solve and rewrite one pair in ``visit`` (None: the consumer no longer reads the producer,
    an earlier pair's rewrite took its reads). A pair that fails is left as it was."""
    producer, consumer = visit.bsyms[pi], visit.bsyms[ci]
    consumer_reads = {p.name for p in consumer.flat_proxy_args}
    if not any(o.name in consumer_reads for o in producer.flat_proxy_outs):
        return None
    names = dict(producer=producer.sym.name, consumer=consumer.sym.name)
    if visit.kept_for_save_plan(producer, consumer):
        return PairRecord(**names, status=PairStatus.KEPT_FOR_SAVE_PLAN)
    try:
        with timings.stage("analysis"):
            external = {o.name for o in producer.flat_proxy_outs if visit.readers.get(o.name, set()) - {pi, ci}}
            problem = build_pair_problem(
                producer,
                consumer,
                external_outputs=external,
                written=visit.written,
                consumer_can_fuse=visit.adapter_for(consumer.sym.executor).can_fuse,
                same_executor=producer.sym.executor is consumer.sym.executor,
                producer_input_discount=visit.config.producer_input_discount,
                policies=visit.config.policies,
                tags_of=visit.tags_of,
            )
        with timings.stage("solve"):
            pair_network, cut, plan = solve_pair(problem)
        with timings.stage("rewrite"):
            rewritten = rewrite_pair(producer, consumer, plan, external_outputs=external, pinned=problem.pinned,
                                     crossing_bytes=problem.crossing_bytes)
    except Exception as exc:  # containment: a pair we cannot handle keeps Thunder's regions
        failure = f"{type(exc).__name__}: {exc}"
        warnings.warn(f"thunder_remat: left fusion pair {names['producer']} -> {names['consumer']} untouched: "
                      f"{failure}")
        return PairRecord(**names, status=PairStatus.FAILED, failure=failure)
    status = PairStatus.REWRITTEN if rewritten.recomputed else PairStatus.UNCHANGED
    log.debug("pair %s -> %s: %s, cut %s, recomputed %s", names["producer"], names["consumer"], status.value,
              cut.value, rewritten.recomputed)
    if rewritten.recomputed:
        visit.replace(pi, rewritten.producer)
        visit.replace(ci, rewritten.consumer)
    return PairRecord(**names, status=status, cut_value=cut.value, bytes_before=rewritten.bytes_before,
                      bytes_after=rewritten.bytes_after, handed_over=rewritten.handed_over,
                      recomputed=rewritten.recomputed,
                      recompute_reason=RECOMPUTED_IN_CONSUMER if rewritten.recomputed else "",
                      network=pair_network, cut=cut)


def _reemit(visit: _PairVisit, trace, finalize: Callable, result: PairPassResult) -> None:
    """Re-emit every changed region through its executor and build the output trace; if that
    fails, the whole pass is abandoned (the input trace is kept)."""
    with result.timings.stage("reemit"):
        try:
            for i in sorted(visit.changed):
                visit.bsyms[i] = visit.adapter_for(visit.bsyms[i].sym.executor).reemit(visit.bsyms[i])
            result.trace = finalize(trace, visit.bsyms)
            result.status = PassStatus.REWRITTEN if visit.changed else PassStatus.UNCHANGED
        except Exception as exc:
            warnings.warn(
                f"thunder_remat: re-emitting rewritten fusion regions failed ({type(exc).__name__}: {exc}); "
                "the fusion-pair pass is abandoned for this trace and Thunder's regions are kept"
            )
            result.fail(trace, f"{type(exc).__name__}: {exc}")
