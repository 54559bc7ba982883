"""Gemma 2 (Gemma Team 2024, https://arxiv.org/abs/2408.00118): a RoPE decoder composed of what zoo
has. Sandwich norms (``norm_placement=sandwich``: a norm before and after each sublayer) of
RMSNorm with a (1 + weight) gain (``norm=rmsnorm_1p``); GeGLU with tanh GELU; embeddings scaled by
sqrt(d_model); scores scaled by ``query_pre_attn_scalar``^-1/2 and soft-capped (``attn_softcap``,
on the ``auto`` kernel: sdpa cannot cap), logits soft-capped (``final_softcap``); windowed and
global layers alternating as ``layer_types`` says (``mask=sliding_window`` with ``window_pattern``).
Its config reader, weight map, config writer and export rules; the record at the end."""

from __future__ import annotations

from typing import Any

from zoo.config import ModelConfig
from zoo.hf.common import attn_dropout, decoder_family, differs, ids, plain, shortest_repeat
from zoo.hf.mapping import FAMILIES, Mapper, activation, first, token_id
from zoo.hf.rope_decoders import rope_parameters, rope_settings
from zoo.mask import windowed_layers

SLIDING, FULL = "sliding_attention", "full_attention"


def _gemma2_config(c: Any) -> ModelConfig:
    if getattr(c, "attention_bias", False):
        raise ValueError("gemma2: attention_bias=True is not supported; zoo's Gemma 2 has no biases")
    if getattr(c, "use_bidirectional_attention", None):
        raise ValueError("gemma2: use_bidirectional_attention=True is not supported; zoo reads the causal Gemma 2")
    d, h, head_dim = c.hidden_size, c.num_attention_heads, c.head_dim
    eos, softcap = token_id(c, "eos_token_id"), c.attn_logit_softcapping
    scalar = c.query_pre_attn_scalar
    cfg = ModelConfig(
        arch="decoder",
        vocab_size=c.vocab_size,
        d_model=d,
        n_layers=c.num_hidden_layers,
        n_heads=h,
        n_kv_heads=c.num_key_value_heads or h,
        head_dim=None if head_dim * h == d else head_dim,
        d_ff=c.intermediate_size,
        max_seq_len=c.max_position_embeddings,
        position="rope",
        **rope_settings(c),
        norm="rmsnorm_1p",
        norm_placement="sandwich",
        **activation(c.hidden_activation, gated=True, field="hidden_activation"),
        bias=False,
        tie_embeddings=c.tie_word_embeddings,
        norm_eps=c.rms_norm_eps,
        attn_dropout=float(c.attention_dropout or 0.0),
        init_std=c.initializer_range,
        embed_scale=d**0.5,
        attn_scale=None if scalar == head_dim else float(scalar) ** -0.5,
        attn_softcap=None if softcap is None else float(softcap),
        final_softcap=None if c.final_logit_softcapping is None else float(c.final_logit_softcapping),
        attention="sdpa" if softcap is None else "auto",
        eos_token_id=eos,
        pad_token_id=first(token_id(c, "pad_token_id"), eos, 0),
    )
    return _windows(c, cfg)


def _layer_types(c: Any) -> list[str]:
    """``layer_types``, or Gemma 2's default: windowed layers first, alternating with global ones."""
    types = getattr(c, "layer_types", None)
    return list(types) if types else [SLIDING if (i + 1) % 2 else FULL for i in range(c.num_hidden_layers)]


def _windows(c: Any, cfg: ModelConfig) -> ModelConfig:
    """The layers ``layer_types`` makes windowed: none (causal), all (sliding_window), or a pattern
    (the shortest that, repeated, gives the list)."""
    letters = "".join("L" if kind == SLIDING else "G" for kind in _layer_types(c))
    if "L" not in letters or c.sliding_window is None:
        return cfg
    pattern = shortest_repeat(letters)
    return cfg.replace(
        mask="sliding_window", window=int(c.sliding_window), window_pattern=None if "G" not in pattern else pattern
    )


