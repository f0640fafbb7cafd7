"""Which forward ops may run again in the backward: policies as small, combinable values.

A policy is a frozen dataclass with one method, ``judge(op) -> Verdict | None``, over plain facts
about one forward op (``OpFacts``); no thunder import. Verdicts:

* ``hard``: never recompute (the budget cannot overrule it);
* ``soft``: prefer saving; a tight memory budget may recompute it anyway (knapsack);
* ``recompute``: never save, always recompute (Thunder's ``RECOMPUTE_IN_BACKWARD``).

Both passes judge by the same policies on the same facts (the tags come from one reader,
``trace_facts.TagReader``): the whole-graph pass never recomputes a hard verdict and lets a tight
budget overrule a soft one; the fusion-pair pass keeps both in the producer region (a consumer
region recomputes only what may run again freely). So a policy set that lets reductions run
again does so in both passes.

Hard verdicts win over soft ones, and the first reason found is the one reported. Policies hash
and compare by value, so a config holding them stays frozen and comparable. Write your own by
adding a frozen dataclass with a ``judge`` method; pass ``remat_policies=(...)``.

Some ops are never recomputed whatever the policies say (in-place updates, collectives, device
syncs): running them twice changes program state, or hangs another rank. See
``STRUCTURAL_HARD_BANS``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "OpFacts",
    "VerdictKind",
    "Verdict",
    "REPLAYABLE_RANDOM_OPS",
    "NeverRecomputeRandom",
    "NeverRecomputeMatmul",
    "NeverRecomputeContractions",
    "CONTRACTIONS",
    "contraction_kind",
    "KeepSmallReductions",
    "RespectThunderTags",
    "DEFAULT_POLICIES",
    "STRUCTURAL_HARD_BANS",
    "judge_op",
]

#: random ops that replay their random state exactly when run again (Thunder's philox-seeded uniform)
REPLAYABLE_RANDOM_OPS = frozenset({"uniform_philox"})

#: op tags (by name) whose ops are never recomputed, with the reason reported
STRUCTURAL_HARD_BANS = {
    "IN_PLACE": "in-place op (running it twice changes state)",
    "DEVICE_SYNC_OP": "device sync op",
    "COLLECTIVE": "collective (every rank must issue the same collectives)",
}


@dataclass(frozen=True)
class OpFacts:
    """What a policy may look at: the op's name, its tags (by name), sizes in bytes, and how many of
    its tensor inputs are constants the trace builds from nothing it is given (arange, full, ...)."""

    op: str
    tags: frozenset[str]
    output_bytes: int
    input_bytes: int
    constant_inputs: int = 0


class VerdictKind(enum.Enum):
    #: never recompute (no budget overrules it)
    HARD = "hard"
    #: prefer saving; a tight memory budget may recompute it anyway
    SOFT = "soft"
    #: never save, always recompute
    RECOMPUTE = "recompute"


@dataclass(frozen=True)
class Verdict:
    """A policy's judgement of one op; ``kind`` a ``VerdictKind`` (or its value: "hard", ...)."""

    kind: VerdictKind
    reason: str

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", VerdictKind(self.kind))
        except ValueError:
            raise ValueError(f"thunder_remat Verdict kind must be one of {[k.value for k in VerdictKind]}, "
                             f"got {self.kind!r}") from None


@dataclass(frozen=True)
class NeverRecomputeRandom:
    """Random ops draw new numbers when run again; only ops that replay their random state exactly
    (``replayable``: Thunder's philox-seeded uniform) may be recomputed."""

    replayable: frozenset[str] = REPLAYABLE_RANDOM_OPS

    def judge(self, op: OpFacts) -> Verdict | None:
        if "RANDOM_OP" in op.tags and op.op not in self.replayable:
            return Verdict(VerdictKind.HARD, "random op (recomputing draws different numbers)")
        return None


