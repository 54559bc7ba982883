"""GPT-2 (``model_type: gpt2``): its config reader, weight map, export rules and config writer; the
record at the end. GPT2LMHeadModel is the only class written."""

from __future__ import annotations

from typing import Any

from zoo.config import ModelConfig
from zoo.hf.common import BUFFERS, attn_dropout, differs, gelu_name, ids, lm_class, mha, plain
from zoo.hf.mapping import CAUSAL_LM, FAMILIES, Family, Mapper, activation, first, token_id


def _gpt2_config(c: Any) -> ModelConfig:
    """Decoder, learned positions, pre-LayerNorm with biases, GELU (tanh) MLP. HF's ``Conv1D`` stores
    weights as (in, out): :func:`_gpt2_weights` transposes them into ``nn.Linear``'s (out, in)."""
    if getattr(c, "scale_attn_by_inverse_layer_idx", False):
        raise ValueError("gpt2: scale_attn_by_inverse_layer_idx=True (per-layer attention scale) is not supported")
    if getattr(c, "add_cross_attention", False):
        raise ValueError("gpt2: add_cross_attention=True (GPT-2 as a seq2seq decoder) is not supported")
    d, eos = c.n_embd, token_id(c, "eos_token_id")
    return ModelConfig(
        arch="decoder",
        vocab_size=c.vocab_size,
        d_model=d,
        n_layers=c.n_layer,
        n_heads=c.n_head,
        d_ff=c.n_inner or 4 * d,
        max_seq_len=c.n_positions,
        position="learned",
        norm="layernorm",
        norm_placement="pre",
        **activation(c.activation_function, gated=False, field="activation_function"),
        bias=True,
        tie_embeddings=c.tie_word_embeddings,
        norm_eps=c.layer_norm_epsilon,
        attn_scale=None if c.scale_attn_weights else 1.0,
        dropout=c.resid_pdrop,
        attn_dropout=c.attn_pdrop,
        init_std=c.initializer_range,
        eos_token_id=eos,
        pad_token_id=first(token_id(c, "pad_token_id"), eos, 0),
    )


def _gpt2_weights(w: Mapper, cfg: ModelConfig) -> ModelConfig:
    b = w.base
    w.copy("embed", f"{b}wte")
    w.copy("decoder.position.table", f"{b}wpe")
    for i in range(cfg.n_layers):
        z, h = f"decoder.blocks.{i}", f"{b}h.{i}"
        w.copy(f"{z}.attn_res.norm", f"{h}.ln_1", bias=True)
        w.copy(f"{z}.attn.qkv", f"{h}.attn.c_attn", bias=True, transpose=True)  # rows q|k|v
        w.copy(f"{z}.attn.out", f"{h}.attn.c_proj", bias=True, transpose=True)
        w.copy(f"{z}.ffn_res.norm", f"{h}.ln_2", bias=True)
        w.copy(f"{z}.ffn.fc", f"{h}.mlp.c_fc", bias=True, transpose=True)
        w.copy(f"{z}.ffn.proj", f"{h}.mlp.c_proj", bias=True, transpose=True)
    w.copy("decoder.final_norm", f"{b}ln_f", bias=True)
    return w.lm_head(cfg, f"{b}wte.weight")


def _gpt2_unfit(cfg: ModelConfig) -> list[str]:
    return (
        differs(cfg, "GPT-2", arch=("decoder",))
        + plain(cfg, "GPT-2")
        + mha(cfg, "GPT-2")
        + differs(
            cfg,
            "GPT-2",
            position=("learned",),
            norm=("layernorm",),
            norm_placement=("pre",),
            ffn=("gelu", "relu"),
            bias=(True,),
            qkv_bias=(None, True),
            attn_scale=(None, 1.0),
            logit_scale=(1.0,),
        )
    )


def _gpt2_write(cfg: ModelConfig) -> dict[str, Any]:
    return {
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads,
        "n_inner": cfg.resolved_d_ff,
        "n_positions": cfg.max_seq_len,
        "activation_function": gelu_name(cfg),
        "vocab_size": cfg.vocab_size,
        "layer_norm_epsilon": cfg.norm_eps,
        "scale_attn_weights": cfg.attn_scale is None,
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": attn_dropout(cfg),
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": cfg.eos_token_id,
        **ids(cfg),
    }


# ---- the record ------------------------------------------------------------------------------------------
FAMILIES.register("gpt2")(
    Family(
        _gpt2_config,
        _gpt2_weights,
        backbone=("wte", "wpe", "h", "ln_f"),
        prefix="transformer",
        defaults={
            "vocab_size": 50257,
            "n_positions": 1024,
            "n_embd": 768,
            "n_layer": 12,
            "n_head": 12,
            "n_inner": None,
            "activation_function": "gelu_new",
            "resid_pdrop": 0.1,
            "embd_pdrop": 0.1,
            "attn_pdrop": 0.1,
            "layer_norm_epsilon": 1e-5,
            "initializer_range": 0.02,
            "scale_attn_weights": True,
            "bos_token_id": 50256,
            "eos_token_id": 50256,
            "tie_word_embeddings": True,
        },
        write_config=_gpt2_write,
        unfit=_gpt2_unfit,
        ignored=BUFFERS,
        architecture=lm_class("GPT2LMHeadModel"),
        auto_classes={"GPT2LMHeadModel": CAUSAL_LM},
    )
)
