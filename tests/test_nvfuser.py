"""nvFuser adapter: runs only where Thunder 0.2.6 can execute nvFuser regions (not on the CPU CI
machine): a CUDA GPU and an nvFuser wheel that ships the ``nvfuser`` module (0.2.35 and earlier;
wheels with ``nvfuser_direct`` alone are exercised at trace level by tests/test_nvfuser_traces.py)."""

import pytest
import torch

from thunder_remat.executors.nvfuser import nvfuser_runs_regions

pytestmark = [pytest.mark.jit, pytest.mark.skipif(
    not nvfuser_runs_regions(),
    reason="needs a CUDA GPU and an nvFuser wheel with the nvfuser module (Thunder 0.2.6 runs regions through it)",
)]


@pytest.mark.parametrize("name", ["mlp", "gpt", "llama"])
def test_nvfuser_gradients_and_saved_bytes(name):
    import thunder

    from helpers import last_pairs
    from thunder_remat.inspect.measure import saved_for_backward
    from thunder_remat.models import build_model, example_batch

    runs = []
    for options in ({}, {"remat": True}):
        model = build_model(name, "tiny").cuda()
        x = example_batch(model).cuda()
        jm = thunder.jit(model, executors=[thunder.get_executor("nvfuser")], **options)
        out, saved = saved_for_backward(jm, x)
        out.float().pow(2).mean().backward()
        runs.append((jm, [p.grad for p in model.parameters()], saved))
    (_, g0, s0), (jm, g1, s1) = runs
    for a, b in zip(g0, g1):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
    assert s1.nbytes <= s0.nbytes
    assert last_pairs(jm).pairs
