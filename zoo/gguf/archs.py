"""The :class:`~zoo.gguf.names.Arch` records of zoo.hf's newer families: llama.cpp's ``qwen3``, ``gemma2``
and ``olmo2``, and Mixtral, which llama.cpp runs as ``llama`` with its MoE tensors (``ffn_gate_inp``,
``ffn_{gate,up,down}_exps``; its converter writes ``llama.expert_count``, which picks this record when
a ``llama`` file is read). zoo/gguf/__init__.py imports this module, so every door into zoo.gguf sees them.

What llama.cpp computes, for the ``unfit`` lists (its src/models/*.cpp and llama-model.cpp):

- all four rotate NeoX-style, as HF, except Mixtral's ``llama`` (q/k rows permuted, as for Llama);
- ``qwen3``: an RMSNorm over each head's q and k before RoPE; causal attention;
- ``olmo2``: norms on the sublayers' outputs only, one RMSNorm over all heads' q and one over all k;
  its head is required (``output.weight``), so a tied one is written as a copy; causal attention;
- ``gemma2``: the embeddings scaled by sqrt(d_model), sandwich norms of gain 1 + w (stored so),
  GeGLU with the tanh GELU, both soft-caps always applied (50 and 30 where the file names none), a
  window over layers 0, 2, 4, ... (``sliding_window``, 4096 where absent), the head tied to the
  embeddings, and scores scaled by head_dim^-1/2, or (d_model / n_heads)^-1/2 in a 46-layer model;
- Mixtral (``llama``; https://arxiv.org/abs/2401.04088): softmax router, the top ``expert_used_count``
  experts' weights renormalised; causal attention (no sliding window).
"""

from __future__ import annotations

from typing import Any

from zoo.config import ModelConfig
from zoo.gguf.names import (
    _ROPE_KEYS,
    _ROPE_SLOTS,
    ARCHS,
    EXPERTS,
    NORM_1P,
    PLAIN,
    ROPE_K,
    ROPE_Q,
    Arch,
    Key,
    Slot,
    _common,
)
from zoo.mask import windowed_layers
from zoo.ranges import POSITIVE

GEMMA2_27B_LAYERS = 46  # llama.cpp takes a 46-layer gemma2 for the 27B and scales its scores by d_model / n_heads


# ---- what llama.cpp does not compute (beyond what the HF family refuses) ---------------------------
def gemma2_scalar(n_layers: int, d_model: int, n_heads: int, head_dim: int) -> int:
    """The ``query_pre_attn_scalar`` llama.cpp's gemma2 uses (scores scaled by its -1/2 power): the
    head size, or d_model // n_heads in a 46-layer model (Gemma 2 27B's 144, not its head size 128;
    Gemma Team 2024, https://arxiv.org/abs/2408.00118, Table 1)."""
    return d_model // n_heads if n_layers == GEMMA2_27B_LAYERS else head_dim


