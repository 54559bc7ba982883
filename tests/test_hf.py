"""Parity with Hugging Face transformers: tiny random models of each supported family, converted
with ``zoo.from_hf``, give the same outputs and the same greedy generations (fp32, CPU).

Random weights are drawn with a large std (initializer_range=0.2; T5: initializer_factor=4.0 for
generation) so that greedy paths are not one token repeated; each generation test checks that, so
it can fail. How configs are read (sizes, registration, refusals): tests/test_hf_configs.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import zoo

transformers = pytest.importorskip("transformers")

from hf_tiny import (  # noqa: E402  (after the importorskip)
    NEW,
    VOCAB,
    _bert_config,
    _build,
    _close,
    _convert,
    _gpt2_config,
    _llama_config,
    _t5_config,
    _tokens,
)


def _hf_generate(hf: torch.nn.Module, ids: Tensor) -> Tensor:
    hf.generation_config.eos_token_id = None  # run all NEW steps, as zoo does with eos_token_id=None
    hf.generation_config.pad_token_id = 0
    with torch.no_grad():
        return hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1, max_new_tokens=NEW)


def _assert_varied(continuation: Tensor) -> None:
    assert len(set(continuation.flatten().tolist())) > 1, f"degenerate greedy path {continuation.tolist()}"


@pytest.fixture(scope="module")
def gpt2():
    return _build(transformers.GPT2LMHeadModel, _gpt2_config())


@pytest.fixture(scope="module")
def llama():
    return _build(transformers.LlamaForCausalLM, _llama_config())


def _t5(version: str, init: float = 1.0) -> torch.nn.Module:
    """``init`` scales T5's initializer. Greedy paths need 4.0 to vary, but T5 does not scale its
    attention scores, so at 4.0 fp32 summation order alone moves logits by ~1e-3 (HF's own eager and
    sdpa paths disagree by 4e-4): logits are compared at 1.0, generations at 4.0."""
    if version == "v1.0":  # ReLU, tied head, logits scaled by d_model**-0.5
        return _build(
            transformers.T5ForConditionalGeneration, _t5_config(feed_forward_proj="relu", initializer_factor=init)
        )
    hf = _build(
        transformers.T5ForConditionalGeneration,
        _t5_config(feed_forward_proj="gated-gelu", tie_word_embeddings=False, initializer_factor=init),
    )
    # transformers 5 builds the head tied even so (a checkpoint with its own lm_head unties it on load)
    hf.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, 64, generator=torch.Generator().manual_seed(3)))
    return hf


# ---- GPT-2 -------------------------------------------------------------------------------------
def test_gpt2_logits(gpt2):
    model = _convert(gpt2)
    ids = _tokens(2, 12)
    with torch.no_grad():
        _close(model(ids), gpt2(ids).logits)
    assert model.config.tie_embeddings and model.config.gelu_approximate == "tanh"
    assert not model.training


def test_gpt2_untied_head():
    hf = _build(transformers.GPT2LMHeadModel, _gpt2_config(tie_word_embeddings=False))
    model = _convert(hf)
    assert not model.config.tie_embeddings
    ids = _tokens(2, 12)
    with torch.no_grad():
        _close(model(ids), hf(ids).logits)


def test_gpt2_base_model_features():
    hf = _build(transformers.GPT2Model, _gpt2_config())
    model = _convert(hf)
    ids = _tokens(2, 12)
    with torch.no_grad():
        _close(model.features(ids), hf(ids).last_hidden_state)


def test_dtype_and_copy():
    hf = _build(transformers.GPT2LMHeadModel, _gpt2_config()).to(torch.bfloat16)
    assert zoo.hf.stored_dtypes(hf) == {torch.bfloat16}
    assert {p.dtype for p in zoo.from_hf(hf).parameters()} == {torch.float32}  # float32 unless told
    model = zoo.from_hf(hf, dtype=None)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    with pytest.raises(ValueError, match="floating dtype"):
        zoo.from_hf(hf, dtype=torch.int8)
    hf_storage = {p.data_ptr() for p in hf.parameters()}
    assert not any(p.data_ptr() in hf_storage for p in model.parameters()), "zoo must own its weights"


# ---- BERT --------------------------------------------------------------------------------------
def _bert_inputs() -> tuple[Tensor, Tensor, Tensor]:
    ids = _tokens(2, 12)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # right padding
    segments = torch.zeros_like(ids)
    segments[:, 5:] = 1
    return ids, mask, segments


def test_bert_hidden_and_pooled():
    hf = _build(transformers.BertModel, _bert_config())
    model = _convert(hf)
    ids, mask, segments = _bert_inputs()
    keep = mask.bool()
    with torch.no_grad():
        out = hf(ids, attention_mask=mask, token_type_ids=segments)
        hidden = model(ids, mask, segments)
        _close(hidden[keep], out.last_hidden_state[keep])  # padded positions are never used
        _close(model.pool(hidden), out.pooler_output)
    assert model.config.norm_placement == "post" and model.config.gelu_approximate == "none"


def test_bert_mlm_logits():
    hf = _build(transformers.BertForMaskedLM, _bert_config())
    model = _convert(hf)
    assert model.config.mlm_head and not model.config.pooler
    ids, mask, segments = _bert_inputs()
    keep = mask.bool()
    with torch.no_grad():
        logits = model.mlm_logits(model(ids, mask, segments))
        _close(logits[keep], hf(ids, attention_mask=mask, token_type_ids=segments).logits[keep])


def test_bert_task_head_is_left_out_with_a_warning():
    hf = _build(transformers.BertForSequenceClassification, _bert_config(num_labels=3))
    with pytest.warns(UserWarning, match="classifier"):
        model = zoo.from_hf(hf)
    ids, mask, segments = _bert_inputs()
    keep = mask.bool()
    with torch.no_grad():
        out = hf.bert(ids, attention_mask=mask, token_type_ids=segments)
        hidden = model(ids, mask, segments)
        _close(hidden[keep], out.last_hidden_state[keep])
        _close(model.pool(hidden), out.pooler_output)


# ---- T5 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["v1.0", "v1.1"])
def test_t5_logits_padded_source(version):
    hf = _t5(version)
    model = _convert(hf)
    tied = version == "v1.0"
    assert model.config.tie_embeddings is tied
    assert model.config.logit_scale == (64**-0.5 if tied else 1.0)
    src = _tokens(2, 10)
    src_mask = torch.ones_like(src)
    src_mask[0, 6:] = 0
    tgt = _tokens(2, 7, seed=2)
    with torch.no_grad():
        expected = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
        _close(model(src, tgt, attention_mask=src_mask), expected)


@pytest.mark.parametrize("version", ["v1.0", "v1.1"])
def test_t5_generate_cached(version):
    hf = _t5(version, init=4.0)
    model = _convert(hf)
    src = _tokens(1, 9)
    expected = _hf_generate(hf, src)
    got = model.generate(src, max_new_tokens=NEW, eos_token_id=None)
    assert got[0, 0].item() == model.config.decoder_start_token_id
    assert got.tolist() == expected.tolist()
    _assert_varied(got[:, 1:])


# ---- Llama, Qwen2 ------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["gqa", "rope_linear", "qwen2", "qwen2_tied", "qwen3", "qwen3_windowed", "olmo2"])
def test_rope_decoder_logits(variant):
    if variant.startswith(("qwen3", "olmo2")):  # Qwen3: a head wider than d_model / n_heads, as its 0.6B has
        window = dict(use_sliding_window=True, sliding_window=5, max_window_layers=0) if "windowed" in variant else {}
        if variant == "olmo2":
            hf = _build(transformers.Olmo2ForCausalLM, _llama_config(transformers.Olmo2Config))
        else:
            hf = _build(transformers.Qwen3ForCausalLM, _llama_config(transformers.Qwen3Config, head_dim=24, **window))
        with torch.no_grad():  # the RMSNorms start at one: move them, so that their weights are mapped
            for name, p in hf.named_parameters():
                if "norm" in name:
                    p.uniform_(0.5, 1.5)
    elif variant == "gqa":
        hf = _build(transformers.LlamaForCausalLM, _llama_config())
    elif variant == "rope_linear":
        hf = _build(
            transformers.LlamaForCausalLM,
            _llama_config(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}),
        )
    else:
        hf = _build(
            transformers.Qwen2ForCausalLM,
            _llama_config(transformers.Qwen2Config, tie_word_embeddings=variant == "qwen2_tied"),
        )
    model = _convert(hf)
    cfg = model.config
    assert cfg.resolved_n_kv_heads == 2 and cfg.n_heads == 4
    if variant == "rope_linear":
        assert (cfg.rope_base, cfg.rope_scaling, cfg.rope_scaling_factor) == (500.0, "linear", 2.0)
    if variant.startswith("qwen2"):
        assert cfg.qkv_bias and not cfg.bias
        assert cfg.tie_embeddings is (variant == "qwen2_tied")
    if variant == "olmo2":
        assert (cfg.norm_placement, cfg.qk_norm, cfg.qk_norm_scope) == ("res_post", "rmsnorm", "all")
    if variant.startswith("qwen3"):
        assert (cfg.qk_norm, cfg.resolved_head_dim, cfg.bias, cfg.qkv_bias) == ("rmsnorm", 24, False, None)
        assert cfg.window == (5 if variant == "qwen3_windowed" else None)
    ids = _tokens(2, 12)
    with torch.no_grad():
        _close(model(ids), hf(ids).logits)


def test_llama_base_model_features():
    hf = _build(transformers.LlamaModel, _llama_config())
    with pytest.warns(UserWarning, match="no lm_head"):  # an untied config without its head
        model = zoo.from_hf(hf)
    ids = _tokens(2, 12)
    with torch.no_grad():
        _close(model.features(ids), hf(ids).last_hidden_state)


# ---- generation --------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_generate_cached(family, request):
    hf = request.getfixturevalue(family)
    model = _convert(hf)
    ids = _tokens(1, 7)
    expected = _hf_generate(hf, ids)
    got = model.generate(ids, max_new_tokens=NEW, eos_token_id=None)
    assert got.tolist() == expected.tolist()
    _assert_varied(got[:, ids.shape[1] :])


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_generate_left_padded_batch(family, request):
    hf = request.getfixturevalue(family)
    model = _convert(hf)
    prompts = [_tokens(4, seed=5).tolist(), _tokens(9, seed=6).tolist()]
    got = model.generate(prompts, max_new_tokens=NEW, eos_token_id=None)  # (2, 9 + NEW), left-padded
    for row, prompt in zip(got, prompts, strict=True):
        alone = _hf_generate(hf, torch.tensor([prompt]))[0]
        assert row[-len(alone) :].tolist() == alone.tolist()
        _assert_varied(alone[len(prompt) :])
