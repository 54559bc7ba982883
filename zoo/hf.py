"""Import Hugging Face ``transformers`` models: their configs as a :class:`ModelConfig`, their
weights into the zoo model of that config.

    hf = transformers.AutoModelForCausalLM.from_pretrained(path)
    model = zoo.from_hf(hf)  # same weights and dtype, eval mode
    cfg = zoo.from_hf_config(hf.config)  # the config alone

Supported ``model_type``s: ``bert``, ``gpt2``, ``llama``, ``qwen2``, ``t5``, one :class:`Family`
record each in the registry :data:`FAMILIES`: a config reader such as ``_gpt2_config`` (the readers'
docstrings say what each family becomes) and a weight mapper such as ``_gpt2_weights``. HF's
separate projections are fused into zoo's single matmuls by stacking rows (:meth:`_Weights.fuse`).
``transformers`` is optional; nothing here imports it (the caller's objects are only read).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from zoo.config import ModelConfig
from zoo.models import ZooModel, build_model
from zoo.registry import FFN, Registry

_GELU = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}  # HF ACT2FN name -> gelu_approximate


@dataclass(frozen=True)
class Family:
    """How zoo imports one HF ``model_type``: the record :data:`FAMILIES` holds under that name."""

    config: Callable[[Any], ModelConfig]  # HF config -> ModelConfig; ValueError names a setting zoo lacks
    weights: Callable[[_Weights, ModelConfig], ModelConfig]  # fill the state dict; cfg fitted to the heads found
    backbone: tuple[str, ...]  # top-level modules of the backbone: an unused parameter under one is an error


FAMILIES: Registry[Family] = Registry("HF model_type")  # filled at the end of this module


def from_hf_config(hf_config: Any) -> ModelConfig:
    """A validated :class:`ModelConfig` with the sizes and components of a ``transformers`` config.

    Heads depend on the model class, not on its config: a BERT config gives ``pooler=True`` and
    ``mlm_head=False`` (the ``BertModel`` layout), and a decoder's head tying follows
    ``tie_word_embeddings``. :func:`from_hf` adjusts both to the weights the model actually has.

    Raises:
        ValueError: for a model type not registered in ``FAMILIES``, or a setting of a supported
            one that zoo cannot reproduce (named in the message).
    """
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in FAMILIES:
        raise ValueError(f"model_type={model_type!r} is not supported by zoo.from_hf; supported model types: "
                         f"{', '.join(FAMILIES.names())}")
    return FAMILIES.get(model_type).config(hf_config).validate()


def from_hf(hf_model: nn.Module) -> ZooModel:
    """The zoo model computing what ``hf_model`` computes: its weights (copied, same dtype and
    device) loaded with ``load_state_dict(strict=True)``, in eval mode.

    Accepts the bare models (``GPT2Model``, ``BertModel``, ``T5Model``, ``LlamaModel``...), the LM
    models (``GPT2LMHeadModel``, ``BertForMaskedLM``, ``T5ForConditionalGeneration``,
    ``LlamaForCausalLM``, ``Qwen2ForCausalLM``) and task models wrapping those backbones, whose
    task heads are left out with a warning.
    """
    cfg = from_hf_config(hf_model.config)
    family = FAMILIES.get(hf_model.config.model_type)
    weights = _Weights(hf_model)
    cfg = family.weights(weights, cfg)
    weights.check_leftovers(type(hf_model).__name__, family.backbone)
    with torch.device("meta"):  # no allocation: the copied HF tensors become the parameters
        model = build_model(cfg)
    model.load_state_dict(weights.out, strict=True, assign=True)
    unset = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if unset:
        raise RuntimeError(f"zoo.from_hf left tensors without values: {unset[:5]}")
    return model.eval()


# ---- shared by the families ----------------------------------------------------------------------
def _activation(name: str, *, gated: bool, field: str) -> dict[str, str]:
    """An HF activation name (and whether it gates a GLU) -> zoo's ``ffn`` and ``gelu_approximate``."""
    if name == "relu" and not gated:
        return {"ffn": "relu"}
    if name in _GELU:
        return {"ffn": "geglu" if gated else "gelu", "gelu_approximate": _GELU[name]}
    if name in ("silu", "swish") and gated:
        return {"ffn": "swiglu"}
    supported = ", ".join([*_GELU, "silu"] if gated else ["relu", *_GELU])
    raise ValueError(f"{field}: activation {name!r} ({'gated' if gated else 'not gated'}) has no zoo FFN; "
                     f"supported: {supported}")


