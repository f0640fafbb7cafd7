"""A zoo of real model code, built from configs with random weights (nothing is downloaded).

Used by ``benchmarks/zoo.py`` and the tests to check thunder_remat on models it did not write:

* litgpt's ``GPT`` (``pip install --no-deps litgpt``): a Pythia (parallel residual, fused qkv),
  a LLaMA 3.2 (grouped-query attention, SwiGLU), a Phi-2 (parallel residual, partial rotary,
  biases), a Falcon (multi-query attention) and a Gemma-2 (sliding-window attention on every
  other layer, its window shrunk to half the tokens; logit soft-capping, post-norms), each shrunk
  to 2 layers and a small width;
* Hugging Face ``transformers`` (Thunder 0.2.6 supports up to 4.55.4): BERT, RoBERTa, DistilBERT
  and ViT encoders, the causal LMs Llama, GPT-2, Mistral, BLOOM (ALiBi) and OPT (learned
  positions; also in ``eval()`` mode with gradients taken), the encoder-decoder T5 (given labels,
  its cross-entropy taken outside the model: ``_Seq2SeqLoss``), and the vision models Swin
  (shifted windows, patch merging), ResNet (convolutions, batch norm in training mode; its two
  pooling layers swapped for equivalents, ``_resnet``: with the zoo's executors Thunder 0.2.6 finds
  no gradient for ``adaptive_avg_pool2d`` and gives NaN gradients through a padded ``max_pool2d``) and
  ConvNeXt (depthwise convolutions, channels-last layer norm, layer scale). Llama, GPT-2 and
  Mistral are called with a prebuilt 4-D causal mask: with ``attention_mask=None`` or a 2-D mask,
  4.55's mask builder runs ``torch.vmap``, which Thunder 0.2.6 cannot trace (``InterpreterError
  ... 'wrapper_descriptor' object has no attribute '__self__'``); given a 4-D mask it uses it as
  it is. BLOOM and OPT build their masks without ``torch.vmap`` and are called without one;
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

__all__ = ["ZooShape", "ZOO_SHAPES", "ZooModel", "ZOO", "OUTSIDE", "zoo_model", "zoo_names", "available", "causal_mask",
           "ZooRun", "run_zoo_model", "eager_gradients", "WithLoss", "same_gradients"]

VOCAB = 128


@dataclass(frozen=True)
class ZooShape:
    """How big the zoo's models are made: every config is shrunk to this."""

    batch: int
    tokens: int
    width: int
    layers: int = 2

    @property
    def hidden(self) -> int:
        return 2 * self.width


