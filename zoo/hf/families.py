"""The supported HF families: for each ``model_type`` a config reader (HF -> zoo; its docstring says
what the family becomes), a weight map (run in both directions by zoo.hf.mapping's mappers), a
config writer (zoo -> HF) and the list of zoo settings its transformers classes cannot compute.
GPT-2, BERT and T5 are here, the RoPE decoders (Llama, Mistral, Qwen2) in rope_decoders.py; a new
family is its functions and one ``FAMILIES.register`` line at the end of such a module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zoo.config import ModelConfig
from zoo.hf.mapping import FAMILIES, Family, HFClass, Mapper, activation, first, token_id
from zoo.registry import FFN, MASK

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


def plain(cfg: ModelConfig, family: str, masks: tuple[str, ...] = ()) -> list[str]:
    """What no family here computes: a mask other than the form's own (or one of ``masks``, those
    the family's classes also apply), scaled embeddings. A mask counts as what it computes on one
    document (``Mask.one_document``): transformers' classes have no document mask, but a prompt is
    one document, and there a document mask computes what causal or sliding_window attention does."""
    natural = cfg.form.natural_mask
    computed = MASK.get(cfg.resolved_mask, field="mask").one_document(cfg)
    problems = (
        []
        if computed in (natural, *masks)
        else [f"mask={cfg.mask} ({family} has {' or '.join((natural, *masks))} attention)"]
    )
    return problems + differs(cfg, family, embed_scale=(1.0,))


def _mha(cfg: ModelConfig, family: str) -> list[str]:
    problems = (
        []
        if cfg.resolved_n_kv_heads == cfg.n_heads
        else [f"n_kv_heads={cfg.n_kv_heads} ({family} has one key/value head per query head)"]
    )
    if cfg.resolved_head_dim * cfg.n_heads != cfg.d_model:
        problems.append(f"head_dim={cfg.head_dim} ({family} has head_dim = d_model / n_heads)")
    return problems


def _gelu_name(cfg: ModelConfig) -> str:
    return "relu" if cfg.ffn == "relu" else {"none": "gelu", "tanh": "gelu_new"}[cfg.gelu_approximate]


def attn_dropout(cfg: ModelConfig) -> float:
    return cfg.dropout if cfg.attn_dropout is None else cfg.attn_dropout


def ids(cfg: ModelConfig) -> dict[str, Any]:
    return {"pad_token_id": cfg.pad_token_id, "eos_token_id": cfg.eos_token_id}


# ---- GPT-2 ---------------------------------------------------------------------------------------------
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
        + _mha(cfg, "GPT-2")
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
        "activation_function": _gelu_name(cfg),
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


# ---- BERT ----------------------------------------------------------------------------------------------
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
        + _mha(cfg, "BERT")
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
        "hidden_act": _gelu_name(cfg),
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


# ---- T5 ------------------------------------------------------------------------------------------------
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
    act = "silu" if cfg.ffn == "swiglu" else _gelu_name(cfg)
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


def _t5_class(cfg: ModelConfig, classifier: bool) -> HFClass | None:
    """T5ForConditionalGeneration; a tied head without v1.0's scaling (what transformers 5 builds for a
    v1.1 config) is written untied, the head a copy of the embedding, which every version reads."""
    if classifier:
        return None
    unscaled_tie = cfg.tie_embeddings and cfg.logit_scale == 1.0
    return HFClass("T5ForConditionalGeneration", False, cfg.replace(tie_embeddings=False) if unscaled_tie else cfg)


def lm_class(name: str) -> Callable[[ModelConfig, bool], HFClass | None]:
    """A decoder family whose only class is its LM (no sequence-classification head is written)."""
    return lambda cfg, classifier: None if classifier else HFClass(name, True, cfg)


# ---- the records -----------------------------------------------------------------------------------------
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
    )
)
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
    )
)
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
    )
)