def _rope(c: Any) -> dict[str, Any]:
    """RoPE settings from ``rope_parameters`` (transformers 5) or ``rope_theta``/``rope_scaling`` (4.x)."""
    params = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {})
    base = float(params.get("rope_theta", getattr(c, "rope_theta", 10000.0)))
    partial = params.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", 1.0))
    if partial not in (None, 1.0):
        raise ValueError(f"partial_rotary_factor={partial} is not supported; zoo rotates the whole head")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return {"rope_base": base}
    if kind == "linear":
        return {"rope_base": base, "rope_scaling": "linear", "rope_scaling_factor": float(params["factor"])}
    raise ValueError(f"rope_type={kind!r} is not supported; supported: 'default', 'linear' (zoo's 'ntk' is a "
                     "fixed NTK-aware base, not HF's length-dependent 'dynamic')")


def _token_id(c: Any, name: str) -> int | None:
    """A special token id from the config; lists give their first id; ids outside the vocabulary
    (as in a shrunk test config) are dropped with a warning."""
    value = getattr(c, name, None)
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    if value is None:
        return None
    if not 0 <= value < c.vocab_size:
        warnings.warn(f"zoo.from_hf_config: {name}={value} lies outside vocab_size={c.vocab_size}; "
                      "left unset", stacklevel=4)
        return None
    return int(value)


def _first(*values: int | None) -> int:
    return next(v for v in values if v is not None)


