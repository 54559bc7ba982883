"""The two sides of zoo-bench: a random HF model of each family and one training step of it and of
its zoo conversion, on the same batch.

A helper of hf_compare.py (and of the benchmarks that reuse its models), not a script; imported by
name from scripts/bench/, which is no package.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    import zoo

FAMILIES = ("gpt2", "llama", "bert", "t5")


def hf_model(family: str, *, layers: int, d: int, heads: int, vocab: int, ctx: int) -> PreTrainedModel:
    """A randomly initialised HF model of the family, without dropout, in train mode."""
    import transformers as tf

    ff = 4 * d
    if family == "gpt2":
        cfg = tf.GPT2Config(
            n_layer=layers,
            n_embd=d,
            n_head=heads,
            vocab_size=vocab,
            n_positions=ctx,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        return tf.GPT2LMHeadModel(cfg)
    if family == "llama":
        cfg = tf.LlamaConfig(
            hidden_size=d,
            intermediate_size=ff * 2 // 3,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads // 3 or 1,
            vocab_size=vocab,
            max_position_embeddings=ctx,
            tie_word_embeddings=False,
        )
        return tf.LlamaForCausalLM(cfg)
    if family == "bert":
        cfg = tf.BertConfig(
            hidden_size=d,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=ff,
            vocab_size=vocab,
            max_position_embeddings=ctx,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        return tf.BertForMaskedLM(cfg)
    if family == "t5":
        cfg = tf.T5Config(
            d_model=d,
            d_ff=ff,
            d_kv=d // heads,
            num_layers=layers,
            num_heads=heads,
            vocab_size=vocab,
            dropout_rate=0.0,
            decoder_start_token_id=0,
        )
        return tf.T5ForConditionalGeneration(cfg)
    raise ValueError(f"unknown family {family!r}; choose from {FAMILIES}")


def train_steps(
    family: str, hf: PreTrainedModel, ours: zoo.ZooModel, batch: int, length: int
) -> tuple[Callable[[], None], Callable[[], None]]:
    """One optimizer step of each side on the same batch: forward, cross-entropy, backward, AdamW.
    Returned as (zoo's step, HF's step); each side's optimizer state is created on its first step."""
    g = torch.Generator().manual_seed(0)
    vocab = ours.config.vocab_size
    ids = torch.randint(5, vocab, (batch, length), generator=g)
    opt_hf = torch.optim.AdamW(hf.parameters(), lr=1e-4)
    opt_zoo = torch.optim.AdamW(ours.parameters(), lr=1e-4)
    if family in ("gpt2", "llama"):
        hf_loss = lambda: hf(input_ids=ids, labels=ids).loss
        zoo_loss = lambda: F.cross_entropy(ours(ids[:, :-1]).flatten(0, 1).float(), ids[:, 1:].flatten())
    elif family == "bert":
        labels = torch.where(torch.rand(ids.shape, generator=g) < 0.15, ids, -100)
        hf_loss = lambda: hf(input_ids=ids, labels=labels).loss
        chosen = labels != -100  # zoo's mlm task runs the head on the masked positions only, as here
        zoo_loss = lambda: F.cross_entropy(ours.mlm_logits(ours(ids)[chosen]).float(), labels[chosen])
    else:
        target = ids[:, : length // 2].contiguous()
        dec = torch.cat([torch.zeros_like(target[:, :1]), target[:, :-1]], dim=1)
        hf_loss = lambda: hf(input_ids=ids, labels=target).loss
        zoo_loss = lambda: F.cross_entropy(ours(ids, dec).flatten(0, 1).float(), target.flatten())

    def step(loss_fn: Callable[[], torch.Tensor], opt: torch.optim.Optimizer) -> Callable[[], None]:
        def run() -> None:
            opt.zero_grad(set_to_none=True)
            loss_fn().backward()
            opt.step()

        return run

    return step(zoo_loss, opt_zoo), step(hf_loss, opt_hf)
