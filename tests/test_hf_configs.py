"""HF configs read by ``zoo.from_hf_config``: every registered family round-trips its config and
parameter count, default configs give the published sizes, a family registers from outside, and
settings zoo cannot compute are refused."""

from __future__ import annotations

import pytest
import torch

import zoo

transformers = pytest.importorskip("transformers")

from hf_tiny import (  # noqa: E402  (after the importorskip)
    VOCAB,
    _bert_config,
    _build,
    _close,
    _convert,
    _gemma2_config,
    _gpt2_config,
    _llama_config,
    _t5_config,
    _tokens,
)


# ---- configs -----------------------------------------------------------------------------------
def _hf_parameters(hf: torch.nn.Module) -> int:
    return sum(p.numel() for p in hf.parameters())  # tied tensors once


_TINY = {  # one tiny model per registered family
    "gpt2": lambda: _build(transformers.GPT2LMHeadModel, _gpt2_config()),
    "bert": lambda: _build(transformers.BertModel, _bert_config()),
    "t5": lambda: _build(transformers.T5ForConditionalGeneration, _t5_config()),
    "llama": lambda: _build(transformers.LlamaForCausalLM, _llama_config()),
    "qwen2": lambda: _build(transformers.Qwen2ForCausalLM, _llama_config(transformers.Qwen2Config)),
    "gemma2": lambda: _build(transformers.Gemma2ForCausalLM, _gemma2_config()),
    "olmo2": lambda: _build(transformers.Olmo2ForCausalLM, _llama_config(transformers.Olmo2Config)),
    "qwen3": lambda: _build(transformers.Qwen3ForCausalLM, _llama_config(transformers.Qwen3Config, head_dim=16)),
    "mixtral": lambda: _build(
        transformers.MixtralForCausalLM, _llama_config(transformers.MixtralConfig, num_local_experts=4)
    ),
    "modernbert": lambda: _build(
        transformers.ModernBertModel,
        transformers.ModernBertConfig(
            num_hidden_layers=4,
            hidden_size=64,
            num_attention_heads=4,
            intermediate_size=96,
            vocab_size=VOCAB,
            max_position_embeddings=64,
            local_attention=8,
            pad_token_id=0,
            eos_token_id=2,
        ),
    ),
    "mistral": lambda: _build(
        transformers.MistralForCausalLM, _llama_config(transformers.MistralConfig, sliding_window=4)
    ),
}


@pytest.mark.parametrize("name", zoo.hf.FAMILIES.names())
def test_every_family_round_trips_its_config_and_sizes(name):
    assert name in _TINY, f"HF family {name!r} is registered in zoo.hf.FAMILIES but has no tiny model in _TINY"
    hf = _TINY[name]()
    assert hf.config.model_type == name
    cfg = zoo.from_hf_config(hf.config)
    c = hf.config
    assert (cfg.vocab_size, cfg.d_model) == (c.vocab_size, c.hidden_size)
    assert cfg.n_heads == c.num_attention_heads
    assert cfg.n_layers == c.num_hidden_layers
    with torch.device("meta"):
        model = zoo.build_model(cfg)
    assert zoo.count_parameters(model) == _hf_parameters(hf)
    assert zoo.ModelConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (lambda: transformers.GPT2Config(), 124_439_808),  # GPT-2 small
        (lambda: transformers.BertConfig(), 109_482_240),  # BERT-base (with pooler)
        (lambda: transformers.T5Config(), 60_506_624),  # T5-small
        (lambda: transformers.LlamaConfig(), 6_738_415_616),  # Llama 2 7B
    ],
)
def test_default_configs_give_published_sizes(config, expected):
    with torch.device("meta"):
        model = zoo.build_model(zoo.from_hf_config(config()))
    assert zoo.count_parameters(model) == expected


def test_a_family_registered_from_outside_converts():
    """A new model_type is one record: Mistral without its sliding window is Llama's layout (zoo's own
    mistral record is set aside meanwhile)."""
    llama = zoo.hf.FAMILIES.get("llama")
    own = zoo.hf.FAMILIES.unregister("mistral")
    zoo.hf.FAMILIES.register("mistral")(zoo.hf.Family(llama.config, llama.weights, llama.backbone))
    try:
        hf = _build(transformers.MistralForCausalLM, _llama_config(transformers.MistralConfig, sliding_window=None))
        model = _convert(hf)
    finally:
        zoo.hf.FAMILIES.unregister("mistral")
        zoo.hf.FAMILIES.register("mistral")(own)
    ids = _tokens(2, 12)
    with torch.no_grad():
        _close(model(ids), hf(ids).logits)


def test_unsupported_model_type_raises():
    names = ", ".join(zoo.hf.FAMILIES.names())
    assert names.startswith("bert, gemma2, gpt2, llama, mistral")
    with pytest.raises(ValueError, match=f"supported model types: {names}"):
        zoo.from_hf_config(transformers.BartConfig())


@pytest.mark.parametrize(
    "config",
    [
        lambda: _llama_config(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
        lambda: _gpt2_config(scale_attn_by_inverse_layer_idx=True),
        lambda: _llama_config(hidden_act="relu"),  # a gated ReLU: zoo has no ReGLU
        lambda: _llama_config(transformers.Qwen2Config, use_sliding_window=True, max_window_layers=1),
        lambda: _llama_config(transformers.Qwen3Config, attention_bias=True),
        lambda: _llama_config(transformers.Qwen3Config, use_sliding_window=True, sliding_window=4, max_window_layers=1),
    ],
)
def test_unsupported_settings_raise(config):
    with pytest.raises(ValueError, match="not supported|no zoo"):
        zoo.from_hf_config(config())


def test_bert_relative_positions_raise():
    config = _bert_config()
    config.position_embedding_type = "relative_key"  # transformers 5 no longer defines the field
    with pytest.raises(ValueError, match="position_embedding_type"):
        zoo.from_hf_config(config)


def test_out_of_vocab_token_ids_are_dropped():
    with pytest.warns(UserWarning, match="eos_token_id=50256"):
        cfg = zoo.from_hf_config(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB))
    assert cfg.eos_token_id is None and cfg.pad_token_id == 0
