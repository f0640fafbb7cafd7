"""A zoo of real model code, built from configs with random weights (nothing is downloaded).

Used by ``benchmarks/zoo.py`` and the tests to check thunder_remat on models it did not write:

* litgpt's ``GPT`` (``pip install --no-deps litgpt``): a Pythia (parallel residual, fused qkv),
  a LLaMA 3.2 (grouped-query attention, SwiGLU), a Phi-2 (parallel residual, partial rotary,
  biases) and a Falcon (multi-query attention), each shrunk to 2 layers and a small width;
* Hugging Face ``transformers`` (Thunder 0.2.6 supports up to 4.55.4): BERT and ViT encoders,
  and the causal LMs Llama, GPT-2 and Mistral. The causal LMs are called with a prebuilt 4-D
  causal mask: with ``attention_mask=None`` or a 2-D mask, 4.55's mask builder runs ``torch.vmap``,
  which Thunder 0.2.6 cannot trace (``InterpreterError ... 'wrapper_descriptor' object has no
  attribute '__self__'``); given a 4-D mask it uses it as it is;
* the built-in models (``thunder_remat.models``).

Dropout is off in every config, so that gradients can be compared with eager PyTorch exactly.
litgpt's package ``__init__`` imports ``lightning``; ``litgpt.config`` and ``litgpt.model`` are
imported without it (``_import_litgpt``).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["ZooModel", "ZOO", "zoo_model", "zoo_names", "available"]

#: batch shape of every language model in the zoo (batch, tokens)
BATCH, TOKENS = 2, 16
VOCAB = 128


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo: how to build it and call it."""

    name: str
    #: "litgpt", "transformers" or "built-in"
    family: str
    #: the package it needs (None: none beyond thunder_remat's own)
    requires: str | None
    build: Callable[[], torch.nn.Module]
    #: the keyword arguments of one call, made with a seeded generator
    inputs: Callable[[torch.Generator], dict]
    #: the model's output -> the tensor a loss is taken of
    output: Callable[[object], torch.Tensor]

    def make(self, seed: int = 0) -> tuple[torch.nn.Module, dict]:
        """The model with seeded random weights, and one batch of inputs for it."""
        torch.manual_seed(seed)
        model = self.build()
        return model, self.inputs(torch.Generator().manual_seed(seed + 1))


def available(entry: ZooModel) -> bool:
    return entry.requires is None or importlib.util.find_spec(entry.requires) is not None


def _import_litgpt():
    """``litgpt.config`` and ``litgpt.model`` without the package ``__init__`` (which needs
    ``lightning``); ``litgpt.model`` imports one checkpoint-conversion helper that also needs
    ``lightning`` and is only used to load weights, which the zoo never does."""
    if "litgpt.model" in sys.modules:
        return sys.modules["litgpt.config"], sys.modules["litgpt.model"]
    spec = importlib.util.find_spec("litgpt")
    if spec is None:
        raise ImportError("the litgpt zoo models need litgpt: pip install --no-deps litgpt")
    root = spec.submodule_search_locations[0]
    if "litgpt" not in sys.modules:
        package = types.ModuleType("litgpt")
        package.__path__ = [root]
        sys.modules["litgpt"] = package
    if "litgpt.scripts" not in sys.modules:
        scripts = types.ModuleType("litgpt.scripts")
        scripts.__path__ = [f"{root}/scripts"]
        sys.modules["litgpt.scripts"] = scripts
    if "litgpt.scripts.convert_hf_checkpoint" not in sys.modules:
        convert = types.ModuleType("litgpt.scripts.convert_hf_checkpoint")

        def qkv_reassemble(*args, **kwargs):
            raise NotImplementedError("thunder_remat's zoo builds litgpt models from configs; loading "
                                      "checkpoints needs the full litgpt package and lightning")

        convert.qkv_reassemble = qkv_reassemble
        sys.modules["litgpt.scripts.convert_hf_checkpoint"] = convert
    import litgpt.config
    import litgpt.model

    return litgpt.config, litgpt.model


def _litgpt(config_name: str, **shrink) -> Callable[[], torch.nn.Module]:
    def build():
        config, model = _import_litgpt()
        cfg = config.Config.from_name(config_name, n_layer=2, block_size=TOKENS, vocab_size=VOCAB,
                                      padded_vocab_size=VOCAB, **shrink)
        return model.GPT(cfg)

    return build