class _Weights:
    """The HF model's parameters by name, and the zoo state dict being filled from them.

    ``base`` is the prefix of the backbone inside a task model (``"transformer."`` in
    ``GPT2LMHeadModel``, ``"bert."`` in ``BertForMaskedLM``), empty for a bare model. Parameters
    are recorded as used by identity, so a tied one (the LM head sharing the embedding) counts once.
    """

    def __init__(self, hf_model: nn.Module) -> None:
        base_model = getattr(hf_model, "base_model", hf_model)
        self.base = "" if base_model is hf_model else f"{hf_model.base_model_prefix}."
        self.model = hf_model
        self.params: dict[str, nn.Parameter] = dict(hf_model.named_parameters(remove_duplicate=False))
        self.used: set[int] = set()
        self.out: dict[str, Tensor] = {}

    def take(self, name: str) -> Tensor:
        """A detached copy of parameter ``name`` (a full name, base prefix included)."""
        if name not in self.params:
            raise ValueError(f"zoo.from_hf: the HF model has no parameter {name!r}")
        param = self.params[name]
        self.used.add(id(param))
        return param.detach().clone()

    def tied(self, a: str, b: str) -> bool:
        """Whether two parameters are one tensor (tied weights)."""
        pa, pb = self.params[a], self.params[b]
        return pa is pb or (pa.data_ptr() == pb.data_ptr() and pa.shape == pb.shape)

    def copy(self, zoo: str, hf: str, *, bias: bool = False, transpose: bool = False) -> None:
        """zoo.weight (and .bias) <- hf.weight (and .bias). ``transpose`` turns HF's (in, out)
        ``Conv1D`` weight into an (out, in) ``nn.Linear`` weight."""
        weight = self.take(f"{hf}.weight")
        self.out[f"{zoo}.weight"] = weight.t().contiguous() if transpose else weight
        if bias:
            self.out[f"{zoo}.bias"] = self.take(f"{hf}.bias")

    def fuse(self, zoo: str, hfs: list[str], *, bias: bool = False) -> None:
        """One zoo linear from the rows of several HF linears stacked in order (q|k|v, k|v, gate|up)."""
        self.out[f"{zoo}.weight"] = torch.cat([self.take(f"{hf}.weight") for hf in hfs])  # (sum out, in)
        if bias:
            self.out[f"{zoo}.bias"] = torch.cat([self.take(f"{hf}.bias") for hf in hfs])

    def lm_head(self, cfg: ModelConfig, embedding: str) -> ModelConfig:
        """Tie zoo's LM head when HF's ``lm_head`` is the embedding tensor, else copy it. A model
        without an LM head gets zoo's tied one (its outputs before the head are exact)."""
        if "lm_head.weight" not in self.params:
            if not cfg.tie_embeddings:
                warnings.warn("zoo.from_hf: the HF model has no lm_head and its config does not tie it; zoo's "
                              "LM head is tied to the embeddings, so only hidden states match", stacklevel=3)
            return cfg.replace(tie_embeddings=True)
        if self.tied("lm_head.weight", embedding):
            self.used.add(id(self.params["lm_head.weight"]))
            return cfg.replace(tie_embeddings=True)
        self.copy("lm_head", "lm_head")
        return cfg.replace(tie_embeddings=False)

    def check_leftovers(self, model_name: str, roots: tuple[str, ...]) -> None:
        """Unused backbone parameters mean a feature zoo lacks (an error); unused parameters
        outside the backbone are a task head that zoo's library model leaves out (a warning)."""
        names = [n for n, p in self.model.named_parameters() if id(p) not in self.used]  # tied tensors once
        backbone = [n for n in names if n.removeprefix(self.base).split(".")[0] in roots]
        if backbone:
            raise ValueError(f"zoo.from_hf: {model_name} has backbone weights zoo cannot place: {backbone[:8]}")
        if names:
            heads = sorted({n.rsplit(".", 1)[0] for n in names})
            warnings.warn(f"zoo.from_hf: {model_name}'s task head ({', '.join(heads)}) is not part of zoo's "
                          "library model and was left out; tasks build their own heads", stacklevel=3)


# ---- the families: a config reader and a weight mapper each, registered at the end ---------------
def _gpt2_config(c: Any) -> ModelConfig:
    """Decoder, learned positions, pre-LayerNorm with biases, GELU (tanh) MLP. HF's ``Conv1D`` stores
    weights as (in, out): :func:`_gpt2_weights` transposes them into ``nn.Linear``'s (out, in)."""
    if getattr(c, "scale_attn_by_inverse_layer_idx", False):
        raise ValueError("gpt2: scale_attn_by_inverse_layer_idx=True (per-layer attention scale) is not supported")
    if getattr(c, "add_cross_attention", False):
        raise ValueError("gpt2: add_cross_attention=True (GPT-2 as a seq2seq decoder) is not supported")
    d, eos = c.n_embd, _token_id(c, "eos_token_id")
    return ModelConfig(
        arch="decoder", vocab_size=c.vocab_size, d_model=d, n_layers=c.n_layer, n_heads=c.n_head,
        d_ff=c.n_inner or 4 * d, max_seq_len=c.n_positions, position="learned", norm="layernorm",
        norm_placement="pre", **_activation(c.activation_function, gated=False, field="activation_function"),
        bias=True, tie_embeddings=c.tie_word_embeddings, norm_eps=c.layer_norm_epsilon,
        attn_scale=None if c.scale_attn_weights else 1.0, dropout=c.resid_pdrop, attn_dropout=c.attn_pdrop,
        init_std=c.initializer_range, eos_token_id=eos, pad_token_id=_first(_token_id(c, "pad_token_id"), eos, 0),
    )


def _gpt2_weights(w: _Weights, cfg: ModelConfig) -> ModelConfig:
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