@dataclass(frozen=True)
class NeverRecomputeMatmul:
    """Matmuls, linear layers and attention cost far more to run again than to keep."""

    ops: frozenset[str] = frozenset({"linear", "matmul", "scaled_dot_product_attention", "sdpa"})
    hard: bool = False

    def judge(self, op: OpFacts) -> Verdict | None:
        if op.op in self.ops or "MATMUL_OP" in op.tags or "DONT_AUTO_RECOMPUTE_IN_BACKWARD" in op.tags:
            return Verdict(VerdictKind.HARD if self.hard else VerdictKind.SOFT, "matmul/linear/attention")
        return None


#: ops whose every output element is a sum of products over a contracted input dimension (a matmul's
#: inner size, a convolution's input channels times its kernel window, attention's keys), by the
#: names they carry in Thunder 0.2.6's traces: its prims and torch-level symbols, and the torch ops
#: it registers automatically (``torch.mm`` runs as ``spmm``, ``addmm``, ``conv_transpose2d``, ...),
#: which carry no ``MATMUL_OP`` tag. Their cost per output element grows with the model's width, so
#: they cost far more to run again than to keep; ``cost.op_flops`` prices each by its own rule.
#: Value: the kind a verdict names.
CONTRACTIONS = {
    **dict.fromkeys(("linear", "matmul", "mm", "spmm", "addmm", "mv", "addmv", "dot", "vdot", "inner"), "matmul"),
    **dict.fromkeys(("bmm", "baddbmm", "addbmm", "chain_matmul"), "batched matmul"),
    **dict.fromkeys(("_grouped_mm", "grouped_mm"), "grouped matmul"),
    **dict.fromkeys(("einsum", "tensordot", "bilinear"), "tensor contraction"),
    **dict.fromkeys(("convolution", "_convolution", "conv1d", "conv2d", "conv3d"), "convolution"),
    **dict.fromkeys(("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"), "transposed convolution"),
    **dict.fromkeys(("sdpa", "scaled_dot_product_attention"), "attention"),
}


def contraction_kind(name: str) -> str | None:
    """The kind of contraction op ``name`` is (``CONTRACTIONS``), or None.

    Also reads aten names (``torch.ops.aten.convolution.default``) and executor ops named after
    what they run (the CUDA sdpa executor's ``sdpaex_grad_forward_scaled_dot_product_...``)."""
    base = name.removeprefix("torch.ops.").removeprefix("aten.").removesuffix(".default")
    kind = CONTRACTIONS.get(base)
    if kind is not None:
        return kind
    if "scaled_dot_product" in base:
        return "attention"
    if "conv_transpose" in base:
        return "transposed convolution"
    if "convolution" in base:
        return "convolution"
    return None


@dataclass(frozen=True)
class NeverRecomputeContractions:
    """Convolutions, transposed convolutions, batched and grouped matmuls, einsum, and the matmuls
    torch runs without Thunder's ``MATMUL_OP`` tag (``mm``, ``addmm``, ...): each output element
    sums over a contracted dimension (``CONTRACTIONS``), so, like matmuls, they cost far more to run
    again than to keep. The verdict names the kind of op.

    A contraction with a constant operand is a fixed gather, not a learned map: Thunder 0.2.6 pools
    (``max_pool2d``, ``avg_pool2d``) by convolving with a one-hot kernel it builds, a few flops per
    output element. It is left to the cut, as Thunder's own fusion pass leaves it."""

    hard: bool = False

    def judge(self, op: OpFacts) -> Verdict | None:
        kind = contraction_kind(op.op)
        if kind is None or op.constant_inputs:
            return None
        return Verdict(VerdictKind.HARD if self.hard else VerdictKind.SOFT, f"{kind} (a contraction)")