#: "tiny" for the tests, "small" for the benchmark
ZOO_SHAPES = {"tiny": ZooShape(batch=2, tokens=8, width=32), "small": ZooShape(batch=2, tokens=16, width=64)}


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo: how to build it and call it."""

    name: str
    #: "litgpt", "transformers" or "built-in"
    family: str
    #: the package it needs (None: none beyond thunder_remat's own)
    requires: str | None
    build: Callable[[ZooShape], torch.nn.Module]
    #: the keyword arguments of one call, made with a seeded generator
    inputs: Callable[[ZooShape, torch.Generator], dict]
    #: the model's output -> the tensor a loss is taken of
    output: Callable[[object], torch.Tensor]
    #: where Thunder 0.2.6 itself cannot run the model (with or without thunder_remat): pairs of
    #: (executor name, or "*" for every executor; the start of the error Thunder raises)
    thunder_fails: tuple[tuple[str, str], ...] = ()

    def thunder_error(self, executor: str) -> str | None:
        """The error Thunder 0.2.6 alone raises on this model with ``executor``, or None if it runs."""
        return next((error for name, error in self.thunder_fails if name in ("*", executor)), None)

    def make(self, size: str = "small", seed: int = 0) -> tuple[torch.nn.Module, dict]:
        """The model with seeded random weights, and one batch of inputs for it."""
        if size not in ZOO_SHAPES:
            raise ValueError(f"zoo size must be one of {list(ZOO_SHAPES)}, got {size!r}")
        shape = ZOO_SHAPES[size]
        torch.manual_seed(seed)
        model = self.build(shape)
        return model, self.inputs(shape, torch.Generator().manual_seed(seed + 1))


def available(entry: ZooModel) -> bool:
    if entry.requires is None or entry.requires in sys.modules:
        return True
    try:  # litgpt imported without its __init__ (below) has no spec: it is in sys.modules then
        return importlib.util.find_spec(entry.requires) is not None
    except (ImportError, ValueError):
        return False


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


def _litgpt(config_name: str, query_groups: int | None,
            overrides: Callable[[ZooShape], dict] | None = None) -> Callable[[ZooShape], torch.nn.Module]:
    """A litgpt config shrunk to ``shape``: 4 heads (``query_groups`` key/value groups; None keeps
    one per head), the config's own block structure, norms, MLP and rotary settings; ``overrides``
    shrinks anything else the config sets (a sliding window)."""

    def build(shape: ZooShape):
        config, model = _import_litgpt()
        heads = 4
        cfg = config.Config.from_name(
            config_name, n_layer=shape.layers, n_embd=shape.width, n_head=heads,
            n_query_groups=query_groups or heads, head_size=shape.width // heads, intermediate_size=shape.hidden,
            block_size=shape.tokens, vocab_size=VOCAB, padded_vocab_size=VOCAB,
            **(overrides(shape) if overrides else {}))
        return model.GPT(cfg)

    return build


def _tokens(shape: ZooShape, g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, VOCAB, (shape.batch, shape.tokens), generator=g)


def causal_mask(batch: int, tokens: int, dtype=torch.float32) -> torch.Tensor:
    """The additive 4-D causal mask (batch, 1, tokens, tokens) a transformers causal LM takes as is."""
    mask = torch.full((tokens, tokens), torch.finfo(dtype).min, dtype=dtype).triu(1)
    return mask[None, None].expand(batch, 1, tokens, tokens).clone()


def _hf(model_class: str, config_class: str, config: Callable[[ZooShape], dict], attention: str | None = "sdpa",
        train: bool = True, aliases: bool = False):
    """A transformers model built from its config class (``attention``: the attention implementation
    asked for, None for a model with one implementation only; ``train`` False: in ``eval()`` mode,
    gradients still taken; ``aliases``: the config's ``attribute_map`` aliases stored as plain
    attributes, see below)."""

    def build(shape: ZooShape):
        import transformers

        cfg = getattr(transformers, config_class)(**config(shape))
        if attention is not None:
            cfg._attn_implementation = attention
        if aliases:
            # a config reads its aliases (DistilBERT's num_hidden_layers for n_layers) through its
            # class's __getattribute__, which Thunder 0.2.6's interpreter does not run: the traced
            # forward raises AttributeError: num_hidden_layers. Stored as plain attributes, they read.
            for alias, name in type(cfg).attribute_map.items():
                object.__setattr__(cfg, alias, getattr(cfg, name))
        model = getattr(transformers, model_class)(cfg)
        return model.train(train)

    return build


def _encoder(shape: ZooShape) -> dict:
    return dict(hidden_size=shape.width, num_hidden_layers=shape.layers, num_attention_heads=4,
                intermediate_size=shape.hidden, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _decoder(shape: ZooShape) -> dict:
    return dict(vocab_size=VOCAB, hidden_size=shape.width, intermediate_size=shape.hidden,
                num_hidden_layers=shape.layers, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=64)


def _causal_inputs(shape: ZooShape, g: torch.Generator) -> dict:
    return {"input_ids": _tokens(shape, g), "attention_mask": causal_mask(shape.batch, shape.tokens),
            "use_cache": False}


def _builtin(name: str) -> ZooModel:
    """A built-in model (``thunder_remat.models``) at the zoo's width and depth."""
    from thunder_remat import models

    def spec(shape: ZooShape) -> models.ModelSpec:
        return models.ModelSpec(n_layer=shape.layers, n_embd=shape.width, n_head=4, seq_len=shape.tokens,
                                batch=shape.batch, vocab=VOCAB)

    def build(shape):
        model = models.BUILDERS[name](spec(shape))
        model.spec = spec(shape)
        return model

    def inputs(shape, g):
        if name == "mlp":
            return {"x": torch.randn(shape.batch, shape.tokens, shape.width, generator=g)}
        return {"idx": _tokens(shape, g)}

    return ZooModel(f"built-in {name}", "built-in", None, build, inputs, lambda out: out)