def _bert_config(c: Any) -> ModelConfig:
    """Encoder, post-LayerNorm (the embedding LayerNorm is the stack's ``embed_norm``), segment
    embeddings; :func:`_bert_weights` keeps the pooler and the masked-LM head if the model has them."""
    kind = getattr(c, "position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(f"bert: position_embedding_type={kind!r} is not supported; zoo has learned absolute "
                         "positions only (position_embedding_type='absolute')")
    if getattr(c, "is_decoder", False) or getattr(c, "add_cross_attention", False):
        raise ValueError("bert: is_decoder/add_cross_attention (BERT as a causal or seq2seq decoder) is not "
                         "supported; zoo imports BERT as an encoder")
    return ModelConfig(
        arch="encoder", vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads, d_ff=c.intermediate_size, max_seq_len=c.max_position_embeddings,
        position="learned", norm="layernorm", norm_placement="post",
        **_activation(c.hidden_act, gated=False, field="hidden_act"), bias=True, norm_eps=c.layer_norm_eps,
        type_vocab_size=c.type_vocab_size, pooler=True, mlm_head=False, dropout=c.hidden_dropout_prob,
        attn_dropout=c.attention_probs_dropout_prob, init_std=c.initializer_range,
        pad_token_id=_first(_token_id(c, "pad_token_id"), 0), eos_token_id=_token_id(c, "eos_token_id"),
    )


def _bert_weights(w: _Weights, cfg: ModelConfig) -> ModelConfig:
    b = w.base
    w.copy("embed", f"{b}embeddings.word_embeddings")
    w.copy("encoder.position.table", f"{b}embeddings.position_embeddings")
    w.copy("segment", f"{b}embeddings.token_type_embeddings")
    w.copy("encoder.embed_norm", f"{b}embeddings.LayerNorm", bias=True)
    for i in range(cfg.n_layers):
        z, h = f"encoder.blocks.{i}", f"{b}encoder.layer.{i}"
        w.fuse(f"{z}.attn.qkv", [f"{h}.attention.self.{p}" for p in ("query", "key", "value")], bias=True)
        w.copy(f"{z}.attn.out", f"{h}.attention.output.dense", bias=True)
        w.copy(f"{z}.attn_res.norm", f"{h}.attention.output.LayerNorm", bias=True)
        w.copy(f"{z}.ffn.fc", f"{h}.intermediate.dense", bias=True)
        w.copy(f"{z}.ffn.proj", f"{h}.output.dense", bias=True)
        w.copy(f"{z}.ffn_res.norm", f"{h}.output.LayerNorm", bias=True)
    pooler = f"{b}pooler.dense.weight" in w.params
    if pooler:
        w.copy("pooler", f"{b}pooler.dense", bias=True)
    head = "cls.predictions"
    mlm = f"{head}.transform.dense.weight" in w.params
    if mlm:
        embedding = f"{b}embeddings.word_embeddings.weight"
        if not (w.tied(f"{head}.decoder.weight", embedding)
                or torch.equal(w.params[f"{head}.decoder.weight"], w.params[embedding])):
            raise ValueError("bert: the masked-LM decoder is not tied to the word embeddings; zoo's MLM head "
                             "always uses the embedding matrix")
        w.take(f"{head}.decoder.weight")
        w.copy("mlm_head.dense", f"{head}.transform.dense", bias=True)
        w.copy("mlm_head.norm", f"{head}.transform.LayerNorm", bias=True)
        w.out["mlm_head.bias"] = w.take(f"{head}.decoder.bias")  # the bias the HF forward adds
        if f"{head}.bias" in w.params:  # tied to decoder.bias in HF
            w.take(f"{head}.bias")
    return cfg.replace(pooler=pooler, mlm_head=mlm)