def _tokens(g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, TOKENS), generator=g)


def causal_mask(batch: int = BATCH, tokens: int = TOKENS, dtype=torch.float32) -> torch.Tensor:
    """The additive 4-D causal mask (batch, 1, tokens, tokens) a transformers causal LM takes as is."""
    mask = torch.full((tokens, tokens), torch.finfo(dtype).min, dtype=dtype).triu(1)
    return mask[None, None].expand(batch, 1, tokens, tokens).clone()


def _hf(model_class: str, config_class: str, **config) -> Callable[[], torch.nn.Module]:
    def build():
        import transformers

        cfg = getattr(transformers, config_class)(**config)
        cfg._attn_implementation = "sdpa"
        return getattr(transformers, model_class)(cfg)

    return build


_NO_DROPOUT_HF = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_DECODER = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64)


def _builtin(name: str, size: str) -> ZooModel:
    from thunder_remat import models

    def build():
        return models.build_model(name, size)

    def inputs(g):
        spec = models.SIZES[size]
        if name == "mlp":
            return {"x": torch.randn(spec.batch, spec.seq_len, spec.n_embd, generator=g)}
        return {"idx": torch.randint(0, spec.vocab, (spec.batch, spec.seq_len), generator=g)}

    return ZooModel(f"built-in {name} ({size})", "built-in", None, build, inputs, lambda out: out)


def _logits(out):
    return out.logits if hasattr(out, "logits") else out


ZOO: tuple[ZooModel, ...] = (
    ZooModel("litgpt pythia-14m", "litgpt", "litgpt",
             _litgpt("pythia-14m", n_embd=64, n_head=4, intermediate_size=128),
             lambda g: {"idx": _tokens(g)}, _logits),
    ZooModel("litgpt Llama-3.2-1B", "litgpt", "litgpt",
             _litgpt("Llama-3.2-1B", n_embd=64, n_head=4, n_query_groups=2, head_size=16, intermediate_size=128),
             lambda g: {"idx": _tokens(g)}, _logits),
    ZooModel("litgpt phi-2", "litgpt", "litgpt",
             _litgpt("phi-2", n_embd=64, n_head=4, n_query_groups=4, head_size=16, intermediate_size=128),
             lambda g: {"idx": _tokens(g)}, _logits),
    ZooModel("litgpt falcon-7b", "litgpt", "litgpt",
             _litgpt("falcon-7b", n_embd=64, n_head=4, n_query_groups=1, head_size=16, intermediate_size=128),
             lambda g: {"idx": _tokens(g)}, _logits),
    ZooModel("transformers BERT", "transformers", "transformers",
             _hf("BertModel", "BertConfig", vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128, max_position_embeddings=64, **_NO_DROPOUT_HF),
             lambda g: {"input_ids": _tokens(g)}, lambda out: out.last_hidden_state),
    ZooModel("transformers ViT", "transformers", "transformers",
             _hf("ViTModel", "ViTConfig", image_size=16, patch_size=4, num_channels=3, hidden_size=64,
                 num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, **_NO_DROPOUT_HF),
             lambda g: {"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g)}, lambda out: out.last_hidden_state),
    ZooModel("transformers Llama", "transformers", "transformers",
             _hf("LlamaForCausalLM", "LlamaConfig", **_DECODER),
             lambda g: {"input_ids": _tokens(g), "attention_mask": causal_mask(), "use_cache": False}, _logits),
    ZooModel("transformers GPT-2", "transformers", "transformers",
             _hf("GPT2LMHeadModel", "GPT2Config", vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
             lambda g: {"input_ids": _tokens(g), "attention_mask": causal_mask(), "use_cache": False}, _logits),
    ZooModel("transformers Mistral", "transformers", "transformers",
             _hf("MistralForCausalLM", "MistralConfig", sliding_window=None, **_DECODER),
             lambda g: {"input_ids": _tokens(g), "attention_mask": causal_mask(), "use_cache": False}, _logits),
    _builtin("gpt", "small"),
    _builtin("llama", "small"),
    _builtin("mlp", "small"),
)


def zoo_names() -> list[str]:
    return [entry.name for entry in ZOO]


def zoo_model(name: str) -> ZooModel:
    for entry in ZOO:
        if entry.name == name:
            return entry
    raise ValueError(f"zoo model must be one of {zoo_names()}, got {name!r}")
