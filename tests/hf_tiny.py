"""Tiny transformers models of each supported family, and how their outputs are compared with zoo's.

Shared by tests/test_hf.py, tests/test_hf_configs.py and the tests/test_hf_folders*.py files. Random
weights are drawn with a large std (initializer_range=0.2) so that greedy paths are not one token
repeated. Import it after ``pytest.importorskip("transformers")``.
"""

from __future__ import annotations

import warnings

import torch
import transformers
from torch import Tensor

import zoo

ATOL = 1e-4
VOCAB = 100
NEW = 8  # generated tokens


def _close(a: Tensor, b: Tensor) -> None:
    torch.testing.assert_close(a, b, atol=ATOL, rtol=1e-4)


def _convert(hf: torch.nn.Module) -> zoo.ZooModel:
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="zoo")  # a plain LM conversion is silent
        return zoo.from_hf(hf)


def _tokens(*shape: int, seed: int = 1) -> Tensor:
    return torch.randint(3, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


# ---- tiny models -------------------------------------------------------------------------------
def _gpt2_config(**kw) -> transformers.GPT2Config:
    return transformers.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=64,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.2,
        **kw,
    )


def _bert_config(**kw) -> transformers.BertConfig:
    return transformers.BertConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        initializer_range=0.2,
        **kw,
    )


def _t5_config(**kw) -> transformers.T5Config:
    # d_kv * num_heads = 128 != d_model: exercises head_dim
    return transformers.T5Config(
        num_layers=2, d_model=64, num_heads=4, d_kv=32, d_ff=128, vocab_size=VOCAB, decoder_start_token_id=0, **kw
    )


def _llama_config(cls: type | None = None, **kw) -> transformers.PretrainedConfig:
    cls = cls or transformers.LlamaConfig
    return cls(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        **kw,
    )


def _gemma2_config(**kw) -> transformers.PretrainedConfig:
    """Gemma 2 at tiny size: heads wider than d_model / n_heads, its own score scale, both soft-caps
    low enough to bite, a window of 4 on alternate layers (the default ``layer_types``)."""
    values = dict(
        num_hidden_layers=3,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        intermediate_size=96,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        initializer_range=0.2,
        sliding_window=4,
        query_pre_attn_scalar=20,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0,
        attn_implementation="eager",
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return transformers.Gemma2Config(**{**values, **kw})


def _build(cls: type, config, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return cls(config).eval()