@dataclass(frozen=True)
class KeepSmallReductions:
    """A reduction whose output is ``ratio`` times smaller than its input is cheap to keep."""

    ratio: float = 4.0

    def judge(self, op: OpFacts) -> Verdict | None:
        if "REDUCTION_OP" in op.tags and op.input_bytes >= self.ratio * max(op.output_bytes, 1):
            return Verdict(VerdictKind.SOFT, f"reduction with output {self.ratio:g}x smaller than its input")
        return None


@dataclass(frozen=True)
class RespectThunderTags:
    """Thunder's own markings: ``DONT_RECOMPUTE_IN_BACKWARD`` ops are kept, ``RECOMPUTE_IN_BACKWARD``
    ones (set by ``thunder.torch.checkpoint`` and ``auto_recompute_intermediates``) are recomputed."""

    def judge(self, op: OpFacts) -> Verdict | None:
        if "DONT_RECOMPUTE_IN_BACKWARD" in op.tags:
            return Verdict(VerdictKind.HARD, "tagged DONT_RECOMPUTE_IN_BACKWARD")
        if "RECOMPUTE_IN_BACKWARD" in op.tags:
            return Verdict(VerdictKind.RECOMPUTE, "tagged RECOMPUTE_IN_BACKWARD")
        return None


DEFAULT_POLICIES = (NeverRecomputeRandom(), NeverRecomputeMatmul(), NeverRecomputeContractions(), KeepSmallReductions(),
                    RespectThunderTags())


@dataclass(frozen=True)
class Judgement:
    """Every policy's verdict on one op, combined; what each pass reads of it is said here."""

    hard: str | None = None
    soft: str | None = None
    #: why the op is recomputed whatever the budget (a RECOMPUTE verdict, or a structural rule of
    #: the whole-graph pass: a ZeRO-3 re-gather, an op Thunder's split moves to the backward)
    recompute_reason: str | None = None

    @property
    def recompute(self) -> bool:
        return self.recompute_reason is not None

    @property
    def keeps_in_producer(self) -> str | None:
        """Why the fusion-pair pass keeps the op in its producer region (a consumer region
        recomputes only what may run again freely: neither a hard nor a soft verdict), or None.
        The whole-graph pass never recomputes ``hard`` and lets a tight budget overrule ``soft``."""
        return self.hard or self.soft


def judge_op(op: OpFacts, policies) -> Judgement:
    """Combine the structural bans and every policy's verdict on ``op``."""
    for tag, reason in STRUCTURAL_HARD_BANS.items():
        if tag in op.tags:
            return Judgement(hard=reason)
    hard = soft = recompute = None
    for policy in policies:
        verdict = policy.judge(op)
        if verdict is None:
            continue
        if verdict.kind is VerdictKind.HARD and hard is None:
            hard = verdict.reason
        elif verdict.kind is VerdictKind.SOFT and soft is None:
            soft = verdict.reason
        elif verdict.kind is VerdictKind.RECOMPUTE and recompute is None:
            recompute = verdict.reason
    # An explicit request to recompute (checkpoint) overrules a soft preference to save.
    recompute = recompute if hard is None else None
    return Judgement(hard=hard, soft=None if (hard or recompute) else soft, recompute_reason=recompute)


def check_policies(policies) -> tuple:
    """Validate a user's policies: a tuple of objects with a ``judge`` method, hashable."""
    if not isinstance(policies, (tuple, list)):
        raise ValueError(
            f"thunder_remat option 'remat_policies' must be a tuple of policies (objects with a judge(op) "
            f"method, e.g. thunder_remat.DEFAULT_POLICIES), got {policies!r}"
        )
    for p in policies:
        if not callable(getattr(p, "judge", None)):
            raise ValueError(
                f"thunder_remat option 'remat_policies': {p!r} has no judge(op) method; "
                f"use the policies in thunder_remat.policies or a frozen dataclass with judge()"
            )
        try:
            hash(p)
        except TypeError:
            raise ValueError(
                f"thunder_remat option 'remat_policies': {p!r} is not hashable; make it a frozen dataclass"
            ) from None
    return tuple(policies)
