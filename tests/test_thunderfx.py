"""ThunderFX (``thunder.dynamo.thunderfx``): the remat options reach every Thunder subgraph."""

import pytest
import torch

import thunder_remat
from thunder_remat.inspect.measure import saved_for_backward
from thunder_remat.models import build_model, example_batch

pytestmark = [pytest.mark.jit, pytest.mark.inductor]


def test_thunderfx_passes_the_options_to_each_subgraph():
    from thunder.dynamo import thunderfx

    model = build_model("gpt", "tiny")
    x = example_batch(model)
    model(x).float().pow(2).mean().backward()
    reference = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)

    compiled = thunderfx(model, remat=True, remat_memory_budget=0.5)
    out, saved = saved_for_backward(compiled, x, held=list(model.parameters()))
    out.float().pow(2).mean().backward()
    for ref, p in zip(reference, model.parameters()):
        torch.testing.assert_close(p.grad, ref, atol=1e-5, rtol=1e-4)

    subgraphs = thunder_remat.thunderfx_subgraphs(compiled)
    plans = [thunder_remat.last_save_plan(fn) for fn in subgraphs]
    assert subgraphs and all(p is not None and p.failure is None for p in plans)
    assert all(p.budget == ("fraction", 0.5) for p in plans)
    assert saved.activation_bytes == sum(p.choice.plan.saved_bytes for p in plans)

    plain = build_model("gpt", "tiny")
    _, alone = saved_for_backward(thunderfx(plain), x, held=list(plain.parameters()))
    assert sum(thunder_remat.plugin.thunder_alone_saved_bytes(fn) for fn in subgraphs) == alone.activation_bytes
    assert saved.activation_bytes < alone.activation_bytes


def test_thunderfx_subgraphs_rejects_other_objects():
    with pytest.raises(TypeError, match="needs the result of thunder.dynamo.thunderfx"):
        thunder_remat.thunderfx_subgraphs(lambda x: x)