def _t5_config(c: Any) -> ModelConfig:
    """Encoder_decoder, relative position buckets (block 0's table in each stack), RMSNorm, unscaled
    attention; v1.0 (ReLU, tied head, logits scaled by d_model**-0.5) or v1.1 (gated GELU, untied)."""
    d, h = c.d_model, c.num_heads
    # transformers 5 keeps v1.0's "tied and scaled" flag as scale_decoder_outputs; 4.x as tie_word_embeddings
    scaled = bool(getattr(c, "scale_decoder_outputs", c.tie_word_embeddings))
    n_enc, n_dec = c.num_layers, c.num_decoder_layers or c.num_layers
    split = {} if n_dec == n_enc else {"n_encoder_layers": n_enc, "n_decoder_layers": n_dec}
    pad = _first(_token_id(c, "pad_token_id"), 0)
    return ModelConfig(
        arch="encoder_decoder", vocab_size=c.vocab_size, d_model=d, n_heads=h, n_layers=n_enc, **split,
        head_dim=None if d % h == 0 and d // h == c.d_kv else c.d_kv, d_ff=c.d_ff,
        position="t5_relative", rel_buckets=c.relative_attention_num_buckets,
        rel_max_distance=c.relative_attention_max_distance, norm="rmsnorm", norm_placement="pre",
        **_activation(c.dense_act_fn, gated=c.is_gated_act, field="feed_forward_proj"), bias=False,
        tie_embeddings=scaled, logit_scale=d**-0.5 if scaled else 1.0, attn_scale=1.0,
        norm_eps=c.layer_norm_epsilon, dropout=c.dropout_rate, init_std=c.initializer_factor * d**-0.5,
        pad_token_id=pad, eos_token_id=_token_id(c, "eos_token_id"),
        decoder_start_token_id=_first(_token_id(c, "decoder_start_token_id"), pad),
    )


def _t5_weights(w: _Weights, cfg: ModelConfig) -> ModelConfig:
    b = w.base
    if f"{b}decoder.block.0.layer.0.SelfAttention.q.weight" not in w.params:
        raise ValueError("t5: the HF model has no decoder (T5EncoderModel?); zoo imports T5Model and "
                         "T5ForConditionalGeneration")
    fc = ["wi_0", "wi_1"] if FFN.get(cfg.ffn, field="ffn").gated else ["wi"]  # wi_0 is gated by the activation
    w.copy("embed", f"{b}shared")
    stacks = (("encoder", cfg.resolved_n_encoder_layers, False), ("decoder", cfg.resolved_n_decoder_layers, True))
    for stack, n_layers, cross in stacks:  # a decoder block's layers: self-attention, cross-attention, FFN
        w.copy(f"{stack}.position.table", f"{b}{stack}.block.0.layer.0.SelfAttention.relative_attention_bias")
        for i in range(n_layers):
            z, h = f"{stack}.blocks.{i}", f"{b}{stack}.block.{i}.layer"
            attn = f"{h}.0.SelfAttention"
            w.copy(f"{z}.attn_res.norm", f"{h}.0.layer_norm")
            w.fuse(f"{z}.attn.qkv", [f"{attn}.{p}" for p in "qkv"])
            w.copy(f"{z}.attn.out", f"{attn}.o")
            if cross:
                x = f"{h}.1.EncDecAttention"
                w.copy(f"{z}.cross_res.norm", f"{h}.1.layer_norm")
                w.copy(f"{z}.cross_attn.q", f"{x}.q")
                w.fuse(f"{z}.cross_attn.kv", [f"{x}.k", f"{x}.v"])
                w.copy(f"{z}.cross_attn.out", f"{x}.o")
            ffn = f"{h}.{2 if cross else 1}"
            dense = f"{ffn}.DenseReluDense"
            w.copy(f"{z}.ffn_res.norm", f"{ffn}.layer_norm")
            w.fuse(f"{z}.ffn.fc", [f"{dense}.{p}" for p in fc])
            w.copy(f"{z}.ffn.proj", f"{dense}.wo")
        w.copy(f"{stack}.final_norm", f"{b}{stack}.final_layer_norm")
    return w.lm_head(cfg, f"{b}shared.weight")