def _gemma2_implied(values: dict[str, Any]) -> dict[str, Any]:
    layers, d, heads = values["num_hidden_layers"], values["hidden_size"], values["num_attention_heads"]
    return {"query_pre_attn_scalar": gemma2_scalar(layers, d, heads, values.get("head_dim") or d // heads)}


def _gemma2_unfit(cfg: ModelConfig) -> list[str]:
    problems = []
    if windowed_layers(cfg) != [i % 2 == 0 for i in range(cfg.n_layers)]:
        problems.append(
            f"mask={cfg.resolved_mask}, window_pattern={cfg.window_pattern} (llama.cpp's gemma2 has a window over "
            "every other layer, the first included: mask=sliding_window, window_pattern=LG)"
        )
    for name, default in (("attn_softcap", 50), ("final_softcap", 30)):
        if getattr(cfg, name) is None:
            problems.append(
                f"{name}=None (llama.cpp's gemma2 always soft-caps, by {default} where a file names no cap)"
            )
    if cfg.ffn != "geglu" or cfg.gelu_approximate != "tanh":
        problems.append(
            f"ffn={cfg.ffn}, gelu_approximate={cfg.gelu_approximate} (llama.cpp's gemma2 has GeGLU with the tanh GELU)"
        )
    if not cfg.tie_embeddings:
        problems.append("tie_embeddings=False (llama.cpp's gemma2 ties its head to the embeddings)")
    head_dim = cfg.resolved_head_dim
    scalar = head_dim if cfg.attn_scale is None else cfg.attn_scale**-2
    wanted = gemma2_scalar(cfg.n_layers, cfg.d_model, cfg.n_heads, head_dim)
    if abs(scalar - wanted) > 1e-6 * wanted:
        problems.append(
            f"attn_scale={cfg.attn_scale} (llama.cpp's gemma2 scales scores by {wanted}^-1/2 in a {cfg.n_layers}-layer "
            f"model: head_dim^-1/2, or (d_model / n_heads)^-1/2 with {GEMMA2_27B_LAYERS} layers)"
        )
    return problems


# ---- the records ----------------------------------------------------------------------------------------
def _block(name: str, hf: str, layout: str = PLAIN) -> Slot:
    """The slot of block tensor ``blk.{i}.<name>`` <-> ``model.layers.{i}.<hf>``."""
    return Slot(f"blk.{{i}}.{name}", f"model.layers.{{i}}.{hf}", layout)


_ATTENTION = (
    _block("attn_q", "self_attn.q_proj", ROPE_Q),
    _block("attn_k", "self_attn.k_proj", ROPE_K),
    _block("attn_v", "self_attn.v_proj"),
    _block("attn_output", "self_attn.o_proj"),
)
_QK_NORMS = (_block("attn_q_norm", "self_attn.q_norm"), _block("attn_k_norm", "self_attn.k_norm"))
_SWIGLU = (_block("ffn_gate", "mlp.gate_proj"), _block("ffn_up", "mlp.up_proj"), _block("ffn_down", "mlp.down_proj"))
_EMBEDDING, _OUTPUT_NORM, _OUTPUT = (
    Slot("token_embd", "model.embed_tokens"),
    Slot("output_norm", "model.norm"),
    Slot("output", "lm_head"),
)

_OLMO2_SLOTS = (
    _EMBEDDING,
    *_ATTENTION,
    *_QK_NORMS,
    _block("post_attention_norm", "post_attention_layernorm"),  # HF's name, on the attention's output here
    *_SWIGLU,
    _block("post_ffw_norm", "post_feedforward_layernorm"),
    _OUTPUT_NORM,
    _OUTPUT,
)
_GEMMA2_SLOTS = (
    _EMBEDDING,
    _block("attn_norm", "input_layernorm", NORM_1P),
    *_ATTENTION,
    _block("post_attention_norm", "post_attention_layernorm", NORM_1P),
    _block("ffn_norm", "pre_feedforward_layernorm", NORM_1P),
    *_SWIGLU,
    _block("post_ffw_norm", "post_feedforward_layernorm", NORM_1P),
    Slot("output_norm", "model.norm", NORM_1P),
)
_MIXTRAL_SLOTS = (
    _EMBEDDING,
    _block("attn_norm", "input_layernorm"),
    *_ATTENTION,
    _block("ffn_norm", "post_attention_layernorm"),
    _block("ffn_gate_inp", "block_sparse_moe.gate"),  # the router
    _block("ffn_gate_exps", "block_sparse_moe.experts.w1", EXPERTS),
    _block("ffn_up_exps", "block_sparse_moe.experts.w3", EXPERTS),
    _block("ffn_down_exps", "block_sparse_moe.experts.w2", EXPERTS),
    _OUTPUT_NORM,
    _OUTPUT,
)

ARCHS.register("qwen3")(
    Arch(
        "qwen3",
        "qwen3",
        _ROPE_KEYS,
        (*_ROPE_SLOTS, *_QK_NORMS),
        fixed={"hidden_act": "silu", "use_sliding_window": False, "attention_bias": False},
        unfit=lambda cfg: _common(cfg, "qwen3"),
    )
)
ARCHS.register("olmo2")(
    Arch(
        "olmo2",
        "olmo2",
        _ROPE_KEYS,
        _OLMO2_SLOTS,
        fixed={"hidden_act": "silu", "attention_bias": False},
        output_copy=True,
        unfit=lambda cfg: _common(cfg, "olmo2"),
    )
)
ARCHS.register("gemma2")(
    Arch(
        "gemma2",
        "gemma2",
        (
            *_ROPE_KEYS,
            Key("attn_logit_softcapping", "attn_logit_softcapping", "float", required=False, within=POSITIVE),
            Key("final_logit_softcapping", "final_logit_softcapping", "float", required=False, within=POSITIVE),
            Key("sliding_window", "attention.sliding_window", required=False),
        ),
        _GEMMA2_SLOTS,
        fixed={"hidden_activation": "gelu_pytorch_tanh", "attention_bias": False},
        implied=_gemma2_implied,
        unfit=_gemma2_unfit,
    )
)
ARCHS.register("mixtral")(
    Arch(
        "llama",
        "mixtral",
        (
            *_ROPE_KEYS,
            Key("num_local_experts", "expert_count"),
            Key("num_experts_per_tok", "expert_used_count"),
        ),
        _MIXTRAL_SLOTS,
        fixed={"hidden_act": "silu", "sliding_window": None, "output_router_logits": False},
        interleaved=True,
        requires="expert_count",
        unfit=lambda cfg: _common(cfg, "llama"),
    )
)
