"""Which forward ops may run again in the backward: policies as small, combinable values.

A policy is a frozen dataclass with one method, ``judge(op) -> Verdict | None``, over plain facts
about one forward op (``OpFacts``); no thunder import. Verdicts:

* ``hard``: never recompute (the budget cannot overrule it);
* ``soft``: prefer saving; a tight memory budget may recompute it anyway (knapsack);
* ``recompute``: never save, always recompute (Thunder's ``RECOMPUTE_IN_BACKWARD``).

Hard verdicts win over soft ones, and the first reason found is the one reported. Policies hash
and compare by value, so a config holding them stays frozen and comparable. Write your own by
adding a frozen dataclass with a ``judge`` method; pass ``remat_policies=(...)``.

Some ops are never recomputed whatever the policies say (in-place updates, collectives, device
syncs): running them twice changes program state, or hangs another rank. See
``STRUCTURAL_HARD_BANS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "OpFacts",
    "Verdict",
    "NeverRecomputeRandom",
    "NeverRecomputeMatmul",
    "KeepSmallReductions",
    "RespectThunderTags",
    "DEFAULT_POLICIES",
    "STRUCTURAL_HARD_BANS",
    "judge_op",
]

#: op tags (by name) whose ops are never recomputed, with the reason reported
STRUCTURAL_HARD_BANS = {
    "IN_PLACE": "in-place op (running it twice changes state)",
    "DEVICE_SYNC_OP": "device sync op",
    "COLLECTIVE": "collective (every rank must issue the same collectives)",
}


@dataclass(frozen=True)
class OpFacts:
    """What a policy may look at: the op's name, its tags (by name), and sizes in bytes."""

    op: str
    tags: frozenset[str]
    output_bytes: int
    input_bytes: int


@dataclass(frozen=True)
class Verdict:
    kind: str  # "hard" | "soft" | "recompute"
    reason: str


@dataclass(frozen=True)
class NeverRecomputeRandom:
    """Random ops draw new numbers when run again; only ops that replay their random state exactly
    (``replayable``: Thunder's philox-seeded uniform) may be recomputed."""

    replayable: frozenset[str] = frozenset({"uniform_philox"})

    def judge(self, op: OpFacts) -> Verdict | None:
        if "RANDOM_OP" in op.tags and op.op not in self.replayable:
            return Verdict("hard", "random op (recomputing draws different numbers)")
        return None


@dataclass(frozen=True)
class NeverRecomputeMatmul:
    """Matmuls, linear layers and attention cost far more to run again than to keep."""

    ops: frozenset[str] = frozenset({"linear", "matmul", "scaled_dot_product_attention", "sdpa"})
    hard: bool = False

    def judge(self, op: OpFacts) -> Verdict | None:
        if op.op in self.ops or "MATMUL_OP" in op.tags or "DONT_AUTO_RECOMPUTE_IN_BACKWARD" in op.tags:
            return Verdict("hard" if self.hard else "soft", "matmul/linear/attention")
        return None


@dataclass(frozen=True)
class KeepSmallReductions:
    """A reduction whose output is ``ratio`` times smaller than its input is cheap to keep."""

    ratio: float = 4.0

    def judge(self, op: OpFacts) -> Verdict | None:
        if "REDUCTION_OP" in op.tags and op.input_bytes >= self.ratio * max(op.output_bytes, 1):
            return Verdict("soft", f"reduction with output {self.ratio:g}x smaller than its input")
        return None


@dataclass(frozen=True)
class RespectThunderTags:
    """Thunder's own markings: ``DONT_RECOMPUTE_IN_BACKWARD`` ops are kept, ``RECOMPUTE_IN_BACKWARD``
    ones (set by ``thunder.torch.checkpoint`` and ``auto_recompute_intermediates``) are recomputed."""

    def judge(self, op: OpFacts) -> Verdict | None:
        if "DONT_RECOMPUTE_IN_BACKWARD" in op.tags:
            return Verdict("hard", "tagged DONT_RECOMPUTE_IN_BACKWARD")
        if "RECOMPUTE_IN_BACKWARD" in op.tags:
            return Verdict("recompute", "tagged RECOMPUTE_IN_BACKWARD")
        return None


DEFAULT_POLICIES = (NeverRecomputeRandom(), NeverRecomputeMatmul(), KeepSmallReductions(), RespectThunderTags())


@dataclass(frozen=True)
class Judgement:
    hard: str | None = None
    soft: str | None = None
    recompute: bool = False
    reasons: tuple[str, ...] = field(default=())


def judge_op(op: OpFacts, policies) -> Judgement:
    """Combine the structural bans and every policy's verdict on ``op``."""
    for tag, reason in STRUCTURAL_HARD_BANS.items():
        if tag in op.tags:
            return Judgement(hard=reason, reasons=(reason,))
    hard = soft = None
    recompute = False
    for policy in policies:
        verdict = policy.judge(op)
        if verdict is None:
            continue
        if verdict.kind == "hard" and hard is None:
            hard = verdict.reason
        elif verdict.kind == "soft" and soft is None:
            soft = verdict.reason
        elif verdict.kind == "recompute":
            recompute = True
    # An explicit request to recompute (checkpoint) overrules a soft preference to save.
    recompute = recompute and hard is None
    return Judgement(hard=hard, soft=None if (hard or recompute) else soft, recompute=recompute)


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
