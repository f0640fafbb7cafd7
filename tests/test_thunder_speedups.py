"""The linear-time stand-ins for Thunder 0.2.6's no-op-subsymbol pruning and Region membership
give exactly Thunder's results (executors/hooks/thunder_speedups.py), and act only where they should."""

import pytest
import thunder
import torch
from thunder.core.prims import OpTags
from thunder.core.symbol import BoundSymbol, Symbol
import thunder.core.transform_common as transform_common

from thunder_remat.executors.hooks import thunder_speedups
from thunder_remat.executors.hooks.compile_stash import speedups_marked
from thunder_remat.executors.eager import eager_fusion_ex
from thunder_remat.models import BUILDERS, ModelSpec
from thunder_remat.plugin import last_joint_trace

pytestmark = pytest.mark.jit

thunders_prune = transform_common._remove_noop_subsymbols.__wrapped__  # installed with thunder_remat


def node(name, *children, prim=True, tagged=False, output=None):
    sym = Symbol(name, meta=None, is_prim=prim, tags=(OpTags.DONT_DCE,) if tagged else None)
    return BoundSymbol(sym, (), {}, output, tuple(children))


def clone(bsym):
    return bsym.from_bsym(subsymbols=[clone(s) for s in bsym.subsymbols])


def shape(bsym):
    return (bsym.sym.name, tuple(shape(s) for s in bsym.subsymbols))


def pruned(bsym, prune):
    """The shape of a pruned copy (outside a compilation: Thunder's recursion stays Thunder's)."""
    copy = clone(bsym)
    prune(copy)
    return shape(copy)


def holder(*children):
    """A non-prim parent standing for a composite or fusion bound symbol."""
    return node("parent", *children, prim=False, output=1)


CASES = {
    # a non-prim leaf goes; a prim with no outputs goes unless the parent's tree carries DONT_DCE
    "untagged": holder(node("leaf", prim=False), node("no_outputs")),
    # the tagged leaf inside the first child is removed before the second child is looked at
    "tag removed deeper first": holder(node("child", node("tagged_leaf", prim=False, tagged=True)),
                                       node("no_outputs")),
    # ... and after it, when the order is the other way round
    "tag removed deeper later": holder(node("no_outputs"),
                                       node("child", node("tagged_leaf", prim=False, tagged=True))),
    # a tagged leaf removed at the parent's own level still counts until the parent's list is replaced
    "tag removed at this level": holder(node("tagged_leaf", prim=False, tagged=True), node("no_outputs")),
    "tag kept": holder(node("tagged_prim", tagged=True), node("no_outputs"), node("child", node("no_outputs"))),
    "nested": holder(node("a", node("b", node("leaf", prim=False), node("no_outputs"), output=2), output=3),
                     node("no_outputs")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_pruning_stand_in_removes_what_thunders_removes(case):
    assert pruned(CASES[case], thunder_speedups._prune_noop_subsymbols) == pruned(CASES[case], thunders_prune)


@pytest.fixture(scope="module")
def gpt_joint():
    spec = ModelSpec(n_layer=1, n_embd=16, n_head=2, seq_len=8, batch=2)
    torch.manual_seed(0)
    model = BUILDERS["gpt"](spec)
    jitted = thunder.jit(model, executors=[eager_fusion_ex], remat=True, remat_memory_budget=0.0)
    jitted(torch.randint(0, spec.vocab, (spec.batch, spec.seq_len))).sum().backward()
    return jitted, last_joint_trace(jitted)


def with_noops(bsym):
    """``bsym`` with a non-prim leaf and an output-less prim added below every composite."""
    subs = [with_noops(s) for s in bsym.subsymbols]
    if subs:
        subs[1:1] = [node("leaf", prim=False), node("no_outputs")]
    return bsym.from_bsym(subsymbols=subs)


def test_the_pruning_stand_in_matches_thunder_on_a_model_trace(gpt_joint):
    _, joint = gpt_joint
    bsyms = [with_noops(b) for b in joint.bound_symbols]
    ours = [pruned(b, thunder_speedups._prune_noop_subsymbols) for b in bsyms]
    assert ours == [pruned(b, thunders_prune) for b in bsyms]
    assert ours == [shape(b) for b in joint.bound_symbols]


def test_regions_have_thunders_inputs_and_outputs(gpt_joint):
    from thunder_remat.executors.hooks.builtin_pass import deferring_builds

    _, joint = gpt_joint
    transform = thunder.transform_for_execution.__wrapped__  # Thunder's, without thunder_remat's executor

    @thunder._with_cache_info_ctx
    def fuse():
        return transform(joint, [eager_fusion_ex], use_del_last_used=False)[-1]

    with deferring_builds():
        plain = fuse()
        with thunder_speedups.forced():
            fast = fuse()
    regions = [b for b in plain.bound_symbols if b.sym.is_fusion]
    assert regions, "no fusion region to compare"
    def code(trace):  # the printed trace without its provenance line (it carries a timing)
        return [line for line in str(trace).splitlines() if not line.startswith("# Constructed")]

    assert code(fast) == code(plain)


def test_the_stand_ins_act_only_where_thunder_remat_is_on(gpt_joint):
    jitted, _ = gpt_joint
    assert speedups_marked(jitted)
    plain = thunder.jit(torch.nn.Linear(2, 2), executors=[eager_fusion_ex])
    plain(torch.randn(3, 2)).sum().backward()
    assert not speedups_marked(plain)
    assert not thunder_speedups.active()
    with thunder_speedups.forced():
        assert thunder_speedups.active()
