"""T5 (``model_type: t5``), v1.0 and v1.1: its config reader, weight map, export rules, config writer
and the class written (T5ForConditionalGeneration); the record at the end."""

from __future__ import annotations

from typing import Any

from zoo.config import ModelConfig
from zoo.hf.common import BUFFERS, differs, gelu_name, ids, plain
from zoo.hf.mapping import FAMILIES, Family, HFClass, Mapper, activation, first, token_id
from zoo.registry import FFN


def _t5_activation(c: Any) -> dict[str, str]:
    """``feed_forward_proj`` ("relu", "gated-gelu", ...) as HF's T5Config reads it."""
    gated, _, name = c.feed_forward_proj.rpartition("-")
    if gated not in ("", "gated"):
        raise ValueError(f"t5: feed_forward_proj={c.feed_forward_proj!r} is not 'ACT' or 'gated-ACT'")
    name = "gelu_new" if c.feed_forward_proj == "gated-gelu" else name  # HF's special case
    return activation(name, gated=bool(gated), field="feed_forward_proj")


def _t5_config(c: Any) -> ModelConfig:
    """Encoder_decoder, relative position buckets (block 0's table in each stack), RMSNorm, unscaled
    attention; v1.0 (ReLU, tied head, logits scaled by d_model**-0.5) or v1.1 (gated GELU, untied)."""
    d, h = c.d_model, c.num_heads
    # transformers 5 keeps v1.0's "tied and scaled" flag as scale_decoder_outputs; 4.x as tie_word_embeddings
    scaled = bool(getattr(c, "scale_decoder_outputs", c.tie_word_embeddings))
    n_enc, n_dec = c.num_layers, c.num_decoder_layers or c.num_layers
    split = {} if n_dec == n_enc else {"n_encoder_layers": n_enc, "n_decoder_layers": n_dec}
    pad = first(token_id(c, "pad_token_id"), 0)
    return ModelConfig(
        arch="encoder_decoder",
        vocab_size=c.vocab_size,
        d_model=d,
        n_heads=h,
        n_layers=n_enc,
        **split,
        head_dim=None if d % h == 0 and d // h == c.d_kv else c.d_kv,
        d_ff=c.d_ff,
        position="t5_relative",
        rel_buckets=c.relative_attention_num_buckets,
        rel_max_distance=c.relative_attention_max_distance,
        norm="rmsnorm",
        norm_placement="pre",
        **_t5_activation(c),
        bias=False,
        tie_embeddings=scaled,
        logit_scale=d**-0.5 if scaled else 1.0,
        attn_scale=1.0,
        norm_eps=c.layer_norm_epsilon,
        dropout=c.dropout_rate,
        init_std=c.initializer_factor * d**-0.5,
        pad_token_id=pad,
        eos_token_id=token_id(c, "eos_token_id"),
        decoder_start_token_id=first(token_id(c, "decoder_start_token_id"), pad),
    )


def _t5_weights(w: Mapper, cfg: ModelConfig) -> ModelConfig:
    b = w.base
    if w.importing and not w.has(f"{b}decoder.block.0.layer.0.SelfAttention.q.weight", True):
        raise ValueError(
            "t5: the HF model has no decoder (T5EncoderModel?); zoo imports T5Model and T5ForConditionalGeneration"
        )
    fc = ["wi_0", "wi_1"] if FFN.get(cfg.ffn, field="ffn").gated else ["wi"]  # wi_0 is gated by the activation
    inner = cfg.n_heads * cfg.resolved_head_dim
    w.copy("embed", f"{b}shared")
    stacks = (("encoder", cfg.resolved_n_encoder_layers, False), ("decoder", cfg.resolved_n_decoder_layers, True))
    for stack, n_layers, cross in stacks:  # a decoder block's layers: self-attention, cross-attention, FFN
        w.copy(f"{stack}.position.table", f"{b}{stack}.block.0.layer.0.SelfAttention.relative_attention_bias")
        for i in range(n_layers):
            z, h = f"{stack}.blocks.{i}", f"{b}{stack}.block.{i}.layer"
            attn = f"{h}.0.SelfAttention"
            w.copy(f"{z}.attn_res.norm", f"{h}.0.layer_norm")
            w.fuse(f"{z}.attn.qkv", [f"{attn}.{p}" for p in "qkv"], sizes=[inner] * 3)
            w.copy(f"{z}.attn.out", f"{attn}.o")
            if cross:
                x = f"{h}.1.EncDecAttention"
                w.copy(f"{z}.cross_res.norm", f"{h}.1.layer_norm")
                w.copy(f"{z}.cross_attn.q", f"{x}.q")
                w.fuse(f"{z}.cross_attn.kv", [f"{x}.k", f"{x}.v"], sizes=[inner] * 2)
                w.copy(f"{z}.cross_attn.out", f"{x}.o")
            ffn = f"{h}.{2 if cross else 1}"
            dense = f"{ffn}.DenseReluDense"
            w.copy(f"{z}.ffn_res.norm", f"{ffn}.layer_norm")
            w.fuse(f"{z}.ffn.fc", [f"{dense}.{p}" for p in fc])
            w.copy(f"{z}.ffn.proj", f"{dense}.wo")
        w.copy(f"{stack}.final_norm", f"{b}{stack}.final_layer_norm")
    return w.lm_head(cfg, f"{b}shared.weight")


