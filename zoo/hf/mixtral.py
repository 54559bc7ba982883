"""Mixtral (``model_type: mixtral``; Jiang et al. 2024, https://arxiv.org/abs/2401.04088): Mistral's
layout (RoPE, RMSNorm, pre-norm, GQA, no biases, an optional sliding window over every layer) with a
sparse mixture-of-experts block in place of the SwiGLU: zoo's ``ffn=moe`` (zoo/moe.py) with the top-k
weights renormalised and no shared expert. Its config reader, weight map, config writer and export
rules, and the record.

Weights come in two layouts, both read. A folder, as ``save_pretrained`` writes it in transformers 4.x
and 5, and 4.x's modules hold each expert apart: ``block_sparse_moe.experts.<e>.w1|w3|w2`` (gate, up,
down) beside the router ``block_sparse_moe.gate``. transformers 5's loaded modules hold them stacked,
``mlp.experts.gate_up_proj`` (E, 2F, D) and ``mlp.experts.down_proj`` (E, D, F) beside ``mlp.gate``:
zoo's own layout. zoo writes the folder layout, which both versions load.

The router's training losses differ. transformers adds its load-balancing loss only with
``output_router_logits``, weighted by ``router_aux_loss_coef``, computed once over every layer's
pooled statistics and with the assignment fractions f_e summing to top_k; zoo's ``moe_aux_loss`` is
computed per layer with f_e summing to 1 and summed over the layers. Where every layer routes alike
the two are equal with moe_aux_loss_coef = router_aux_loss_coef * top_k / n_layers: the conversion
both ways (without ``output_router_logits``, 0: no balancing, as transformers trains). Mixtral has no
z-loss: ``moe_z_loss_coef`` reads as 0, and zoo's is not written (it changes training, never what the
model computes).
"""

from __future__ import annotations

import warnings
from typing import Any

from zoo.config import ModelConfig
from zoo.hf.common import decoder_family
from zoo.hf.families import WINDOW, differs
from zoo.hf.mapping import FAMILIES, Mapper
from zoo.hf.rope_decoders import _mistral_config, _mistral_write, _rope_decoder_unfit


def _mixtral_config(c: Any) -> ModelConfig:
    """Mistral's config (:func:`zoo.hf.rope_decoders._mistral_config`) with its SwiGLU made
    ``num_local_experts`` experts, ``num_experts_per_tok`` per token."""
    if c.hidden_act not in ("silu", "swish"):
        raise ValueError(
            f"mixtral: hidden_act={c.hidden_act!r} experts are not supported; zoo's ffn=moe has SwiGLU (silu) experts"
        )
    if getattr(c, "router_jitter_noise", 0.0):
        warnings.warn(
            f"zoo.from_hf_config: router_jitter_noise={c.router_jitter_noise} (noise on the router's input while "
            "training) is not reproduced; the model computes the same, fine-tuning in zoo trains without it",
            stacklevel=4,
        )
    top_k, balancing = c.num_experts_per_tok, getattr(c, "output_router_logits", False)
    return _mistral_config(c).replace(
        ffn="moe",
        n_experts=c.num_local_experts,
        moe_top_k=top_k,
        moe_renormalize=True,
        moe_shared_expert=False,
        moe_aux_loss_coef=float(c.router_aux_loss_coef * top_k / c.num_hidden_layers) if balancing else 0.0,
        moe_z_loss_coef=0.0,
    )


def _mixtral_weights(w: Mapper, cfg: ModelConfig) -> ModelConfig:
    b = w.base
    hd, kv = cfg.resolved_head_dim, cfg.resolved_n_kv_heads
    w.copy("embed", f"{b}embed_tokens")
    for i in range(cfg.n_layers):
        z, h = f"decoder.blocks.{i}", f"{b}layers.{i}"
        w.copy(f"{z}.attn_res.norm", f"{h}.input_layernorm")
        w.fuse(f"{z}.attn.qkv", [f"{h}.self_attn.{p}_proj" for p in "qkv"], sizes=[cfg.n_heads * hd, kv * hd, kv * hd])
        w.copy(f"{z}.attn.out", f"{h}.self_attn.o_proj")
        w.copy(f"{z}.ffn_res.norm", f"{h}.post_attention_layernorm")
        _experts(w, f"{z}.ffn", h, cfg.n_experts)
    w.copy("decoder.final_norm", f"{b}norm")
    return w.lm_head(cfg, f"{b}embed_tokens.weight")


def _experts(w: Mapper, zoo: str, hf: str, n: int) -> None:
    """Layer ``hf``'s router and ``n`` experts <-> zoo's MoE ``zoo``: stacked where the HF tensors are
    (a transformers 5 module), else one expert at a time (a folder, transformers 4.x, and what zoo writes)."""
    if w.has(f"{hf}.mlp.experts.gate_up_proj", cfg_says=False):
        w.copy(f"{zoo}.router", f"{hf}.mlp.gate")
        w.tensor(f"{zoo}.experts.fc.weight", [f"{hf}.mlp.experts.gate_up_proj"])  # (E, 2F, D): [gate; up]
        w.tensor(f"{zoo}.experts.proj.weight", [f"{hf}.mlp.experts.down_proj"])  # (E, D, F)
        return
    moe = f"{hf}.block_sparse_moe"
    w.copy(f"{zoo}.router", f"{moe}.gate")
    w.stack(f"{zoo}.experts.fc", [[f"{moe}.experts.{e}.w1", f"{moe}.experts.{e}.w3"] for e in range(n)])
    w.stack(f"{zoo}.experts.proj", [[f"{moe}.experts.{e}.w2"] for e in range(n)])


def _mixtral_unfit(cfg: ModelConfig) -> list[str]:
    """Mistral's rules for everything but the FFN (checked as if it were the SwiGLU they expect), then
    Mixtral's sparse block: ffn=moe, the top-k weights renormalised, no shared expert."""
    dense = _rope_decoder_unfit(cfg.replace(ffn="swiglu"), "Mixtral", WINDOW, bias=(False,), qkv_bias=(None, False))
    return dense + differs(cfg, "Mixtral", ffn=("moe",), moe_renormalize=(True,), moe_shared_expert=(False,))


def _mixtral_write(cfg: ModelConfig) -> dict[str, Any]:
    balancing = cfg.moe_aux_loss_coef > 0
    coef = cfg.moe_aux_loss_coef * cfg.n_layers / cfg.moe_top_k
    return {
        **_mistral_write(cfg),
        "num_local_experts": cfg.n_experts,
        "num_experts_per_tok": cfg.moe_top_k,
        "output_router_logits": balancing,
        "router_aux_loss_coef": coef if balancing else _MIXTRAL_DEFAULTS["router_aux_loss_coef"],
        "router_jitter_noise": 0.0,
    }


_MIXTRAL_DEFAULTS = {  # MixtralConfig's
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "rope_theta": 1e6,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "sliding_window": None,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
    "router_jitter_noise": 0.0,
}

FAMILIES.register("mixtral")(
    decoder_family(
        _mixtral_config,
        _mixtral_weights,
        defaults=_MIXTRAL_DEFAULTS,
        write_config=_mixtral_write,
        unfit=_mixtral_unfit,
        architecture="MixtralForCausalLM",
    )
)