def _llama_config(c: Any) -> ModelConfig:
    attention_bias, mlp_bias = getattr(c, "attention_bias", False), getattr(c, "mlp_bias", False)
    if attention_bias != mlp_bias:
        raise ValueError(f"{c.model_type}: attention_bias={attention_bias} with mlp_bias={mlp_bias} has no zoo "
                         "equivalent; zoo's bias covers the attention and FFN projections together")
    return _rope_decoder_config(c, bias=attention_bias, qkv_bias=None)


def _qwen2_config(c: Any) -> ModelConfig:
    layer_types = getattr(c, "layer_types", None) or []
    if getattr(c, "use_sliding_window", False) and any(t != "full_attention" for t in layer_types):
        raise ValueError("qwen2: sliding-window attention (use_sliding_window=True) is not supported")
    return _rope_decoder_config(c, bias=False, qkv_bias=True)


def _rope_decoder_config(c: Any, *, bias: bool, qkv_bias: bool | None) -> ModelConfig:
    """Llama and Qwen2: decoder, RoPE (rotate-half layout in both libraries), RMSNorm, SwiGLU, GQA;
    Qwen2's q/k/v biases become ``qkv_bias=True``."""
    d, h, head_dim = c.hidden_size, c.num_attention_heads, getattr(c, "head_dim", None)
    eos = _token_id(c, "eos_token_id")
    return ModelConfig(
        arch="decoder", vocab_size=c.vocab_size, d_model=d, n_layers=c.num_hidden_layers, n_heads=h,
        n_kv_heads=c.num_key_value_heads or h,
        head_dim=None if head_dim is None or (d % h == 0 and head_dim == d // h) else head_dim,
        d_ff=c.intermediate_size, max_seq_len=c.max_position_embeddings, position="rope", **_rope(c),
        norm="rmsnorm", norm_placement="pre", **_activation(c.hidden_act, gated=True, field="hidden_act"),
        bias=bias, qkv_bias=qkv_bias, tie_embeddings=c.tie_word_embeddings, norm_eps=c.rms_norm_eps,
        dropout=0.0, attn_dropout=float(getattr(c, "attention_dropout", 0.0) or 0.0),
        init_std=c.initializer_range, eos_token_id=eos, pad_token_id=_first(_token_id(c, "pad_token_id"), eos, 0),
    )


def _llama_weights(w: _Weights, cfg: ModelConfig) -> ModelConfig:
    b = w.base
    qkv_bias = cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias
    w.copy("embed", f"{b}embed_tokens")
    for i in range(cfg.n_layers):
        z, h = f"decoder.blocks.{i}", f"{b}layers.{i}"
        w.copy(f"{z}.attn_res.norm", f"{h}.input_layernorm")
        w.fuse(f"{z}.attn.qkv", [f"{h}.self_attn.{p}_proj" for p in "qkv"], bias=qkv_bias)
        w.copy(f"{z}.attn.out", f"{h}.self_attn.o_proj", bias=cfg.bias)
        w.copy(f"{z}.ffn_res.norm", f"{h}.post_attention_layernorm")
        w.fuse(f"{z}.ffn.fc", [f"{h}.mlp.gate_proj", f"{h}.mlp.up_proj"], bias=cfg.bias)
        w.copy(f"{z}.ffn.proj", f"{h}.mlp.down_proj", bias=cfg.bias)
    w.copy("decoder.final_norm", f"{b}norm")
    return w.lm_head(cfg, f"{b}embed_tokens.weight")


# ---- the records: a new family is its two functions above and one line here ----------------------
FAMILIES.register("bert")(Family(_bert_config, _bert_weights, backbone=("embeddings", "encoder", "pooler")))
FAMILIES.register("gpt2")(Family(_gpt2_config, _gpt2_weights, backbone=("wte", "wpe", "h", "ln_f")))
FAMILIES.register("llama")(Family(_llama_config, _llama_weights, backbone=("embed_tokens", "layers", "norm")))
FAMILIES.register("qwen2")(Family(_qwen2_config, _llama_weights, backbone=("embed_tokens", "layers", "norm")))
FAMILIES.register("t5")(Family(_t5_config, _t5_weights, backbone=("shared", "encoder", "decoder")))
