"""Training setups beside the plain float32 step: frozen parameters (fine-tuning), bfloat16
weights, autocast and gradient accumulation over several steps.

Each is a way users train that changes the joint trace thunder_remat rewrites (a backward that
computes fewer gradients, other dtypes, casts between them, a compiled function run again): the
gradients must equal Thunder alone's, bit for bit where the executor runs the same kernels.
"""

import pytest
import thunder
import torch
from thunder.executors.torch_compile import torch_compile_ex

import thunder_remat
from thunder_remat.inspect.measure import saved_for_backward
from thunder_remat.models import build_model, example_batch
from thunder_remat.records import PassStatus

pytestmark = pytest.mark.jit

BUDGETS = (1.0, 0.0, "peak:1GB")


def _step(model, x, executors=(), steps=1, **options):
    """``steps`` forward-backward steps of the mean square of the output, gradients accumulated;
    returns the jitted function, each trainable parameter's gradient and what the last forward saved."""
    jm = thunder.jit(model, executors=list(executors), **options)
    saved = None
    for _ in range(steps):
        out, saved = saved_for_backward(jm, x)
        out.float().pow(2).mean().backward()
    return jm, [p.grad for p in model.parameters() if p.requires_grad], saved


def _frozen_llama():
    """The tiny LLaMA with every parameter frozen but the last block's up and down projections (a
    fine-tuning setup)."""
    model = build_model("llama")
    last = f"blocks.{len(model.blocks) - 1}."
    for name, p in model.named_parameters():
        p.requires_grad_(name in (last + "up.weight", last + "down.weight"))
    return model


def test_frozen_parameters_get_no_gradient_and_the_forward_saves_less():
    """Only the trainable parameters get gradients, equal to eager PyTorch's; the plan saves fewer
    activation bytes than the same model with every parameter trained, and never more than Thunder
    alone."""
    x = example_batch(build_model("llama"))
    eager_model = _frozen_llama()
    eager_model(x).float().pow(2).mean().backward()
    reference = [p.grad for p in eager_model.parameters() if p.requires_grad]
    _, _, alone = _step(_frozen_llama(), x)
    _, _, trained = _step(build_model("llama"), x, remat=True)
    for budget in BUDGETS:
        model = _frozen_llama()
        jm, grads, saved = _step(model, x, remat=True, remat_memory_budget=budget)
        assert thunder_remat.last_save_plan(jm).status is PassStatus.REWRITTEN
        assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
        assert len(grads) == 2 and all(torch.allclose(g, r, atol=1e-6, rtol=1e-5) for g, r in zip(grads, reference))
        # activations: the frozen parameters it hands over are held by the model anyway
        assert saved.activation_bytes <= alone.activation_bytes
        assert saved.activation_bytes < trained.activation_bytes, budget


@pytest.mark.parametrize("budget", BUDGETS)
def test_bfloat16_weights_give_thunder_alones_gradients(budget):
    """A model in bfloat16: recomputed values are the forward's bits, so the gradients equal Thunder
    alone's exactly with the torch executor."""
    x = example_batch(build_model("gpt"))
    _, alone, _ = _step(build_model("gpt").to(torch.bfloat16), x)
    jm, grads, _ = _step(build_model("gpt").to(torch.bfloat16), x, remat=True, remat_memory_budget=budget)
    assert thunder_remat.last_save_plan(jm).status is PassStatus.REWRITTEN
    assert all(g.dtype == torch.bfloat16 and torch.equal(g, a) for g, a in zip(grads, alone))


class _AutocastMLP(torch.nn.Module):
    """Two linears and a gated GELU between them under CPU bfloat16 autocast: the trace casts
    between float32 and bfloat16 around every op."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = torch.nn.functional.gelu(self.up(x))
            y = self.down(h * torch.sigmoid(h))
        return y.float().tanh()


def _autocast_mlp():
    torch.manual_seed(0)
    return _AutocastMLP()


@pytest.mark.parametrize("budget", BUDGETS)
def test_autocast_gives_thunder_alones_gradients(budget):
    """Under autocast the torch executor recomputes the same casts: the gradients equal Thunder alone's."""
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1))
    _, alone, _ = _step(_autocast_mlp(), x)
    jm, grads, _ = _step(_autocast_mlp(), x, remat=True, remat_memory_budget=budget)
    assert thunder_remat.last_save_plan(jm).status is PassStatus.REWRITTEN
    assert all(torch.equal(g, a) for g, a in zip(grads, alone))


def test_autocast_with_torch_compile_is_within_bfloat16_rounding():
    """Inductor computes a fused region's bfloat16 intermediates in float32 and rounds only what it
    writes (it does not emulate the casts), so a value recomputed in another region can differ in
    its last bfloat16 bit: the gradients stay within bfloat16 rounding of Thunder alone's (as
    Thunder alone's are of eager PyTorch's), at every budget."""
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1))
    _, alone, _ = _step(_autocast_mlp(), x, [torch_compile_ex])
    for budget in (1.0, 0.0):
        jm, grads, _ = _step(_autocast_mlp(), x, [torch_compile_ex], remat=True, remat_memory_budget=budget)
        assert thunder_remat.last_save_plan(jm).status is PassStatus.REWRITTEN
        for g, a in zip(grads, alone):
            assert (g - a).abs().max() <= 2 ** -6 * a.abs().max(), budget


def test_gradients_accumulate_over_steps_as_in_eager():
    """The compiled step run three times accumulates three steps' gradients, as eager PyTorch does."""
    x = example_batch(build_model("llama"))
    eager_model = build_model("llama")
    for _ in range(3):
        eager_model(x).float().pow(2).mean().backward()
    _, grads, _ = _step(build_model("llama"), x, steps=3, remat=True, remat_memory_budget=0.0)
    assert all(torch.allclose(g, p.grad, atol=1e-6, rtol=1e-5) for g, p in zip(grads, eager_model.parameters()))