def _t5_unfit(cfg: ModelConfig) -> list[str]:
    problems = (
        differs(cfg, "T5", arch=("encoder_decoder",))
        + plain(cfg, "T5")
        + differs(
            cfg,
            "T5",
            position=("t5_relative",),
            norm=("rmsnorm",),
            norm_placement=("pre",),
            bias=(False,),
            qkv_bias=(None, False),
            attn_scale=(1.0,),
            ffn=("relu", "gelu", "geglu", "swiglu"),
        )
    )
    if cfg.resolved_n_kv_heads != cfg.n_heads:
        problems.append(f"n_kv_heads={cfg.n_kv_heads} (T5 has one key/value head per query head)")
    if cfg.ffn == "geglu" and cfg.gelu_approximate != "tanh":
        problems.append("gelu_approximate=none with ffn=geglu (T5's gated GELU is the tanh approximation)")
    if cfg.logit_scale not in (1.0, cfg.d_model**-0.5 if cfg.tie_embeddings else 1.0):
        problems.append(
            f"logit_scale={cfg.logit_scale} with tie_embeddings={cfg.tie_embeddings} (T5 scales by "
            "d_model**-0.5 only with a tied head)"
        )
    return problems


def _t5_write(cfg: ModelConfig) -> dict[str, Any]:
    gated = FFN.get(cfg.ffn, field="ffn").gated
    act = "silu" if cfg.ffn == "swiglu" else gelu_name(cfg)
    return {
        "d_model": cfg.d_model,
        "d_kv": cfg.resolved_head_dim,
        "d_ff": cfg.resolved_d_ff,
        "num_layers": cfg.resolved_n_encoder_layers,
        "num_decoder_layers": cfg.resolved_n_decoder_layers,
        "num_heads": cfg.n_heads,
        "relative_attention_num_buckets": cfg.rel_buckets,
        "relative_attention_max_distance": cfg.rel_max_distance,
        "vocab_size": cfg.vocab_size,
        "feed_forward_proj": "gated-gelu" if gated and act == "gelu_new" else f"{'gated-' if gated else ''}{act}",
        "layer_norm_epsilon": cfg.norm_eps,
        "dropout_rate": cfg.dropout,
        "initializer_factor": cfg.init_std * cfg.d_model**0.5,
        "is_encoder_decoder": True,
        "tie_word_embeddings": cfg.tie_embeddings,
        "scale_decoder_outputs": cfg.tie_embeddings,
        "decoder_start_token_id": cfg.decoder_start_token_id,
        **ids(cfg),
    }


def _t5_class(cfg: ModelConfig, classifier: bool) -> HFClass | None:
    """T5ForConditionalGeneration; a tied head without v1.0's scaling (what transformers 5 builds for a
    v1.1 config) is written untied, the head a copy of the embedding, which every version reads."""
    if classifier:
        return None
    unscaled_tie = cfg.tie_embeddings and cfg.logit_scale == 1.0
    return HFClass("T5ForConditionalGeneration", False, cfg.replace(tie_embeddings=False) if unscaled_tie else cfg)


# ---- the record ------------------------------------------------------------------------------------------
FAMILIES.register("t5")(
    Family(
        _t5_config,
        _t5_weights,
        backbone=("shared", "encoder", "decoder"),
        prefix="transformer",
        defaults={
            "vocab_size": 32128,
            "d_model": 512,
            "d_kv": 64,
            "d_ff": 2048,
            "num_layers": 6,
            "num_decoder_layers": None,
            "num_heads": 8,
            "relative_attention_num_buckets": 32,
            "relative_attention_max_distance": 128,
            "dropout_rate": 0.1,
            "layer_norm_epsilon": 1e-6,
            "initializer_factor": 1.0,
            "feed_forward_proj": "relu",
            "tie_word_embeddings": True,
            "pad_token_id": 0,
            "eos_token_id": 1,
            "decoder_start_token_id": 0,
        },
        write_config=_t5_write,
        unfit=_t5_unfit,
        ignored=BUFFERS,
        architecture=_t5_class,
        auto_classes={"T5ForConditionalGeneration": "AutoModelForSeq2SeqLM"},
    )
)
