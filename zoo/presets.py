"""Named model sizes. A preset only sets numbers; ``create_model(name, **overrides)`` builds it.

Parameter counts (meta device, ``zoo.count_parameters``) equal the published figures; the tests
check every one. Sources: GPT-2 (Radford et al. 2019, HF configs), GPT-3 (Brown et al. 2020,
table 2.1), BERT (Devlin et al. 2019), T5 (Raffel et al. 2020), Llama 2 (Touvron et al. 2023),
Qwen2.5 (Qwen team 2024). The GPT and BERT presets pad their embedding and head rows to a multiple of
128 (``vocab_multiple_of``), which those counts leave out as ``zoo.count_parameters`` does.
"""

from __future__ import annotations

from typing import Any

from zoo.config import ModelConfig
from zoo.models import ZooModel, build_model
from zoo.registry import MODELS


def register_model(name: str):
    """Decorator: a function returning a ModelConfig becomes a preset called ``name``."""
    return MODELS.register(name)


def _gpt(n_layers: int, d_model: int, n_heads: int, **kw: Any) -> ModelConfig:
    base = dict(
        arch="decoder",
        vocab_size=50257,
        vocab_multiple_of=128,  # 50,304 rows: tensor-core tiles (zoo.config.ModelConfig.padded_vocab_size)
        max_seq_len=1024,
        position="learned",
        norm="layernorm",
        norm_placement="pre",
        ffn="gelu",
        gelu_approximate="tanh",
        bias=True,
        tie_embeddings=True,
        norm_eps=1e-5,
        eos_token_id=50256,
        pad_token_id=50256,
    )
    return ModelConfig(**{**base, "n_layers": n_layers, "d_model": d_model, "n_heads": n_heads, **kw})


def _bert(n_layers: int, d_model: int, n_heads: int, **kw: Any) -> ModelConfig:
    base = dict(
        arch="encoder",
        vocab_size=30522,
        vocab_multiple_of=128,  # 30,592 rows
        max_seq_len=512,
        position="learned",
        norm="layernorm",
        norm_placement="post",
        ffn="gelu",
        bias=True,
        norm_eps=1e-12,
        type_vocab_size=2,
        pooler=True,
        pad_token_id=0,
    )
    return ModelConfig(**{**base, "n_layers": n_layers, "d_model": d_model, "n_heads": n_heads, **kw})


def _t5(n_layers: int, d_model: int, n_heads: int, d_ff: int, **kw: Any) -> ModelConfig:
    base = dict(
        arch="encoder_decoder",
        vocab_size=32128,
        position="t5_relative",
        norm="rmsnorm",
        norm_placement="pre",
        ffn="relu",
        bias=False,
        tie_embeddings=True,
        norm_eps=1e-6,
        attn_scale=1.0,
        logit_scale=d_model**-0.5,
        rel_buckets=32,
        rel_max_distance=128,
        init_std=1.0 / d_model**0.5,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return ModelConfig(**{**base, "n_layers": n_layers, "d_model": d_model, "n_heads": n_heads, "d_ff": d_ff, **kw})


def _llama(n_layers: int, d_model: int, n_heads: int, d_ff: int, **kw: Any) -> ModelConfig:
    base = dict(
        arch="decoder",
        vocab_size=32000,
        max_seq_len=4096,
        position="rope",
        rope_base=10000.0,
        norm="rmsnorm",
        norm_placement="pre",
        ffn="swiglu",
        bias=False,
        tie_embeddings=False,
        norm_eps=1e-5,
        pad_token_id=0,
        eos_token_id=2,
    )
    return ModelConfig(**{**base, "n_layers": n_layers, "d_model": d_model, "n_heads": n_heads, "d_ff": d_ff, **kw})


# GPT-2 and GPT-3: learned positions, pre-LayerNorm, GELU MLP, tied head
register_model("gpt2")(lambda: _gpt(12, 768, 12))
register_model("gpt2-medium")(lambda: _gpt(24, 1024, 16))
register_model("gpt2-large")(lambda: _gpt(36, 1280, 20))
register_model("gpt2-xl")(lambda: _gpt(48, 1600, 25))
register_model("gpt3-175b")(lambda: _gpt(96, 12288, 96, max_seq_len=2048))
# BERT: post-LayerNorm, segment embeddings, pooler
register_model("bert-base")(lambda: _bert(12, 768, 12))
register_model("bert-large")(lambda: _bert(24, 1024, 16))
# T5 v1.0: relative position buckets, RMSNorm without bias, ReLU MLP, unscaled attention
register_model("t5-small")(lambda: _t5(6, 512, 8, 2048))
register_model("t5-base")(lambda: _t5(12, 768, 12, 3072))
# Llama 2 and Qwen2.5: RoPE, RMSNorm, SwiGLU, untied head; GQA for the large ones
register_model("llama2-7b")(lambda: _llama(32, 4096, 32, 11008))
register_model("llama2-13b")(lambda: _llama(40, 5120, 40, 13824))
register_model("llama2-70b")(lambda: _llama(80, 8192, 64, 28672, n_kv_heads=8))
register_model("qwen2.5-72b")(
    lambda: _llama(
        80,
        8192,
        64,
        29568,
        n_kv_heads=8,
        vocab_size=152064,
        qkv_bias=True,
        rope_base=1_000_000.0,
        norm_eps=1e-6,
        max_seq_len=32768,
        eos_token_id=151643,
        pad_token_id=151643,
    )
)
# Tiny models for CPU work: seconds to train, same layouts
register_model("gpt-tiny")(lambda: _gpt(2, 128, 4, vocab_size=1024, max_seq_len=256, eos_token_id=None, pad_token_id=0))
register_model("bert-tiny")(lambda: _bert(2, 128, 4, vocab_size=1024, max_seq_len=256))
register_model("t5-tiny")(lambda: _t5(2, 128, 4, 512, vocab_size=1024))
register_model("llama-tiny")(lambda: _llama(2, 128, 4, 352, n_kv_heads=2, vocab_size=1024, max_seq_len=256))


def list_models(pattern: str = "*") -> list[str]:
    """Preset names matching an fnmatch pattern, e.g. ``list_models("llama*")``."""
    return MODELS.names(pattern)


def get_config(name: str, **overrides: Any) -> ModelConfig:
    """The preset's config with field overrides applied (not yet validated). A preset's own setting
    of a component that an override replaces falls away (gpt2's ``gelu_approximate="tanh"`` under
    ``ffn="swiglu"``); an override that no chosen component reads stays, for ``validate`` to refuse."""
    return MODELS.get(name)().replace(**overrides).without_ignored(keep=overrides)


def create_model(name: str, *, seed: int | None = None, **overrides: Any) -> ZooModel:
    """Build preset ``name`` with field overrides, e.g. ``create_model("gpt2", n_layers=4, position="alibi")``."""
    return build_model(get_config(name, **overrides), seed=seed)
