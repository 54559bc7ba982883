"""OLMo 2 (Team OLMo 2024, "2 OLMo 2 Furious", https://arxiv.org/abs/2501.00656): Llama's layout with
its norms moved onto the sublayers' outputs (``norm_placement=res_post``: x + norm(f(x)), no norm on a
sublayer's input) and an RMSNorm over all heads' queries and over all heads' keys at once, before RoPE
(``qk_norm=rmsnorm``, ``qk_norm_scope=all``; Qwen3 normalises each head apart). Its config reader,
weight map, config writer and export rules; the record at the end."""

from __future__ import annotations

from typing import Any

from zoo.config import ModelConfig
from zoo.hf.common import decoder_family, differs, plain
from zoo.hf.mapping import FAMILIES, Mapper
from zoo.hf.rope_decoders import _rope_decoder_config, _unbiased_write


def _olmo2_config(c: Any) -> ModelConfig:
    if getattr(c, "attention_bias", False):
        raise ValueError("olmo2: attention_bias=True is not supported; zoo's OLMo 2 has no biases")
    cfg = _rope_decoder_config(c, bias=False, qkv_bias=None)
    return cfg.replace(norm_placement="res_post", qk_norm="rmsnorm", qk_norm_scope="all")


def _olmo2_weights(w: Mapper, cfg: ModelConfig) -> ModelConfig:
    b, hd, kv = w.base, cfg.resolved_head_dim, cfg.resolved_n_kv_heads
    w.copy("embed", f"{b}embed_tokens")
    for i in range(cfg.n_layers):
        z, h = f"decoder.blocks.{i}", f"{b}layers.{i}"
        w.fuse(f"{z}.attn.qkv", [f"{h}.self_attn.{p}_proj" for p in "qkv"], sizes=[cfg.n_heads * hd, kv * hd, kv * hd])
        w.copy(f"{z}.attn.q_norm", f"{h}.self_attn.q_norm")
        w.copy(f"{z}.attn.k_norm", f"{h}.self_attn.k_norm")
        w.copy(f"{z}.attn.out", f"{h}.self_attn.o_proj")
        w.copy(f"{z}.attn_res.norm_out", f"{h}.post_attention_layernorm")
        w.fuse(f"{z}.ffn.fc", [f"{h}.mlp.gate_proj", f"{h}.mlp.up_proj"])
        w.copy(f"{z}.ffn.proj", f"{h}.mlp.down_proj")
        w.copy(f"{z}.ffn_res.norm_out", f"{h}.post_feedforward_layernorm")
    w.copy("decoder.final_norm", f"{b}norm")
    return w.lm_head(cfg, f"{b}embed_tokens.weight")


def _olmo2_unfit(cfg: ModelConfig) -> list[str]:
    problems = (
        differs(cfg, "OLMo 2", arch=("decoder",))
        + plain(cfg, "OLMo 2", qk_norm=("rmsnorm",), qk_norm_scope=("all",))
        + differs(
            cfg,
            "OLMo 2",
            position=("rope",),
            norm=("rmsnorm",),
            norm_placement=("res_post",),
            ffn=("swiglu",),
            rope_scaling=("none", "linear", "yarn"),
            attn_scale=(None,),
            logit_scale=(1.0,),
            bias=(False,),
            qkv_bias=(None, False),
        )
    )
    if cfg.resolved_head_dim * cfg.n_heads != cfg.d_model:
        problems.append(f"head_dim={cfg.head_dim} (OLMo 2 has head_dim = d_model / n_heads)")
    return problems


def _olmo2_write(cfg: ModelConfig) -> dict[str, Any]:
    written = {**_unbiased_write(cfg), "attention_bias": False}
    written.pop("head_dim")
    return written


_OLMO2_DEFAULTS = {
    "vocab_size": 50304,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "pad_token_id": 1,
    "bos_token_id": None,
    "eos_token_id": 50279,
}

FAMILIES.register("olmo2")(
    decoder_family(
        _olmo2_config,
        _olmo2_weights,
        defaults=_OLMO2_DEFAULTS,
        write_config=_olmo2_write,
        unfit=_olmo2_unfit,
        architecture="Olmo2ForCausalLM",
    )
)
