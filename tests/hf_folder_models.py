"""Tiny models on both sides of ``zoo.from_hf`` / ``zoo.to_hf``, and the checks that compare them:
the HF models whose folders are read (``HF``), the zoo-native compositions that are written
(``NATIVE``), and a loader that fails on any weight transformers reports missing or unexpected.

Everything is tiny and fp32 on CPU. Random weights use a large std (0.2; T5: initializer_factor 4.0
for generation, see tests/test_hf.py::_t5) so that greedy paths are not one token repeated, and
biases and norm weights are moved off their 0/1 init, so a bias or norm put in the wrong place
changes the outputs. Import it after ``pytest.importorskip("transformers")``.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from hf_tiny import VOCAB, _bert_config, _close, _gpt2_config, _llama_config, _t5_config
from torch import Tensor, nn
from transformers.utils import logging as hf_logging

import zoo


def _tokens(*shape: int, seed: int = 1) -> Tensor:
    return torch.randint(3, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def _right_padded(batch: int = 2, length: int = 12) -> tuple[Tensor, Tensor]:
    ids = _tokens(batch, length)
    mask = torch.ones_like(ids)
    mask[1, length - 5 :] = 0  # the second row is 5 tokens shorter
    ids[mask == 0] = 0  # padding tokens (pad_token_id=0), as a tokenizer writes them
    return ids, mask


# ---- tiny HF models --------------------------------------------------------------------------------
# _gpt2_config, _bert_config, _t5_config, _llama_config: tests/hf_tiny.py's (imported above)


def _build(cls: type, config, seed: int = 0) -> nn.Module:
    """A HF model with random weights; biases and norm weights (HF initialises them to 0 and 1) are
    moved off their init too, so that one put in the wrong place changes the outputs."""
    torch.manual_seed(seed)
    model = cls(config).eval()
    _perturb_vectors(model, seed)
    return model


def _perturb_vectors(model: nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for parameter in model.parameters():  # a tied tensor once
            if parameter.dim() == 1:
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator).to(parameter.dtype))


def _t5(version: str, init: float = 1.0) -> nn.Module:
    """As tests/test_hf.py::_t5: logits compared at init 1.0, generations at 4.0 (T5 does not scale
    its attention scores, so at 4.0 fp32 summation order alone moves logits by ~1e-3)."""
    if version == "v1.0":
        return _build(
            transformers.T5ForConditionalGeneration, _t5_config(feed_forward_proj="relu", initializer_factor=init)
        )
    hf = _build(
        transformers.T5ForConditionalGeneration,
        _t5_config(feed_forward_proj="gated-gelu", tie_word_embeddings=False, initializer_factor=init),
    )
    # transformers 5 builds the head tied even so (a checkpoint with its own lm_head unties it on load)
    hf.lm_head.weight = nn.Parameter(torch.randn(VOCAB, 64, generator=torch.Generator().manual_seed(3)))
    return hf


@dataclasses.dataclass(frozen=True)
class Spec:
    """A tiny HF model: how to build it, the Auto class that loads its folder, its kind of outputs."""

    build: Callable[[float], nn.Module]  # the argument is T5's initializer_factor (others ignore it)
    auto: str
    kind: str  # "causal", "mlm", "base" (BertModel), "seq2seq"


HF = {
    "gpt2": Spec(lambda init: _build(transformers.GPT2LMHeadModel, _gpt2_config()), "AutoModelForCausalLM", "causal"),
    "bert_mlm": Spec(lambda init: _build(transformers.BertForMaskedLM, _bert_config()), "AutoModelForMaskedLM", "mlm"),
    "bert_base": Spec(lambda init: _build(transformers.BertModel, _bert_config()), "AutoModel", "base"),
    "t5_v1.0": Spec(lambda init: _t5("v1.0", init), "AutoModelForSeq2SeqLM", "seq2seq"),
    "t5_v1.1": Spec(lambda init: _t5("v1.1", init), "AutoModelForSeq2SeqLM", "seq2seq"),
    "llama_gqa": Spec(
        lambda init: _build(transformers.LlamaForCausalLM, _llama_config()), "AutoModelForCausalLM", "causal"
    ),
    "qwen2_untied": Spec(
        lambda init: _build(transformers.Qwen2ForCausalLM, _llama_config(transformers.Qwen2Config)),
        "AutoModelForCausalLM",
        "causal",
    ),
    "qwen2_tied": Spec(
        lambda init: _build(
            transformers.Qwen2ForCausalLM, _llama_config(transformers.Qwen2Config, tie_word_embeddings=True)
        ),
        "AutoModelForCausalLM",
        "causal",
    ),
}


def _compare(kind: str, model: zoo.ZooModel, hf: nn.Module) -> None:
    """zoo's outputs equal HF's on a right-padded batch, at the positions that hold tokens."""
    ids, mask = _right_padded()
    keep = mask.bool()
    with torch.no_grad():
        if kind == "causal":
            _close(model(ids, mask)[keep], hf(ids, attention_mask=mask).logits[keep])
        elif kind == "mlm":
            _close(model.mlm_logits(model(ids, mask))[keep], hf(ids, attention_mask=mask).logits[keep])
        elif kind == "base":
            out = hf(ids, attention_mask=mask)
            hidden = model(ids, mask)
            _close(hidden[keep], out.last_hidden_state[keep])
            _close(model.pool(hidden), out.pooler_output)
        else:  # seq2seq: a padded source, a target prefix
            tgt = _tokens(2, 7, seed=2)
            expected = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=tgt).logits
            _close(model(ids, tgt, attention_mask=mask), expected)


def _silent_from_hf(source) -> zoo.ZooModel:
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="zoo")  # an LM or base model converts without a word
        return zoo.from_hf(source)


def _same_state(a: zoo.ZooModel, b: zoo.ZooModel) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].dtype == sb[key].dtype, key
        assert torch.equal(sa[key], sb[key]), key


# ---- loading what was written ----------------------------------------------------------------------
_WEIGHT_PROBLEM = re.compile(r"MISSING|UNEXPECTED|MISMATCH|newly initiali[sz]ed|were not used|not initiali[sz]ed")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _load_clean(auto: str, folder: Path) -> nn.Module:
    """``Auto*.from_pretrained(folder)`` (no trust_remote_code), failing on any transformers report
    of a missing, unexpected, mismatched or newly initialised weight. transformers logs through its
    own "transformers" logger, which does not propagate to the root (caplog would miss it), so a
    handler is attached there at WARNING verbosity.

    Other warnings pass: transformers 5 warns that a T5 v1.1 folder (untied head) has an
    lm_head different from ``shared``, also for the folders it writes itself."""
    records = _Records()
    logger = logging.getLogger("transformers")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    logger.addHandler(records)
    try:
        hf, info = getattr(transformers, auto).from_pretrained(folder, output_loading_info=True)
    finally:
        logger.removeHandler(records)
        hf_logging.set_verbosity(verbosity)
    problems = [m for m in records.messages if _WEIGHT_PROBLEM.search(m)]
    problems += [f"{key}: {sorted(value)}" for key, value in info.items() if value]
    assert not problems, f"{auto}.from_pretrained({folder}) reported weight problems: {problems}"
    return hf.eval()


# ---- zoo-native compositions that fit a family ----------------------------------------------------
_TINY = dict(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq_len=64, init_std=0.2)
_GPT = dict(_TINY, arch="decoder", position="learned", norm="layernorm", norm_placement="pre", ffn="gelu", bias=True)
_LLAMA = dict(
    _TINY,
    arch="decoder",
    position="rope",
    norm="rmsnorm",
    norm_placement="pre",
    ffn="swiglu",
    n_kv_heads=2,
    d_ff=96,
    tie_embeddings=False,
    eos_token_id=2,
)
_BERT = dict(
    _TINY,
    arch="encoder",
    position="learned",
    norm="layernorm",
    norm_placement="post",
    ffn="gelu",
    bias=True,
    norm_eps=1e-12,
)
_T5 = dict(
    _TINY,
    arch="encoder_decoder",
    position="t5_relative",
    norm="rmsnorm",
    norm_placement="pre",
    bias=False,
    attn_scale=1.0,
    max_seq_len=None,
    norm_eps=1e-6,
    init_std=0.5,
    head_dim=32,
    eos_token_id=1,
)

NATIVE = {  # zoo-native compositions that fit a family: name -> (config, Auto class, kind, family)
    "gpt2_gelu_erf": (dict(_GPT, gelu_approximate="none"), "AutoModelForCausalLM", "causal", "gpt2"),
    "gpt2_relu_untied": (
        dict(_GPT, ffn="relu", tie_embeddings=False, attn_scale=1.0),
        "AutoModelForCausalLM",
        "causal",
        "gpt2",
    ),
    "llama_gqa": (_LLAMA, "AutoModelForCausalLM", "causal", "llama"),
    "llama_bias_tied_linear_rope": (
        dict(
            _LLAMA,
            bias=True,
            tie_embeddings=True,
            rope_base=500.0,
            rope_scaling="linear",
            rope_scaling_factor=2.0,
            head_dim=32,
        ),
        "AutoModelForCausalLM",
        "causal",
        "llama",
    ),
    "qwen2": (dict(_LLAMA, qkv_bias=True), "AutoModelForCausalLM", "causal", "qwen2"),
    "gemma2_pattern": (
        dict(
            _LLAMA,
            norm="rmsnorm_1p",
            norm_placement="sandwich",
            ffn="geglu",
            gelu_approximate="tanh",
            tie_embeddings=False,  # tied, the scaled embedding of the last token wins every greedy step
            embed_scale=8.0,
            attn_scale=0.2,  # query_pre_attn_scalar 25
            attention="auto",
            attn_softcap=5.0,
            final_softcap=10.0,
            mask="sliding_window",
            window=3,
            window_pattern="LLG",
            n_layers=3,
        ),
        "AutoModelForCausalLM",
        "causal",
        "gemma2",
    ),
    "olmo2": (
        dict(_LLAMA, norm_placement="res_post", qk_norm="rmsnorm", qk_norm_scope="all"),
        "AutoModelForCausalLM",
        "causal",
        "olmo2",
    ),
    "qwen3_head_dim": (dict(_LLAMA, qk_norm="rmsnorm", head_dim=24), "AutoModelForCausalLM", "causal", "qwen3"),
    # post-LayerNorm, learned positions, no segments: HF gets a zero token-type table
    "bert_pooler": (dict(_BERT, type_vocab_size=0, pooler=True), "AutoModel", "base", "bert"),
    "bert_mlm": (
        dict(_BERT, type_vocab_size=2, mlm_head=True, gelu_approximate="tanh"),
        "AutoModelForMaskedLM",
        "mlm",
        "bert",
    ),
    "t5_v1.0": (
        dict(_T5, ffn="relu", tie_embeddings=True, logit_scale=64**-0.5),
        "AutoModelForSeq2SeqLM",
        "seq2seq",
        "t5",
    ),
    "t5_gated_silu": (dict(_T5, ffn="swiglu", tie_embeddings=False), "AutoModelForSeq2SeqLM", "seq2seq", "t5"),
    "t5_v1.1_split_depth": (
        dict(
            _T5,
            ffn="geglu",
            gelu_approximate="tanh",
            tie_embeddings=False,
            n_encoder_layers=2,
            n_decoder_layers=1,
            rel_buckets=16,
            rel_max_distance=20,
        ),
        "AutoModelForSeq2SeqLM",
        "seq2seq",
        "t5",
    ),
}


def _native(values: dict, seed: int = 0) -> zoo.ZooModel:
    """A zoo model built from a config, every bias and norm weight then moved off its 0/1 init."""
    model = zoo.build_model(zoo.ModelConfig(**values), seed=seed).eval()
    _perturb_vectors(model, seed)
    return model
