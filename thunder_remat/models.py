"""Small built-in models for the main job, tests and benchmarks (no weights to download).

``mlp``: Linear-GELU-Linear blocks. ``gpt``: pre-LayerNorm transformer blocks with causal
attention, GELU MLP and dropout. ``llama``: RMSNorm, rotary embeddings, SwiGLU MLP, no biases.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["ModelSpec", "MODEL_NAMES", "SIZES", "BUILDERS", "build_model", "example_batch"]

MODEL_NAMES = ("mlp", "gpt", "llama")


@dataclass(frozen=True)
class ModelSpec:
    n_layer: int
    n_embd: int
    n_head: int
    seq_len: int
    batch: int
    vocab: int = 64
    dropout: float = 0.0


SIZES = {
    "tiny": ModelSpec(n_layer=1, n_embd=16, n_head=2, seq_len=8, batch=2),
    "small": ModelSpec(n_layer=2, n_embd=64, n_head=4, seq_len=32, batch=4),
    "bench": ModelSpec(n_layer=6, n_embd=128, n_head=4, seq_len=64, batch=4),
    # Big enough that a GPU step's memory is activations, not allocator slack (about 1 GB saved).
    "medium": ModelSpec(n_layer=4, n_embd=512, n_head=8, seq_len=512, batch=8),
}


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        d = spec.n_embd
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(spec.n_layer)
        )

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


class CausalSelfAttention(nn.Module):
    def __init__(self, spec: ModelSpec, bias: bool = True) -> None:
        super().__init__()
        self.n_head = spec.n_head
        self.qkv = nn.Linear(spec.n_embd, 3 * spec.n_embd, bias=bias)
        self.proj = nn.Linear(spec.n_embd, spec.n_embd, bias=bias)

    def split_heads(self, x):
        b, t, c = x.shape
        return x.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)

    def forward(self, x, rope=None):
        b, t, c = x.shape
        q, k, v = (self.split_heads(z) for z in self.qkv(x).split(c, dim=2))
        if rope is not None:
            q, k = rope(q), rope(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class GPTBlock(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        d = spec.n_embd
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = CausalSelfAttention(spec)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.dropout = nn.Dropout(spec.dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.dropout(self.out(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.tok = nn.Embedding(spec.vocab, spec.n_embd)
        self.pos = nn.Embedding(spec.seq_len, spec.n_embd)
        self.blocks = nn.ModuleList(GPTBlock(spec) for _ in range(spec.n_layer))
        self.ln_f = nn.LayerNorm(spec.n_embd)
        self.head = nn.Linear(spec.n_embd, spec.vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class Rotary(nn.Module):
    def __init__(self, head_dim: int, seq_len: int) -> None:
        super().__init__()
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(seq_len).float(), inv)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x):
        t = x.shape[-2]
        x1, x2 = x[..., ::2], x[..., 1::2]
        cos, sin = self.cos[:t], self.sin[:t]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class LlamaBlock(nn.Module):
    def __init__(self, spec: ModelSpec, rope: Rotary) -> None:
        super().__init__()
        d, hidden = spec.n_embd, int(8 * spec.n_embd / 3)
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.attn = CausalSelfAttention(spec, bias=False)
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)
        self.rope = rope

    def forward(self, x):
        x = x + self.attn(self.norm1(x), rope=self.rope)
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.tok = nn.Embedding(spec.vocab, spec.n_embd)
        rope = Rotary(spec.n_embd // spec.n_head, spec.seq_len)
        self.blocks = nn.ModuleList(LlamaBlock(spec, rope) for _ in range(spec.n_layer))
        self.norm = RMSNorm(spec.n_embd)
        self.head = nn.Linear(spec.n_embd, spec.vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


BUILDERS = {"mlp": MLP, "gpt": GPT, "llama": Llama}


def build_model(name: str = "gpt", size: str = "tiny", *, dropout: float | None = None, seed: int = 0) -> nn.Module:
    """A freshly initialised model; the same name, size and seed give the same weights."""
    if name not in BUILDERS:
        raise ValueError(f"model must be one of {list(MODEL_NAMES)}, got {name!r}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {list(SIZES)}, got {size!r}")
    spec = SIZES[size]
    if dropout is not None:
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        spec = ModelSpec(**{**spec.__dict__, "dropout": dropout})
    torch.manual_seed(seed)
    model = BUILDERS[name](spec)
    model.spec = spec
    return model


def example_batch(model: nn.Module, *, seed: int = 1) -> torch.Tensor:
    """An input batch that fits ``model`` (token ids for gpt/llama, activations for mlp)."""
    spec: ModelSpec = model.spec
    g = torch.Generator().manual_seed(seed)
    if isinstance(model, MLP):
        return torch.randn(spec.batch, spec.seq_len, spec.n_embd, generator=g)
    return torch.randint(0, spec.vocab, (spec.batch, spec.seq_len), generator=g)
