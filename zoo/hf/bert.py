"""BERT (``model_type: bert``): its config reader, weight map, export rules, config writer and the
classes written (BertModel, BertForMaskedLM, BertForSequenceClassification); the record at the end."""

from __future__ import annotations

from typing import Any

from zoo.config import ModelConfig
from zoo.hf.common import BUFFERS, attn_dropout, differs, gelu_name, ids, mha, plain
from zoo.hf.mapping import FAMILIES, Family, HFClass, Mapper, activation, first, token_id


def _bert_config(c: Any) -> ModelConfig:
    """Encoder, post-LayerNorm (the embedding LayerNorm is the stack's ``embed_norm``), segment
    embeddings; :func:`_bert_weights` keeps the pooler and the masked-LM head if the model has them."""
    kind = getattr(c, "position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(
            f"bert: position_embedding_type={kind!r} is not supported; zoo has learned absolute "
            "positions only (position_embedding_type='absolute')"
        )
    if getattr(c, "is_decoder", False) or getattr(c, "add_cross_attention", False):
        raise ValueError(
            "bert: is_decoder/add_cross_attention (BERT as a causal or seq2seq decoder) is not "
            "supported; zoo imports BERT as an encoder"
        )
    return ModelConfig(
        arch="encoder",
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        d_ff=c.intermediate_size,
        max_seq_len=c.max_position_embeddings,
        position="learned",
        norm="layernorm",
        norm_placement="post",
        **activation(c.hidden_act, gated=False, field="hidden_act"),
        bias=True,
        norm_eps=c.layer_norm_eps,
        type_vocab_size=c.type_vocab_size,
        pooler=True,
        mlm_head=False,
        dropout=c.hidden_dropout_prob,
        attn_dropout=c.attention_probs_dropout_prob,
        init_std=c.initializer_range,
        pad_token_id=first(token_id(c, "pad_token_id"), 0),
        eos_token_id=token_id(c, "eos_token_id"),
    )


def _bert_weights(w: Mapper, cfg: ModelConfig) -> ModelConfig:
    b = w.base
    w.copy("embed", f"{b}embeddings.word_embeddings")
    w.copy("encoder.position.table", f"{b}embeddings.position_embeddings")
    w.copy("segment", f"{b}embeddings.token_type_embeddings")  # to_hf gives a model without them zeros
    w.copy("encoder.embed_norm", f"{b}embeddings.LayerNorm", bias=True)
    for i in range(cfg.n_layers):
        z, h = f"encoder.blocks.{i}", f"{b}encoder.layer.{i}"
        w.fuse(f"{z}.attn.qkv", [f"{h}.attention.self.{p}" for p in ("query", "key", "value")], bias=True)
        w.copy(f"{z}.attn.out", f"{h}.attention.output.dense", bias=True)
        w.copy(f"{z}.attn_res.norm", f"{h}.attention.output.LayerNorm", bias=True)
        w.copy(f"{z}.ffn.fc", f"{h}.intermediate.dense", bias=True)
        w.copy(f"{z}.ffn.proj", f"{h}.output.dense", bias=True)
        w.copy(f"{z}.ffn_res.norm", f"{h}.output.LayerNorm", bias=True)
    pooler = w.has(f"{b}pooler.dense.weight", cfg.pooler)
    if pooler:
        w.copy("pooler", f"{b}pooler.dense", bias=True)
    head = "cls.predictions"
    mlm = w.has(f"{head}.transform.dense.weight", cfg.mlm_head)
    if mlm:
        w.tied_head(f"{head}.decoder.weight", f"{b}embeddings.word_embeddings.weight", "bert's masked-LM decoder")
        w.copy("mlm_head.dense", f"{head}.transform.dense", bias=True)
        w.copy("mlm_head.norm", f"{head}.transform.LayerNorm", bias=True)
        w.tensor("mlm_head.bias", [f"{head}.bias", f"{head}.decoder.bias"])  # one tensor, tied in HF
    return cfg.replace(pooler=pooler, mlm_head=mlm)


def _bert_unfit(cfg: ModelConfig) -> list[str]:
    return (
        differs(cfg, "BERT", arch=("encoder",))
        + plain(cfg, "BERT")
        + mha(cfg, "BERT")
        + differs(
            cfg,
            "BERT",
            position=("learned",),
            norm=("layernorm",),
            norm_placement=("post",),
            ffn=("gelu", "relu"),
            bias=(True,),
            qkv_bias=(None, True),
            attn_scale=(None,),
            logit_scale=(1.0,),
        )
    )


def _bert_write(cfg: ModelConfig) -> dict[str, Any]:
    return {
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "intermediate_size": cfg.resolved_d_ff,
        "hidden_act": gelu_name(cfg),
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_seq_len,
        "type_vocab_size": max(cfg.type_vocab_size, 1),
        "layer_norm_eps": cfg.norm_eps,
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": attn_dropout(cfg),
        "initializer_range": cfg.init_std,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        **ids(cfg),
    }


def _bert_class(cfg: ModelConfig, classifier: bool) -> HFClass:
    """A classifier without the MLM head; an MLM model without the pooler (BertForMaskedLM has none);
    else BertModel, whose pooler is zeros when zoo's model has none (its hidden states are exact)."""
    zeros = {} if cfg.type_vocab_size else {"segment.weight": (1, cfg.d_model)}
    if classifier:
        return HFClass("BertForSequenceClassification", True, cfg.replace(mlm_head=False), zeros)
    if cfg.mlm_head:
        return HFClass("BertForMaskedLM", True, cfg.replace(pooler=False), zeros)
    if not cfg.pooler:
        zeros = {**zeros, "pooler.weight": (cfg.d_model, cfg.d_model), "pooler.bias": (cfg.d_model,)}
    return HFClass("BertModel", False, cfg.replace(pooler=True), zeros)


# ---- the record ------------------------------------------------------------------------------------------
FAMILIES.register("bert")(
    Family(
        _bert_config,
        _bert_weights,
        backbone=("embeddings", "encoder", "pooler"),
        prefix="bert",
        defaults={
            "vocab_size": 30522,
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
            "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1,
            "max_position_embeddings": 512,
            "type_vocab_size": 2,
            "initializer_range": 0.02,
            "layer_norm_eps": 1e-12,
            "pad_token_id": 0,
        },
        write_config=_bert_write,
        unfit=_bert_unfit,
        ignored=BUFFERS,
        architecture=_bert_class,
        auto_classes={
            "BertForSequenceClassification": "AutoModelForSequenceClassification",
            "BertForMaskedLM": "AutoModelForMaskedLM",
            "BertModel": "AutoModel",
        },
    )
)