def _gemma2(shape: ZooShape) -> dict:
    """Gemma-2's sliding window (every other layer, from the first) shrunk to half the tokens, so
    that it masks something."""
    return dict(sliding_window_size=max(2, shape.tokens // 2))


def _t5(shape: ZooShape) -> dict:
    return dict(vocab_size=VOCAB, d_model=shape.width, d_kv=shape.width // 4, d_ff=shape.hidden,
                num_layers=shape.layers, num_decoder_layers=shape.layers, num_heads=4, dropout_rate=0.0,
                relative_attention_num_buckets=8, relative_attention_max_distance=16, decoder_start_token_id=0,
                pad_token_id=0)


class _Seq2SeqLoss(torch.nn.Module):
    """A transformers encoder-decoder given labels, its cross-entropy taken here rather than in the
    model: given ``labels``, 4.55's ``T5ForConditionalGeneration.forward`` builds an
    ``nn.CrossEntropyLoss()`` module, and Thunder 0.2.6 cannot trace a module built inside the
    traced function (``AssertionError`` in ``process_recorded_modifications``, with or without
    thunder_remat). The decoder's inputs are the labels shifted right, as the model makes them."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels):
        out = self.model(input_ids=input_ids, decoder_input_ids=self.model._shift_right(labels), use_cache=False)
        return torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), labels.flatten())


def _seq2seq(build: Callable[[ZooShape], torch.nn.Module]) -> Callable[[ZooShape], torch.nn.Module]:
    return lambda shape: _Seq2SeqLoss(build(shape))


def _t5_inputs(shape: ZooShape, g: torch.Generator) -> dict:
    # labels from 1: none is the pad token (0), which the decoder's shifted inputs start with
    return {"input_ids": _tokens(shape, g), "labels": torch.randint(1, VOCAB, (shape.batch, shape.tokens), generator=g)}


def _opt(shape: ZooShape) -> dict:
    return dict(vocab_size=VOCAB, hidden_size=shape.width, word_embed_proj_dim=shape.width, ffn_dim=shape.hidden,
                num_hidden_layers=shape.layers, num_attention_heads=4, max_position_embeddings=64, dropout=0.0,
                attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0)


class _GlobalMeanPool(torch.nn.Module):
    """``nn.AdaptiveAvgPool2d((1, 1))`` as a mean over height and width (the same values).

    ``ResNetModel`` pools its last feature map with ``AdaptiveAvgPool2d``; with the zoo's executor
    lists (thunder_remat's light executor or Thunder's torch.compile executor given alone), Thunder
    0.2.6 finds no gradient for it, with or without thunder_remat: ``RuntimeError: Failed to find a
    gradient transform for bound symbol ... ltorch.adaptive_avg_pool2d(...)`` (Thunder's default
    executors run it). The zoo's ResNet pools with this instead, so that the rest of it is checked.
    """

    def forward(self, x):
        return x.mean((-2, -1), keepdim=True)


class _PaddedMaxPool(torch.nn.Module):
    """``nn.MaxPool2d(3, stride=2, padding=1)`` with its padding made explicit (the same values and
    gradients in PyTorch).

    With the zoo's executor lists, Thunder 0.2.6 differentiates a padded ``max_pool2d`` into NaN
    input gradients, with or without thunder_remat (its default executors do not): padded with the
    lowest finite float first and pooled without padding, the gradients are right.
    """

    def forward(self, x):
        x = torch.nn.functional.pad(x, (1, 1, 1, 1), value=torch.finfo(x.dtype).min)
        return torch.nn.functional.max_pool2d(x, 3, 2, 0)


def _resnet(build: Callable[[ZooShape], torch.nn.Module]) -> Callable[[ZooShape], torch.nn.Module]:
    """``ResNetModel`` with its two pooling layers swapped for equivalents Thunder 0.2.6 differentiates
    with the zoo's executors (``_PaddedMaxPool``, ``_GlobalMeanPool``)."""

    def resnet(shape: ZooShape):
        model = build(shape)
        model.embedder.pooler = _PaddedMaxPool()
        model.pooler = _GlobalMeanPool()
        return model

    return resnet


def _images(size: int):
    def inputs(shape: ZooShape, g: torch.Generator) -> dict:
        return {"pixel_values": torch.randn(shape.batch, 3, size, size, generator=g)}

    return inputs


def _logits(out):
    return out.logits if hasattr(out, "logits") else out


def _last_hidden(out):
    return out.last_hidden_state


ZOO: tuple[ZooModel, ...] = (
    ZooModel("litgpt pythia-14m", "litgpt", "litgpt", _litgpt("pythia-14m", None),
             lambda shape, g: {"idx": _tokens(shape, g)}, _logits),
    ZooModel("litgpt Llama-3.2-1B", "litgpt", "litgpt", _litgpt("Llama-3.2-1B", 2),
             lambda shape, g: {"idx": _tokens(shape, g)}, _logits),
    ZooModel("litgpt phi-2", "litgpt", "litgpt", _litgpt("phi-2", None),
             lambda shape, g: {"idx": _tokens(shape, g)}, _logits),
    ZooModel("litgpt falcon-7b", "litgpt", "litgpt", _litgpt("falcon-7b", 1),
             lambda shape, g: {"idx": _tokens(shape, g)}, _logits),
    ZooModel("transformers BERT", "transformers", "transformers",
             _hf("BertModel", "BertConfig", lambda shape: dict(vocab_size=VOCAB, max_position_embeddings=64,
                                                                **_encoder(shape))),
             lambda shape, g: {"input_ids": _tokens(shape, g)}, _last_hidden),
    ZooModel("transformers ViT", "transformers", "transformers",
             _hf("ViTModel", "ViTConfig", lambda shape: dict(image_size=16, patch_size=4, num_channels=3,
                                                              **_encoder(shape))),
             lambda shape, g: {"pixel_values": torch.randn(shape.batch, 3, 16, 16, generator=g)}, _last_hidden),
    ZooModel("transformers Llama", "transformers", "transformers",
             _hf("LlamaForCausalLM", "LlamaConfig", _decoder), _causal_inputs, _logits),
    ZooModel("transformers GPT-2", "transformers", "transformers",
             _hf("GPT2LMHeadModel", "GPT2Config", lambda shape: dict(
                 vocab_size=VOCAB, n_embd=shape.width, n_layer=shape.layers, n_head=4, n_positions=64,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
             _causal_inputs, _logits,
             thunder_fails=(("torchcompile", "torch._dynamo.exc.Unsupported: Unexpected type in sourceless builder"),)),
    ZooModel("transformers Mistral", "transformers", "transformers",
             _hf("MistralForCausalLM", "MistralConfig", lambda shape: dict(sliding_window=None, **_decoder(shape))),
             _causal_inputs, _logits),
    ZooModel("litgpt Gemma-2-2b", "litgpt", "litgpt", _litgpt("Gemma-2-2b", 2, _gemma2),
             lambda shape, g: {"idx": _tokens(shape, g)}, _logits),
    ZooModel("transformers T5", "transformers", "transformers",
             _seq2seq(_hf("T5ForConditionalGeneration", "T5Config", _t5, attention=None)), _t5_inputs,
             lambda out: out),
    ZooModel("transformers BLOOM", "transformers", "transformers",
             _hf("BloomForCausalLM", "BloomConfig", lambda shape: dict(
                 vocab_size=VOCAB, hidden_size=shape.width, n_layer=shape.layers, n_head=4, hidden_dropout=0.0,
                 attention_dropout=0.0), attention=None),
             lambda shape, g: {"input_ids": _tokens(shape, g), "use_cache": False}, _logits),
    # in training mode OPT's decoder draws a layer-drop probability and branches on it (even at
    # layerdrop 0), which Thunder 0.2.6 cannot trace; in eval() mode it does not draw
    ZooModel("transformers OPT", "transformers", "transformers", _hf("OPTForCausalLM", "OPTConfig", _opt),
             lambda shape, g: {"input_ids": _tokens(shape, g), "use_cache": False}, _logits,
             thunder_fails=(("*", "NotImplementedError: casting a TensorProxy to a Python boolean is not "
                                  "supported (data dependency)"),)),
    ZooModel("transformers OPT eval", "transformers", "transformers",
             _hf("OPTForCausalLM", "OPTConfig", _opt, train=False),
             lambda shape, g: {"input_ids": _tokens(shape, g), "use_cache": False}, _logits),
    ZooModel("transformers DistilBERT", "transformers", "transformers",
             _hf("DistilBertModel", "DistilBertConfig", lambda shape: dict(
                 vocab_size=VOCAB, max_position_embeddings=64, n_layers=shape.layers, n_heads=4, dim=shape.width,
                 hidden_dim=shape.hidden, dropout=0.0, attention_dropout=0.0), aliases=True),
             lambda shape, g: {"input_ids": _tokens(shape, g)}, _last_hidden),
    ZooModel("transformers RoBERTa", "transformers", "transformers",
             _hf("RobertaModel", "RobertaConfig", lambda shape: dict(vocab_size=VOCAB, max_position_embeddings=64,
                                                                      **_encoder(shape))),
             lambda shape, g: {"input_ids": _tokens(shape, g)}, _last_hidden),
    ZooModel("transformers Swin", "transformers", "transformers",
             _hf("SwinModel", "SwinConfig", lambda shape: dict(
                 image_size=16, patch_size=2, num_channels=3, embed_dim=shape.width // 2, depths=[2, 2],
                 num_heads=[2, 4], window_size=4, mlp_ratio=2.0, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0, drop_path_rate=0.0), attention=None),
             _images(16), _last_hidden),
    ZooModel("transformers ResNet", "transformers", "transformers",
             _resnet(_hf("ResNetModel", "ResNetConfig", lambda shape: dict(
                 num_channels=3, embedding_size=shape.width // 2, hidden_sizes=[shape.width // 2, shape.width],
                 depths=[1, 1], layer_type="basic"), attention=None)),
             _images(32), _last_hidden),
    ZooModel("transformers ConvNeXt", "transformers", "transformers",
             _hf("ConvNextModel", "ConvNextConfig", lambda shape: dict(
                 num_channels=3, patch_size=4, num_stages=2, hidden_sizes=[shape.width // 2, shape.width],
                 depths=[1, 1], drop_path_rate=0.0, image_size=16), attention=None),
             _images(16), _last_hidden),
    _builtin("gpt"),
    _builtin("llama"),
    _builtin("mlp"),
)


#: families the tests do not run, for the benchmarks' checks on models the zoo does not tune for
#: (``zoo_model`` finds them; ``ZOO`` and the tests leave them out)
OUTSIDE: tuple[ZooModel, ...] = (
    ZooModel("transformers GPT-J", "transformers", "transformers",
             _hf("GPTJForCausalLM", "GPTJConfig", lambda shape: dict(
                 vocab_size=VOCAB, n_embd=shape.width, n_layer=shape.layers, n_head=4, rotary_dim=shape.width // 4,
                 n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
                 attention=None),
             lambda shape, g: {"input_ids": _tokens(shape, g), "use_cache": False}, _logits),
    ZooModel("transformers MPT", "transformers", "transformers",
             _hf("MptForCausalLM", "MptConfig", lambda shape: dict(
                 vocab_size=VOCAB, d_model=shape.width, n_layers=shape.layers, n_heads=4, expansion_ratio=2,
                 max_seq_len=64), attention=None),
             lambda shape, g: {"input_ids": _tokens(shape, g), "use_cache": False}, _logits),
    # one layer's weights shared by every layer, a factorized embedding
    ZooModel("transformers ALBERT", "transformers", "transformers",
             _hf("AlbertModel", "AlbertConfig", lambda shape: dict(
                 vocab_size=VOCAB, embedding_size=shape.width // 2, max_position_embeddings=64, **_encoder(shape))),
             lambda shape, g: {"input_ids": _tokens(shape, g)}, _last_hidden),
    # a pre-norm vision transformer: class token, quick GELU, a layer norm before the encoder
    ZooModel("transformers CLIPVision", "transformers", "transformers",
             _hf("CLIPVisionModel", "CLIPVisionConfig", lambda shape: dict(
                 hidden_size=shape.width, intermediate_size=shape.hidden, num_hidden_layers=shape.layers,
                 num_attention_heads=4, image_size=16, patch_size=4)),
             _images(16), _last_hidden),
    # BERT's encoder behind an embedding narrower than the layers (a projection between them)
    ZooModel("transformers Electra", "transformers", "transformers",
             _hf("ElectraModel", "ElectraConfig", lambda shape: dict(
                 vocab_size=VOCAB, embedding_size=shape.width // 2, max_position_embeddings=64, **_encoder(shape))),
             lambda shape, g: {"input_ids": _tokens(shape, g)}, _last_hidden),
)


def zoo_names(outside: bool = False) -> list[str]:
    """The zoo's model names (``outside``: with the families of ``OUTSIDE`` after them)."""
    return [entry.name for entry in (*ZOO, *(OUTSIDE if outside else ()))]


def zoo_model(name: str) -> ZooModel:
    for entry in (*ZOO, *OUTSIDE):
        if entry.name == name:
            return entry
    raise ValueError(f"zoo model must be one of {zoo_names(outside=True)}, got {name!r}")


@dataclass
class ZooRun:
    """One jit-forward-backward of a zoo model."""

    jitted: object
    #: each parameter's gradient (None where the loss does not reach it)
    grads: list
    #: what autograd kept for backward, in storages (thunder_remat.inspect.measure.saved_for_backward)
    saved: object


def _loss(entry: ZooModel, out) -> torch.Tensor:
    return entry.output(out).float().pow(2).mean()


def eager_gradients(entry: ZooModel, size: str = "small") -> list:
    """The parameters' gradients in plain PyTorch (the reference every compiled run must equal)."""
    model, inputs = entry.make(size)
    _loss(entry, model(**inputs)).backward()
    return [p.grad for p in model.parameters()]


def run_zoo_model(entry: ZooModel, executors, size: str = "small", **options) -> ZooRun:
    """jit ``entry`` with ``executors`` and ``options``, run one forward (measuring what it saves)
    and one backward."""
    import thunder

    from thunder_remat.inspect.measure import saved_for_backward

    model, inputs = entry.make(size)
    jitted = thunder.jit(model, executors=list(executors), **options)
    out, saved = saved_for_backward(jitted, **inputs)
    _loss(entry, out).backward()
    return ZooRun(jitted, [p.grad for p in model.parameters()], saved)


class WithLoss(torch.nn.Module):
    """A model and the loss a caller takes of its output, as one module: compiled together, the
    trace (and thunder_remat's step-peak estimate) holds the loss and its backward."""

    def __init__(self, model: torch.nn.Module, loss: Callable) -> None:
        super().__init__()
        self.inner, self.loss = model, loss

    def forward(self, *args, **kwargs):
        return self.loss(self.inner(*args, **kwargs))


def same_gradients(a: list, b: list, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    """Equal within tolerance; a missing gradient equals an all-zero one."""
    for x, y in zip(a, b, strict=True):
        if x is None and y is None:
            continue
        x = torch.zeros_like(y) if x is None else x
        y = torch.zeros_like(x) if y is None else y
        if not torch.allclose(x, y, atol=atol, rtol=rtol):
            return False
    return True
