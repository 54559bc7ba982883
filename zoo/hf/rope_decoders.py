"""The RoPE decoders: Llama, Mistral (Llama's layout with a sliding window), Qwen2 (q/k/v biases,
optionally a sliding window) and Qwen3 (Qwen2 without biases, with an RMSNorm on each head's q and
k). Their config readers, one weight map, config writers and export rules; the records at the end."""

from __future__ import annotations

import math
from typing import Any

from zoo.config import ModelConfig
from zoo.hf.common import decoder_family
from zoo.hf.families import WINDOW, attn_dropout, differs, ids, plain
from zoo.hf.mapping import FAMILIES, Mapper, activation, first, token_id
from zoo.rope_scaling import YaRN


# ---- Llama, Mistral and Qwen2 --------------------------------------------------------------------------
def rope_settings(c: Any) -> dict[str, Any]:
    """RoPE settings from ``rope_parameters`` (transformers 5) or ``rope_theta``/``rope_scaling`` (4.x)."""
    params = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {})
    base = float(params.get("rope_theta", getattr(c, "rope_theta", 10000.0)))
    partial = params.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", 1.0))
    if partial not in (None, 1.0):
        raise ValueError(f"partial_rotary_factor={partial} is not supported; zoo rotates the whole head")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return {"rope_base": base}
    if kind == "linear":
        return {"rope_base": base, "rope_scaling": "linear", "rope_scaling_factor": float(params["factor"])}
    if kind == "yarn":
        return {"rope_base": base, **_yarn(c, params)}
    raise ValueError(
        f"rope_type={kind!r} is not supported; supported: 'default', 'linear', 'yarn' (zoo's 'ntk' is a "
        "fixed NTK-aware base, not HF's length-dependent 'dynamic')"
    )


def _yarn(c: Any, params: dict[str, Any]) -> dict[str, Any]:
    """YaRN's factor and original context (read as transformers reads them: a top-level
    ``original_max_position_embeddings`` first, then the parameter, then ``max_position_embeddings``;
    no factor: their ratio). The rest zoo fixes (YaRN's class attributes): other values are refused."""
    original = int(
        getattr(c, "original_max_position_embeddings", None)
        or params.get("original_max_position_embeddings")
        or c.max_position_embeddings
    )
    factor = float(params.get("factor") or c.max_position_embeddings / original)
    if params.get("mscale") and params.get("mscale_all_dim"):
        raise ValueError(
            f"rope_parameters mscale={params['mscale']} with mscale_all_dim={params['mscale_all_dim']} (DeepSeek's "
            "attention factor) is not supported: zoo's yarn has attention_factor = 0.1 ln(factor) + 1"
        )
    temperature, attention = YaRN(factor).attention_factor, params.get("attention_factor")
    found = {
        "beta_fast": (params.get("beta_fast") or 32, YaRN.beta_fast),
        "beta_slow": (params.get("beta_slow") or 1, YaRN.beta_slow),
        "truncate": (params.get("truncate", True), True),
        "attention_factor": (temperature if attention is None else attention, temperature),
    }
    for key, (value, wanted) in found.items():
        if value != wanted and not (isinstance(value, float) and math.isclose(value, wanted, rel_tol=1e-6)):
            raise ValueError(f"rope_parameters {key}={value} is not supported: zoo's yarn has {key}={wanted}")
    return {"rope_scaling": "yarn", "rope_scaling_factor": factor, "rope_original_max_len": original}


def _llama_config(c: Any) -> ModelConfig:
    attention_bias, mlp_bias = getattr(c, "attention_bias", False), getattr(c, "mlp_bias", False)
    if attention_bias != mlp_bias:
        raise ValueError(
            f"{c.model_type}: attention_bias={attention_bias} with mlp_bias={mlp_bias} has no zoo "
            "equivalent; zoo's bias covers the attention and FFN projections together"
        )
    return _rope_decoder_config(c, bias=attention_bias, qkv_bias=None)


def _mistral_config(c: Any) -> ModelConfig:
    """Llama's layout without biases; ``sliding_window`` (None: full attention) applies to every layer
    (transformers' Mistral ignores ``layer_types``)."""
    return _windowed(_rope_decoder_config(c, bias=False, qkv_bias=None), c.sliding_window)


def _qwen2_config(c: Any) -> ModelConfig:
    """Llama's layout with q/k/v biases, and Qwen's sliding window (:func:`_qwen_window`)."""
    return _qwen_window(c, _rope_decoder_config(c, bias=False, qkv_bias=True))


def _qwen3_config(c: Any) -> ModelConfig:
    """Qwen2's layout with an RMSNorm over each head's queries and keys before RoPE (``qk_norm``), and
    ``attention_bias`` for q, k, v and o alike (none by default; the MLP never has biases)."""
    if getattr(c, "attention_bias", False):
        raise ValueError(
            "qwen3: attention_bias=True (biases on q, k, v and o, none in the MLP) has no zoo equivalent; zoo's "
            "bias covers the attention and FFN projections together, qkv_bias q, k and v alone"
        )
    return _qwen_window(c, _rope_decoder_config(c, bias=False, qkv_bias=None).replace(qk_norm="rmsnorm"))


