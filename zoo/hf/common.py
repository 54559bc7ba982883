"""What the HF family modules share: the saved buffers every family ignores, the checks that list
what a family's transformers classes cannot compute (:func:`differs`, :func:`plain`, :func:`mha`),
the small readers of a zoo config that several config writers use, and :func:`lm_class`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zoo.config import ModelConfig
from zoo.hf.mapping import CAUSAL_LM, Family, HFClass, Mapper
from zoo.registry import MASK

BUFFERS = ("attn.bias", "attn.masked_bias", "position_ids", "rotary_emb.inv_freq")  # saved by old versions
WINDOW = ("sliding_window",)  # zoo's mask for HF's sliding_window, in the families whose classes apply one


# ---- what a family can export ----------------------------------------------------------------------
def differs(cfg: ModelConfig, family: str, **allowed: tuple[Any, ...]) -> list[str]:
    """``field=value (<family> has ...)`` for each field whose value is not among the allowed ones."""
    return [
        f"{name}={getattr(cfg, name)} ({family} has {' or '.join(map(str, values))})"
        for name, values in allowed.items()
        if getattr(cfg, name) not in values
    ]


UNCOMPUTED: dict[str, tuple[Any, ...]] = {  # what no family computes but where it says otherwise
    "embed_scale": (1.0,),
    "qk_norm": ("none",),
    "qk_norm_scope": ("head",),
    "attn_softcap": (None,),
    "final_softcap": (None,),
    "value_residual": (False,),
    "window_pattern": (None,),
    "rope_base_global": (None,),
    "embedding_norm": (False,),
}


def plain(cfg: ModelConfig, family: str, masks: tuple[str, ...] = (), **computed: tuple[Any, ...]) -> list[str]:
    """What no family here computes: a mask other than the form's own (or one of ``masks``, those
    the family's classes also apply), and each setting of :data:`UNCOMPUTED` away from its default
    but where ``computed`` gives the values the family computes (Qwen3: ``qk_norm=("rmsnorm",)``). A
    mask counts as what it computes on one document (``Mask.one_document``): transformers' classes
    have no document mask, but a prompt is one document, and there a document mask computes what
    causal or sliding_window attention does."""
    natural = cfg.form.natural_mask
    computed_mask = MASK.get(cfg.resolved_mask, field="mask").one_document(cfg)
    problems = (
        []
        if computed_mask in (natural, *masks)
        else [f"mask={cfg.mask} ({family} has {' or '.join((natural, *masks))} attention)"]
    )
    return problems + differs(cfg, family, **{**UNCOMPUTED, **computed})


def mha(cfg: ModelConfig, family: str) -> list[str]:
    """What a family with plain multi-head attention cannot compute: fewer key/value heads than
    query heads, or a head size other than d_model / n_heads."""
    problems = (
        []
        if cfg.resolved_n_kv_heads == cfg.n_heads
        else [f"n_kv_heads={cfg.n_kv_heads} ({family} has one key/value head per query head)"]
    )
    if cfg.resolved_head_dim * cfg.n_heads != cfg.d_model:
        problems.append(f"head_dim={cfg.head_dim} ({family} has head_dim = d_model / n_heads)")
    return problems


# ---- what the config writers share --------------------------------------------------------------------
def gelu_name(cfg: ModelConfig) -> str:
    """HF's activation name (ACT2FN) for zoo's ``ffn=relu`` or its GELU of ``gelu_approximate``."""
    return "relu" if cfg.ffn == "relu" else {"none": "gelu", "tanh": "gelu_new"}[cfg.gelu_approximate]


def attn_dropout(cfg: ModelConfig) -> float:
    return cfg.dropout if cfg.attn_dropout is None else cfg.attn_dropout


def ids(cfg: ModelConfig) -> dict[str, Any]:
    return {"pad_token_id": cfg.pad_token_id, "eos_token_id": cfg.eos_token_id}


def lm_class(name: str) -> Callable[[ModelConfig, bool], HFClass | None]:
    """A decoder family whose only class is its LM (no sequence-classification head is written)."""
    return lambda cfg, classifier: None if classifier else HFClass(name, True, cfg)


def decoder_family(
    config: Callable[[Any], ModelConfig],
    weights: Callable[[Mapper, ModelConfig], ModelConfig],
    *,
    defaults: dict[str, Any],
    write_config: Callable[[ModelConfig], dict[str, Any]],
    unfit: Callable[[ModelConfig], list[str]],
    architecture: str,
) -> Family:
    """The record of a decoder family laid out as Llama: the backbone (``embed_tokens``, ``layers``,
    ``norm``) under ``model`` and an LM head, the transformers class ``architecture``."""
    return Family(
        config,
        weights,
        backbone=("embed_tokens", "layers", "norm"),
        prefix="model",
        defaults=defaults,
        write_config=write_config,
        unfit=unfit,
        ignored=BUFFERS,
        architecture=lm_class(architecture),
        auto_classes={architecture: CAUSAL_LM},
    )


def shortest_repeat(letters: str) -> str:
    """The shortest prefix of ``letters`` that, repeated, gives them: a ``window_pattern`` from a list of
    layer kinds ("LGLG" -> "LG", "GLLGLLG" -> "GLL")."""
    n = len(letters)
    return next(letters[:p] for p in range(1, n + 1) if (letters[:p] * n)[:n] == letters)