def _gemma2_weights(w: Mapper, cfg: ModelConfig) -> ModelConfig:
    b, hd, kv = w.base, cfg.resolved_head_dim, cfg.resolved_n_kv_heads
    w.copy("embed", f"{b}embed_tokens")
    for i in range(cfg.n_layers):
        z, h = f"decoder.blocks.{i}", f"{b}layers.{i}"
        w.copy(f"{z}.attn_res.norm", f"{h}.input_layernorm")
        w.fuse(f"{z}.attn.qkv", [f"{h}.self_attn.{p}_proj" for p in "qkv"], sizes=[cfg.n_heads * hd, kv * hd, kv * hd])
        w.copy(f"{z}.attn.out", f"{h}.self_attn.o_proj")
        w.copy(f"{z}.attn_res.norm_out", f"{h}.post_attention_layernorm")
        w.copy(f"{z}.ffn_res.norm", f"{h}.pre_feedforward_layernorm")
        w.fuse(f"{z}.ffn.fc", [f"{h}.mlp.gate_proj", f"{h}.mlp.up_proj"])
        w.copy(f"{z}.ffn.proj", f"{h}.mlp.down_proj")
        w.copy(f"{z}.ffn_res.norm_out", f"{h}.post_feedforward_layernorm")
    w.copy("decoder.final_norm", f"{b}norm")
    return w.lm_head(cfg, f"{b}embed_tokens.weight")


def _gemma2_unfit(cfg: ModelConfig) -> list[str]:
    """Gemma 2 computes any soft-caps and window pattern, but always scales its embeddings, and its
    score scale is a whole number's inverse square root (``query_pre_attn_scalar``)."""
    scalar = None if cfg.attn_scale is None else cfg.attn_scale**-2
    scale = (
        []
        if scalar is None or abs(scalar - round(scalar)) < 1e-6 * scalar
        else [f"attn_scale={cfg.attn_scale} (Gemma 2 scales scores by query_pre_attn_scalar^-1/2, a whole number's)"]
    )
    return scale + (
        differs(cfg, "Gemma 2", arch=("decoder",))
        + plain(
            cfg,
            "Gemma 2",
            ("sliding_window",),
            embed_scale=(cfg.d_model**0.5,),
            attn_softcap=(cfg.attn_softcap,),
            final_softcap=(cfg.final_softcap,),
            window_pattern=(cfg.window_pattern,),
        )
        + differs(
            cfg,
            "Gemma 2",
            position=("rope",),
            norm=("rmsnorm_1p",),
            norm_placement=("sandwich",),
            ffn=("geglu", "swiglu"),
            rope_scaling=("none", "linear", "yarn"),
            bias=(False,),
            qkv_bias=(None, False),
            logit_scale=(1.0,),
        )
    )


def _gemma2_write(cfg: ModelConfig) -> dict[str, Any]:
    hd = cfg.resolved_head_dim
    types = [SLIDING if windowed else FULL for windowed in windowed_layers(cfg)]
    act = "silu" if cfg.ffn == "swiglu" else {"none": "gelu", "tanh": "gelu_pytorch_tanh"}[cfg.gelu_approximate]
    return {
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.resolved_n_kv_heads,
        "head_dim": hd,
        "intermediate_size": cfg.resolved_d_ff,
        "hidden_activation": act,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_seq_len or 8192,
        "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": rope_parameters(cfg),
        "attention_bias": False,
        "attention_dropout": attn_dropout(cfg),
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings,
        "query_pre_attn_scalar": hd if cfg.attn_scale is None else round(cfg.attn_scale**-2),
        "sliding_window": cfg.window,
        "layer_types": types,
        "attn_logit_softcapping": cfg.attn_softcap,
        "final_logit_softcapping": cfg.final_softcap,
        "bos_token_id": cfg.eos_token_id,
        **ids(cfg),
    }


_GEMMA2_DEFAULTS = {
    "vocab_size": 256000,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0,
}

FAMILIES.register("gemma2")(
    decoder_family(
        _gemma2_config,
        _gemma2_weights,
        defaults=_GEMMA2_DEFAULTS,
        write_config=_gemma2_write,
        unfit=_gemma2_unfit,
        architecture="Gemma2ForCausalLM",
    )
)