def _qwen_window(c: Any, cfg: ModelConfig) -> ModelConfig:
    """With ``use_sliding_window``, the layers ``layer_types`` names (by default those from
    ``max_window_layers`` on) slide: zoo reads every layer or none."""
    window = c.sliding_window if getattr(c, "use_sliding_window", False) else None
    first, n = getattr(c, "max_window_layers", 0), c.num_hidden_layers
    types = getattr(c, "layer_types", None) or [
        "sliding_attention" if i >= first else "full_attention" for i in range(n)
    ]
    sliding = sum(kind == "sliding_attention" for kind in types)
    if window is None or sliding == 0:
        return cfg
    if sliding < n:
        raise ValueError(
            f"{c.model_type}: max_window_layers={first} (layer_types={list(types)}) mixes sliding-window and "
            f"full-attention layers, which is not supported: zoo has one mask for every layer. Use "
            f"max_window_layers=0 (all slide) or >= num_hidden_layers={n} (none)"
        )
    return _windowed(cfg, window)


def _windowed(cfg: ModelConfig, window: int | None) -> ModelConfig:
    """``cfg`` attending over the last ``window`` positions in every layer (None: all positions)."""
    return cfg if window is None else cfg.replace(mask="sliding_window", window=int(window))


def _rope_decoder_config(c: Any, *, bias: bool, qkv_bias: bool | None) -> ModelConfig:
    """Llama, Mistral and Qwen2: decoder, RoPE (rotate-half layout in both libraries), RMSNorm, SwiGLU,
    GQA; Qwen2's q/k/v biases become ``qkv_bias=True``."""
    d, h, head_dim = c.hidden_size, c.num_attention_heads, getattr(c, "head_dim", None)
    eos = token_id(c, "eos_token_id")
    return ModelConfig(
        arch="decoder",
        vocab_size=c.vocab_size,
        d_model=d,
        n_layers=c.num_hidden_layers,
        n_heads=h,
        n_kv_heads=c.num_key_value_heads or h,
        head_dim=None if head_dim is None or (d % h == 0 and head_dim == d // h) else head_dim,
        d_ff=c.intermediate_size,
        max_seq_len=c.max_position_embeddings,
        position="rope",
        **rope_settings(c),
        norm="rmsnorm",
        norm_placement="pre",
        **activation(c.hidden_act, gated=True, field="hidden_act"),
        bias=bias,
        qkv_bias=qkv_bias,
        tie_embeddings=c.tie_word_embeddings,
        norm_eps=c.rms_norm_eps,
        dropout=0.0,
        attn_dropout=float(getattr(c, "attention_dropout", 0.0) or 0.0),
        init_std=c.initializer_range,
        eos_token_id=eos,
        pad_token_id=first(token_id(c, "pad_token_id"), eos, 0),
    )


def _llama_weights(w: Mapper, cfg: ModelConfig) -> ModelConfig:
    b = w.base
    qkv_bias = cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias
    hd, kv = cfg.resolved_head_dim, cfg.resolved_n_kv_heads
    w.copy("embed", f"{b}embed_tokens")
    for i in range(cfg.n_layers):
        z, h = f"decoder.blocks.{i}", f"{b}layers.{i}"
        w.copy(f"{z}.attn_res.norm", f"{h}.input_layernorm")
        w.fuse(
            f"{z}.attn.qkv",
            [f"{h}.self_attn.{p}_proj" for p in "qkv"],
            bias=qkv_bias,
            sizes=[cfg.n_heads * hd, kv * hd, kv * hd],
        )
        if cfg.qk_norm != "none":  # Qwen3
            w.copy(f"{z}.attn.q_norm", f"{h}.self_attn.q_norm")
            w.copy(f"{z}.attn.k_norm", f"{h}.self_attn.k_norm")
        w.copy(f"{z}.attn.out", f"{h}.self_attn.o_proj", bias=cfg.bias)
        w.copy(f"{z}.ffn_res.norm", f"{h}.post_attention_layernorm")
        w.fuse(f"{z}.ffn.fc", [f"{h}.mlp.gate_proj", f"{h}.mlp.up_proj"], bias=cfg.bias)
        w.copy(f"{z}.ffn.proj", f"{h}.mlp.down_proj", bias=cfg.bias)
    w.copy("decoder.final_norm", f"{b}norm")
    return w.lm_head(cfg, f"{b}embed_tokens.weight")


def _rope_decoder_unfit(
    cfg: ModelConfig,
    family: str,
    masks: tuple[str, ...] = (),
    qk_norms: tuple[str, ...] = ("none",),
    **bias: tuple[Any, ...],
) -> list[str]:
    return (
        differs(cfg, family, arch=("decoder",))
        + plain(cfg, family, masks, qk_norm=qk_norms)
        + differs(
            cfg,
            family,
            position=("rope",),
            norm=("rmsnorm",),
            norm_placement=("pre",),
            ffn=("swiglu",),
            rope_scaling=("none", "linear", "yarn"),
            attn_scale=(None,),
            logit_scale=(1.0,),
            **bias,
        )
    )


def _llama_unfit(cfg: ModelConfig) -> list[str]:
    return _rope_decoder_unfit(cfg, "Llama", qkv_bias=(None, cfg.bias))


def _mistral_unfit(cfg: ModelConfig) -> list[str]:
    return _rope_decoder_unfit(cfg, "Mistral", WINDOW, bias=(False,), qkv_bias=(None, False))


def _qwen2_unfit(cfg: ModelConfig) -> list[str]:
    """Qwen2's head size is d_model / n_heads in transformers 4.x (5.x reads head_dim): only that one."""
    problems = _rope_decoder_unfit(cfg, "Qwen2", WINDOW, bias=(False,), qkv_bias=(True,))
    if cfg.resolved_head_dim * cfg.n_heads != cfg.d_model:
        problems.append(f"head_dim={cfg.head_dim} (Qwen2 has head_dim = d_model / n_heads)")
    return problems


def _qwen3_unfit(cfg: ModelConfig) -> list[str]:
    return _rope_decoder_unfit(cfg, "Qwen3", WINDOW, ("rmsnorm",), bias=(False,), qkv_bias=(None, False))


def rope_parameters(cfg: ModelConfig) -> dict[str, Any]:
    """``rope_parameters`` for ``rope_scaling`` none, linear or yarn (what ``rope_settings`` reads back)."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_base}
    if cfg.rope_scaling in ("linear", "yarn"):
        rope |= {"rope_type": cfg.rope_scaling, "factor": cfg.rope_scaling_factor}
    if cfg.rope_scaling == "yarn":
        rope["original_max_position_embeddings"] = cfg.rope_original_max_len
    return rope


def _llama_write(cfg: ModelConfig) -> dict[str, Any]:
    return {
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.resolved_n_kv_heads,
        "head_dim": cfg.resolved_head_dim,
        "intermediate_size": cfg.resolved_d_ff,
        "hidden_act": "silu",
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_seq_len or 2048,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_base,
        "rope_parameters": rope_parameters(cfg),
        "attention_bias": cfg.bias,
        "mlp_bias": cfg.bias,
        "attention_dropout": attn_dropout(cfg),
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": cfg.eos_token_id,
        **ids(cfg),
    }


def _unbiased_write(cfg: ModelConfig) -> dict[str, Any]:
    """Llama's config.json without its bias switches (Mistral has no biases, Qwen2 q/k/v ones always)."""
    written = _llama_write(cfg)
    for key in ("attention_bias", "mlp_bias"):
        written.pop(key)
    return written


def _mistral_write(cfg: ModelConfig) -> dict[str, Any]:
    return {**_unbiased_write(cfg), "sliding_window": cfg.window}


def _qwen2_write(cfg: ModelConfig) -> dict[str, Any]:
    window = {"use_sliding_window": True, "sliding_window": cfg.window, "max_window_layers": 0}  # every layer
    return {**_unbiased_write(cfg), **(window if cfg.window is not None else {"use_sliding_window": False})}


def _qwen3_write(cfg: ModelConfig) -> dict[str, Any]:
    return {**_qwen2_write(cfg), "attention_bias": False}


# ---- the records -----------------------------------------------------------------------------------------
_LLAMA_DEFAULTS = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
_MISTRAL_DEFAULTS = {
    **{k: v for k, v in _LLAMA_DEFAULTS.items() if k not in ("attention_bias", "mlp_bias")},
    "intermediate_size": 14336,
    "num_key_value_heads": 8,
    "head_dim": None,
    "max_position_embeddings": 4096 * 32,
    "sliding_window": 4096,
}
_QWEN2_DEFAULTS = {
    **_LLAMA_DEFAULTS,
    "vocab_size": 151936,
    "intermediate_size": 22016,
    "num_key_value_heads": 32,
    "max_position_embeddings": 32768,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
    "bos_token_id": None,
    "eos_token_id": None,
}
_QWEN3_DEFAULTS = {
    **_QWEN2_DEFAULTS,
    "head_dim": 128,
    "attention_bias": False,
}

FAMILIES.register("llama")(
    decoder_family(
        _llama_config,
        _llama_weights,
        defaults=_LLAMA_DEFAULTS,
        write_config=_llama_write,
        unfit=_llama_unfit,
        architecture="LlamaForCausalLM",
    )
)
FAMILIES.register("mistral")(
    decoder_family(
        _mistral_config,
        _llama_weights,
        defaults=_MISTRAL_DEFAULTS,
        write_config=_mistral_write,
        unfit=_mistral_unfit,
        architecture="MistralForCausalLM",
    )
)
FAMILIES.register("qwen2")(
    decoder_family(
        _qwen2_config,
        _llama_weights,
        defaults=_QWEN2_DEFAULTS,
        write_config=_qwen2_write,
        unfit=_qwen2_unfit,
        architecture="Qwen2ForCausalLM",
    )
)
FAMILIES.register("qwen3")(
    decoder_family(
        _qwen3_config,
        _llama_weights,
        defaults=_QWEN3_DEFAULTS,
        write_config=_qwen3_write,
        unfit=_qwen3_unfit,
        architecture="Qwen3ForCausalLM",
    )
)
