"""Tiny Hugging Face folders as transformers writes them, and zoo-train's settings for a run from one.

Each folder is a random transformers model saved with ``save_pretrained`` beside a tokenizer trained
with ``tokenizers`` on the experiment's own data source and saved with
``PreTrainedTokenizerFast.save_pretrained`` (so the files are exactly transformers' own). Used by
tests/test_hf_pretrained.py (tests/test_lora_save_only.py imports ``_gpt2`` from there). Import it
after ``pytest.importorskip("transformers")``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tasks.data.sources import load_records

VOCAB = 320
STEPS = [
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "trainer.num_sanity_val_steps=0",
    "trainer.log_every_n_steps=1",
    "callbacks.rich_progress_bar=null",
    "callbacks.rich_model_summary=null",
    "callbacks.throughput.window=2",
    "test=false",
    "model.dropout=0.0",
]
DATA = {
    "gpt_generator": ["data.source_args.max_files=40", "data.seq_len=32"],
    "bert_classifier": ["data.max_records=300", "data.seq_len=48"],
    "bert_mlm": ["data.max_records=300", "data.seq_len=48"],
    "t5_translator": ["data.source_args.n=300", "data.seq_len=32", "task.max_new_tokens=8"],
}


def run(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", f"tasks.cli.{module}", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


# ---- folders -------------------------------------------------------------------------------------
def _bpe(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=VOCAB,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return tok


def _wordpiece(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(
        texts, trainers.WordPieceTrainer(vocab_size=VOCAB, special_tokens=specials, show_progress=False)
    )
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
    )
    return tok


def _unigram(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        texts,
        trainers.UnigramTrainer(
            vocab_size=200, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>", show_progress=False
        ),
    )
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    return tok


def _folder(path: Path, model: torch.nn.Module, tokenizer: Tokenizer, **tokens: str) -> Path:
    torch.manual_seed(0)
    model.save_pretrained(path)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, **tokens).save_pretrained(path)
    return path


def _gpt2(path: Path) -> Path:
    tok = _bpe([r["text"] for r in load_records("stdlib_code", max_files=30)])
    eos = tok.token_to_id("<|endoftext|>")
    config = transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(),
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=eos,
        eos_token_id=eos,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return _folder(
        path, _seeded(transformers.GPT2LMHeadModel, config), tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )


def _llama(path: Path, qwen2: bool = False) -> Path:
    tok = _bpe([r["text"] for r in load_records("stdlib_code", max_files=30)])
    eos = tok.token_to_id("<|endoftext|>")
    cls = transformers.Qwen2Config if qwen2 else transformers.LlamaConfig
    config = cls(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=eos,
        eos_token_id=eos,
        tie_word_embeddings=qwen2,
    )
    model_cls = transformers.Qwen2ForCausalLM if qwen2 else transformers.LlamaForCausalLM
    return _folder(path, _seeded(model_cls, config), tok, eos_token="<|endoftext|>")


def _bert(path: Path) -> Path:
    tok = _wordpiece([r["text"] for r in load_records("stdlib_docstrings")][:3000])
    config = transformers.BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=tok.token_to_id("[PAD]"),
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return _folder(
        path,
        _seeded(transformers.BertForMaskedLM, config),
        tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def _t5(path: Path) -> Path:
    pairs = load_records("numbers", n=2000, target_lang="fr")
    tok = _unigram([t for p in pairs for t in (p["source"], p["target"])])
    config = transformers.T5Config(
        vocab_size=tok.get_vocab_size(),
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_heads=2,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        dropout_rate=0.0,
    )
    return _folder(
        path,
        _seeded(transformers.T5ForConditionalGeneration, config),
        tok,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
    )


def _seeded(cls: type, config) -> torch.nn.Module:
    torch.manual_seed(0)
    return cls(config).eval()
