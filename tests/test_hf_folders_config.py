"""config.json as HF families leave it: zoo's defaults for each registered family are transformers'
defaults, and a sparse config.json written by hand (every other setting left to the class's
defaults, as transformers 4.x and 5 wrote them) reads as transformers reads it."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

import zoo
from zoo.hf import FAMILIES

transformers = pytest.importorskip("transformers")

from hf_tiny import VOCAB  # noqa: E402  (after the importorskip)

# ---- config defaults ----------------------------------------------------------------------------------
CONFIG_CLASSES = {
    "bert": "BertConfig",
    "gemma2": "Gemma2Config",
    "gpt2": "GPT2Config",
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "mixtral": "MixtralConfig",
    "modernbert": "ModernBertConfig",
    "olmo2": "Olmo2Config",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "t5": "T5Config",
}


def _hf_default(cls: type, key: str):
    """The HF config class's default for ``key``, as a config.json that leaves it out means it.

    - transformers 5 keeps RoPE's base in ``rope_parameters["rope_theta"]`` (4.x: a ``rope_theta``
      attribute); compare with whichever the class has.
    - A few fields are derived in ``__post_init__`` from a ``None`` default (Llama's
      ``num_key_value_heads`` becomes ``num_attention_heads``, T5's ``num_decoder_layers`` becomes
      ``num_layers``): the meaningful default is the declared field default, which zoo derives the
      same way; the instance's derived value is the one of the default sizes only.
    - Raises AttributeError where the class has no such setting."""
    instance = cls()
    if key == "rope_theta" and getattr(instance, "rope_parameters", None):
        return instance.rope_parameters["rope_theta"]
    fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    if key in fields and fields[key].default is not dataclasses.MISSING:
        return fields[key].default
    return getattr(instance, key)


@pytest.mark.parametrize("name", FAMILIES.names())
def test_family_defaults_are_transformers_defaults(name):
    assert name in CONFIG_CLASSES, f"HF family {name!r} is registered but has no config class here"
    cls = getattr(transformers, CONFIG_CLASSES[name])
    defaults = dict(FAMILIES.get(name).defaults)
    assert defaults, f"{name} declares no defaults, so a config.json that leaves them out cannot be read"
    absent, wrong = [], []
    for key, value in defaults.items():
        try:
            expected = _hf_default(cls, key)
        except AttributeError:
            absent.append(key)
            continue
        if expected != value:
            wrong.append(f"{key}: zoo {value!r}, {cls.__name__} {expected!r}")
    assert not wrong, f"{name}: defaults differ from transformers': {wrong}"
    # A key the HF class does not have (transformers 5's T5Config has no decoder_start_token_id,
    # Qwen2Config no attention_bias/mlp_bias) must not change what zoo reads.
    full = zoo.from_hf_config(SimpleNamespace(model_type=name, **defaults))
    without = {k: v for k, v in defaults.items() if k not in absent}
    assert zoo.from_hf_config(SimpleNamespace(model_type=name, **without)) == full, absent
    # The defaults alone read into the same model as the HF class's default config.
    assert full == zoo.from_hf_config(cls())


# config.json files written by hand, leaving every other setting to the class's defaults
SPARSE = {
    "gpt2": (
        "GPT2Config",
        {
            "n_layer": 2,
            "n_embd": 64,
            "n_head": 4,
            "vocab_size": VOCAB,
            "n_positions": 64,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    "bert": (
        "BertConfig",
        {
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "vocab_size": VOCAB,
            "max_position_embeddings": 64,
        },
    ),
    "t5": ("T5Config", {"num_layers": 2, "d_model": 64, "num_heads": 4, "d_kv": 32, "d_ff": 128, "vocab_size": VOCAB}),
    # transformers 4.x wrote v1.1 as tie_word_embeddings=false (no scale_decoder_outputs)
    "t5_v1.1_4x": (
        "T5Config",
        {
            "num_layers": 2,
            "num_decoder_layers": 1,
            "d_model": 64,
            "num_heads": 4,
            "d_kv": 16,
            "d_ff": 96,
            "vocab_size": VOCAB,
            "feed_forward_proj": "gated-gelu",
            "tie_word_embeddings": False,
        },
    ),
    "llama": (
        "LlamaConfig",
        {
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 96,
            "vocab_size": VOCAB,
        },
    ),
    # transformers 4.x wrote RoPE's base as a top-level rope_theta
    "llama_4x_rope_theta": (
        "LlamaConfig",
        {
            "num_hidden_layers": 1,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "intermediate_size": 96,
            "vocab_size": VOCAB,
            "rope_theta": 500.0,
        },
    ),
    "qwen2": (
        "Qwen2Config",
        {
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 96,
            "vocab_size": VOCAB,
            "tie_word_embeddings": True,
        },
    ),
}


@pytest.mark.parametrize("case", list(SPARSE))
def test_sparse_config_json_reads_as_transformers_does(case, tmp_path):
    class_name, keys = SPARSE[case]
    cls = getattr(transformers, class_name)
    model_type = cls.model_type
    hf_config = cls(**keys)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, **keys}))
    read = zoo.hf.folder.read_config(tmp_path)
    assert zoo.from_hf_config(read) == zoo.from_hf_config(hf_config)
    if case == "llama_4x_rope_theta":
        assert zoo.from_hf_config(read).rope_base == 500.0  # not the default 10000
    if case == "t5_v1.1_4x":
        cfg = zoo.from_hf_config(read)
        assert (cfg.tie_embeddings, cfg.logit_scale, cfg.ffn) == (False, 1.0, "geglu")
