"""ModernBERT (Warner et al. 2024, "Smarter, Better, Faster, Longer", https://arxiv.org/abs/2412.13663):
an encoder composed of what zoo has. Pre-LayerNorm without biases (``bias`` covers the attention, the
FFN and the norms alike), its embedding LayerNorm standing in for the first block's attention norm
(``embedding_norm``); GeGLU; RoPE; windowed and global layers as ``layer_types`` says: a windowed
layer sees |i - j| <= local_attention // 2 (``mask=sliding_window``, ``window`` one more), a global
one every position and its own RoPE base (``window_pattern``'s G layers, ``rope_base_global``).
The masked-LM head is zoo's (dense, GELU, norm, the tied embeddings plus a bias): a checkpoint
without ``classifier_bias`` or ``decoder_bias`` reads with zero biases, and is written with them.
Dropout sits where zoo puts it (``embedding_dropout`` -> ``dropout``); the task heads' ``head`` and
``classifier`` are left out. Its config reader, weight map, config writer and export rules; the
record at the end."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from zoo.config import ModelConfig
from zoo.hf.common import BUFFERS, attn_dropout, differs, ids, mha, plain, shortest_repeat
from zoo.hf.mapping import FAMILIES, GELU, Family, HFClass, Mapper, activation, first, token_id
from zoo.hf.rope_decoders import rope_parameters, rope_settings
from zoo.mask import windowed_layers

SLIDING, FULL = "sliding_attention", "full_attention"
THETA = {FULL: 160000.0, SLIDING: 10000.0}  # global_rope_theta, local_rope_theta (configs before transformers 5)


def _layer_types(c: Any) -> str:
    """``layer_types`` (or, before transformers 5, every ``global_attn_every_n_layers``-th layer from
    the first global) as letters: G global, L windowed."""
    every = getattr(c, "global_attn_every_n_layers", 3)
    types = getattr(c, "layer_types", None) or [SLIDING if i % every else FULL for i in range(c.num_hidden_layers)]
    unknown = set(types) - {SLIDING, FULL}
    if unknown or len(types) != c.num_hidden_layers:
        raise ValueError(
            f"modernbert: layer_types={list(types)} is not supported; zoo reads one of {FULL!r} or {SLIDING!r} "
            f"per layer ({c.num_hidden_layers})"
        )
    return "".join("G" if kind == FULL else "L" for kind in types)


def _rope(c: Any, kind: str) -> dict[str, Any]:
    """The RoPE settings of the layers of ``kind``: ``rope_parameters[kind]``, or the base of before."""
    params = dict((getattr(c, "rope_parameters", None) or {}).get(kind) or {})
    legacy = getattr(c, "global_rope_theta" if kind == FULL else "local_rope_theta", THETA[kind])
    params.setdefault("rope_theta", legacy)
    return rope_settings(SimpleNamespace(rope_parameters=params, max_position_embeddings=c.max_position_embeddings))


def _scaling(rope: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in rope.items() if key != "rope_base"}


def _windows(c: Any, letters: str) -> dict[str, Any]:
    """The mask and RoPE bases of ``letters``: every layer global (the encoder's own mask), every one
    windowed, or a pattern (the shortest that, repeated, gives the letters) whose G layers may have
    their own base."""
    full, sliding = _rope(c, FULL), _rope(c, SLIDING)
    if "L" not in letters:
        return full
    if "G" in letters and _scaling(full) != _scaling(sliding):
        raise ValueError(
            f"modernbert: rope_parameters scale the {FULL} and {SLIDING} layers differently ({full} vs {sliding}), "
            "which is not supported; zoo's global layers differ in their base only"
        )
    pattern = shortest_repeat(letters)
    base = full["rope_base"] if "G" in pattern and full["rope_base"] != sliding["rope_base"] else None
    window = dict(mask="sliding_window", window=c.local_attention // 2 + 1)
    return {**sliding, **window, "window_pattern": pattern if "G" in pattern else None, "rope_base_global": base}


def _modernbert_config(c: Any) -> ModelConfig:
    biases = {name: bool(getattr(c, name, False)) for name in ("attention_bias", "mlp_bias", "norm_bias")}
    if len(set(biases.values())) > 1:
        raise ValueError(
            f"modernbert: {', '.join(f'{k}={v}' for k, v in biases.items())} is not supported; zoo's bias covers "
            "the attention, the FFN and the norms together"
        )
    act = activation(c.hidden_activation, gated=True, field="hidden_activation")
    head = GELU.get(c.classifier_activation)
    if head is None or head != act.get("gelu_approximate", head):
        raise ValueError(
            f"modernbert: classifier_activation={c.classifier_activation!r} with hidden_activation="
            f"{c.hidden_activation!r} is not supported; zoo's masked-LM head applies the FFN's GELU"
        )
    return ModelConfig(
        arch="encoder",
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        d_ff=c.intermediate_size,
        max_seq_len=c.max_position_embeddings,
        position="rope",
        **_windows(c, _layer_types(c)),
        norm="layernorm",
        norm_placement="pre",
        embedding_norm=True,
        **{**act, "gelu_approximate": head},
        bias=biases["attention_bias"],
        norm_eps=c.norm_eps,
        dropout=float(c.embedding_dropout or 0.0),
        attn_dropout=float(c.attention_dropout or 0.0),
        init_std=c.initializer_range,
        pad_token_id=first(token_id(c, "pad_token_id"), 0),
        eos_token_id=token_id(c, "eos_token_id"),
    )


def _modernbert_weights(w: Mapper, cfg: ModelConfig) -> ModelConfig:
    """Wqkv is zoo's fused q|k|v and Wi its [gate; up] (HF activates Wi's first half) as they are."""
    b, bias = w.base, cfg.bias
    w.copy("embed", f"{b}embeddings.tok_embeddings")
    w.copy("encoder.embed_norm", f"{b}embeddings.norm", bias=bias)
    for i in range(cfg.n_layers):
        z, h = f"encoder.blocks.{i}", f"{b}layers.{i}"
        if i:  # layer 0's attn_norm is an Identity: the embedding norm stands in for it
            w.copy(f"{z}.attn_res.norm", f"{h}.attn_norm", bias=bias)
        w.copy(f"{z}.attn.qkv", f"{h}.attn.Wqkv", bias=bias)
        w.copy(f"{z}.attn.out", f"{h}.attn.Wo", bias=bias)
        w.copy(f"{z}.ffn_res.norm", f"{h}.mlp_norm", bias=bias)
        w.copy(f"{z}.ffn.fc", f"{h}.mlp.Wi", bias=bias)
        w.copy(f"{z}.ffn.proj", f"{h}.mlp.Wo", bias=bias)
    w.copy("encoder.final_norm", f"{b}final_norm", bias=bias)
    mlm = w.has("head.dense.weight", cfg.mlm_head) and not w.has("classifier.weight", False)  # task heads: left out
    if mlm:
        w.tied_head("decoder.weight", f"{b}embeddings.tok_embeddings.weight", "modernbert's masked-LM decoder")
        w.copy("mlm_head.norm", "head.norm", bias=bias)
        w.copy("mlm_head.dense", "head.dense")
        _bias_or_zeros(w, "mlm_head.dense.bias", "head.dense.bias", "mlm_head.dense.weight")
        _bias_or_zeros(w, "mlm_head.bias", "decoder.bias", "embed.weight")
    return cfg.replace(mlm_head=mlm)


def _bias_or_zeros(w: Mapper, zoo: str, hf: str, weight: str) -> None:
    """A bias zoo's head always has: ``hf`` where the checkpoint holds it (written always), else zeros
    as many as the rows of the zoo ``weight`` read before (``classifier_bias``/``decoder_bias`` false)."""
    if w.has(hf, True):
        w.tensor(zoo, [hf])
        return
    rows = w.out[weight]  # the importer: the exporter's has() is the config's, always True here
    w.out[zoo] = torch.zeros(rows.shape[0], dtype=rows.dtype, device=rows.device)


def _modernbert_unfit(cfg: ModelConfig) -> list[str]:
    return (
        differs(cfg, "ModernBERT", arch=("encoder",))
        + plain(
            cfg,
            "ModernBERT",
            ("sliding_window",),
            window_pattern=(cfg.window_pattern,),
            rope_base_global=(cfg.rope_base_global,),
            embedding_norm=(True,),
        )
        + mha(cfg, "ModernBERT")
        + differs(
            cfg,
            "ModernBERT",
            position=("rope",),
            norm=("layernorm",),
            norm_placement=("pre",),
            ffn=("geglu", "swiglu"),
            rope_scaling=("none", "linear", "yarn"),
            qkv_bias=(None, cfg.bias),
            attn_scale=(None,),
            logit_scale=(1.0,),
            pooler=(False,),
            type_vocab_size=(0,),
        )
    )


def _modernbert_write(cfg: ModelConfig) -> dict[str, Any]:
    types = [SLIDING if windowed else FULL for windowed in windowed_layers(cfg)]
    gelu = {"none": "gelu", "tanh": "gelu_pytorch_tanh"}[cfg.gelu_approximate]
    wide = cfg.replace(rope_base=cfg.rope_base if cfg.rope_base_global is None else cfg.rope_base_global)
    return {
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "intermediate_size": cfg.resolved_d_ff,
        "hidden_activation": "silu" if cfg.ffn == "swiglu" else gelu,
        "classifier_activation": gelu,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_seq_len or 8192,
        "norm_eps": cfg.norm_eps,
        "layer_types": types,
        "local_attention": 2 * (cfg.window - 1) if cfg.window is not None else 128,
        "rope_parameters": {FULL: rope_parameters(wide), SLIDING: rope_parameters(cfg)},
        **dict.fromkeys(("attention_bias", "mlp_bias", "norm_bias"), cfg.bias),
        "classifier_bias": True,
        "decoder_bias": True,
        "embedding_dropout": cfg.dropout,
        "attention_dropout": attn_dropout(cfg),
        "mlp_dropout": 0.0,
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": True,
        "bos_token_id": None,
        "cls_token_id": None,
        "sep_token_id": cfg.eos_token_id,
        **ids(cfg),
    }


def _modernbert_class(cfg: ModelConfig, classifier: bool) -> HFClass | None:
    """ModernBertForMaskedLM with the masked-LM head, else ModernBertModel; no classifier is written
    (ModernBertForSequenceClassification pools through a head of its own, not zoo's pooler)."""
    if classifier:
        return None
    if cfg.mlm_head:
        return HFClass("ModernBertForMaskedLM", True, cfg)
    return HFClass("ModernBertModel", False, cfg)


_MODERNBERT_DEFAULTS = {
    "vocab_size": 50368,
    "hidden_size": 768,
    "intermediate_size": 1152,
    "num_hidden_layers": 22,
    "num_attention_heads": 12,
    "hidden_activation": "gelu",
    "max_position_embeddings": 8192,
    "initializer_range": 0.02,
    "norm_eps": 1e-5,
    "norm_bias": False,
    "pad_token_id": 50283,
    "eos_token_id": 50282,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "layer_types": None,
    "rope_parameters": None,
    "local_attention": 128,
    "embedding_dropout": 0.0,
    "mlp_bias": False,
    "classifier_activation": "gelu",
    "tie_word_embeddings": True,
    "global_attn_every_n_layers": 3,
    "global_rope_theta": THETA[FULL],
    "local_rope_theta": THETA[SLIDING],
}

FAMILIES.register("modernbert")(
    Family(
        _modernbert_config,
        _modernbert_weights,
        backbone=("embeddings", "layers", "final_norm"),
        prefix="model",
        defaults=_MODERNBERT_DEFAULTS,
        write_config=_modernbert_write,
        unfit=_modernbert_unfit,
        ignored=BUFFERS,
        architecture=_modernbert_class,
        auto_classes={"ModernBertForMaskedLM": "AutoModelForMaskedLM", "ModernBertModel": "AutoModel"},
    )
)
