"""FLOPs per token in both conventions (zoo.stats), against a hand count at tiny size: attention counted
whole (every query against every key: PaLM, nanoGPT) and causal self-attention counted at half (the keys a
query sees: FlashAttention's count). Both count the true vocabulary of a padded head."""

from __future__ import annotations

from conftest import tiny_config

import zoo

T = 8  # tokens per sequence
D, L = 32, 2  # d_model = heads x head_dim (4 x 8), layers per stack
MATMULS = 3 * D * D + D * D + 2 * D * 48  # per block: qkv, out, fc and proj (d_ff 48); no biases
NORMS = 2 * D  # per block (LayerNorm gains); zoo.stats counts them with the weights
HEAD = 61 * D  # the tied head over the true vocabulary: 61 rows, not the 64 it holds
ATTENTION = 4 * T * D  # per layer and token: QK^T and AV over T keys, 2 FLOPs per multiply-add


def test_a_decoder_counts_its_causal_layers_at_half():
    cfg = tiny_config(ffn="gelu", norm="layernorm", position="rope", vocab_multiple_of=16)
    weights = L * (MATMULS + NORMS) + D  # and the final norm
    whole = 2 * (weights + HEAD) + L * ATTENTION
    causal = 2 * (weights + HEAD) + L * ATTENTION // 2
    s = zoo.stats(cfg, seq_len=T)
    assert (s.flops_per_token_forward, s.flops_per_token_forward_causal) == (whole, causal) == (34_944, 33_920)
    assert (s.flops_per_token_train, s.flops_per_token_train_causal) == (3 * whole, 3 * causal)


def test_an_encoder_has_one_count():
    cfg = tiny_config(arch="encoder", ffn="gelu", norm="layernorm", position="rope", mlm_head=False)
    s = zoo.stats(cfg, seq_len=T)
    whole = 2 * (L * (MATMULS + NORMS) + D) + L * ATTENTION  # no vocabulary head: hidden states out
    assert s.flops_per_token_forward == s.flops_per_token_forward_causal == whole == 31_040


def test_an_encoder_decoder_halves_its_decoder_self_attention_alone():
    cfg = tiny_config(arch="encoder_decoder", ffn="gelu", norm="layernorm", position="rope")
    cross = 2 * D * D + 2 * D * D + D  # per decoder block: q, kv and out projections, its norm
    weights = L * (MATMULS + NORMS) + D + L * (MATMULS + NORMS + cross) + D  # encoder, decoder, final norms
    attention = (L + L + L) * ATTENTION  # encoder self, decoder self, cross
    s = zoo.stats(cfg, seq_len=T)
    assert s.flops_per_token_forward == 2 * (weights + HEAD) + attention
    assert s.flops_per_token_forward_causal == s.flops_per_token_forward - L * ATTENTION // 2
