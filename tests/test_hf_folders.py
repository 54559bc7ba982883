"""Hugging Face model folders, both ways: ``zoo.from_hf(folder)`` reads what ``save_pretrained``
writes, ``zoo.to_hf`` writes what transformers' Auto classes load (no trust_remote_code), and a
folder read and written again keeps every tensor.

Everything is tiny and fp32 on CPU. Random weights use a large std (0.2; T5: initializer_factor 4.0
for generation, see tests/test_hf.py::_t5) so that greedy paths are not one token repeated (each
generation test checks that its paths vary, so it can fail), and biases and norm weights are moved
off their 0/1 init, so a bias or norm put in the wrong place changes the outputs. The tiny models
and the comparisons are tests/hf_folder_models.py's.

The rest of the folder tests: config.json defaults (tests/test_hf_folders_config.py), compositions
and arguments refused before anything is written (tests/test_hf_folders_refusals.py), folders that
cannot be read (tests/test_hf_folders_read_errors.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

import zoo

transformers = pytest.importorskip("transformers")

from hf_folder_models import (  # noqa: E402  (after the importorskip)
    _BERT,
    HF,
    NATIVE,
    _compare,
    _load_clean,
    _native,
    _perturb_vectors,
    _right_padded,
    _same_state,
    _silent_from_hf,
    _tokens,
)
from hf_tiny import NEW, VOCAB, _close  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402


def _assert_varied(continuation: Tensor) -> None:
    for row in continuation.tolist():
        assert len(set(row)) > 1, f"degenerate greedy path {continuation.tolist()}"


# ---- reading folders ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(HF))
def test_folder_reads_as_the_loaded_model(name, tmp_path):
    spec = HF[name]
    hf = spec.build(1.0)
    hf.save_pretrained(tmp_path)
    model = _silent_from_hf(tmp_path)
    assert not model.training
    _compare(spec.kind, model, hf)
    from_module = _silent_from_hf(hf)
    assert model.config == from_module.config
    _same_state(model, from_module)


def test_folder_with_pytorch_model_bin(tmp_path):
    """transformers 5's save_pretrained writes safetensors only (safe_serialization is gone), so the
    weights are written as 4.x did with safe_serialization=False: torch.save of the state dict, where
    the tied head shares the embedding's storage."""
    hf = HF["gpt2"].build(1.0)
    hf.config.save_pretrained(tmp_path)
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "pytorch_model.bin"]
    model = _silent_from_hf(tmp_path)
    assert model.config.tie_embeddings
    _compare("causal", model, hf)
    _same_state(model, zoo.from_hf(hf))


def test_sharded_folder(tmp_path):
    hf = HF["llama_gqa"].build(1.0)
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) >= 2 and (tmp_path / "model.safetensors.index.json").is_file()
    assert not (tmp_path / "model.safetensors").exists()
    model = _silent_from_hf(tmp_path)
    _compare("causal", model, hf)
    _same_state(model, zoo.from_hf(hf))


def test_bf16_folder_reads_as_float32_unless_told(tmp_path):
    hf = HF["llama_gqa"].build(1.0).to(torch.bfloat16)
    hf.save_pretrained(tmp_path)
    assert zoo.hf.stored_dtypes(tmp_path) == {torch.bfloat16}
    model = _silent_from_hf(tmp_path)
    assert {t.dtype for t in model.state_dict().values() if t.is_floating_point()} == {torch.float32}
    kept = zoo.from_hf(tmp_path, dtype=None)
    assert {t.dtype for t in kept.state_dict().values() if t.is_floating_point()} == {torch.bfloat16}
    _same_state(kept, zoo.from_hf(hf, dtype=None))
    _same_state(model, kept.float())  # the cast is exact: bf16 values are float32 values
    from tasks.cli.pretrained import pretrained_source

    assert pretrained_source(str(tmp_path)).loaded() == ", bfloat16 weights read as float32"  # init_from's line


# ---- writing ------------------------------------------------------------------------------------------
def _hf_generate(hf: nn.Module, ids: Tensor, mask: Tensor | None = None) -> Tensor:
    hf.generation_config.eos_token_id = None  # run all NEW steps, as zoo does with eos_token_id=None
    hf.generation_config.pad_token_id = 0
    with torch.no_grad():
        return hf.generate(
            ids,
            attention_mask=torch.ones_like(ids) if mask is None else mask,
            do_sample=False,
            num_beams=1,
            max_new_tokens=NEW,
        )


def _compare_generation(model: zoo.ZooModel, hf: nn.Module) -> None:
    """Greedy continuations agree: a decoder on a left-padded batch (HF derives positions from the
    attention mask while generating), an encoder-decoder on a right-padded source."""
    if model.config.form.cross_attention:
        src, mask = _right_padded(2, 9)
        expected = _hf_generate(hf, src, mask)
        got = model.generate(src, attention_mask=mask, max_new_tokens=NEW, eos_token_id=None)
        assert got[:, 0].tolist() == [model.config.decoder_start_token_id] * 2
        assert got.tolist() == expected.tolist()
        _assert_varied(got[:, 1:])
        return
    ids = _tokens(2, 7, seed=4)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    ids[mask == 0] = 0
    expected = _hf_generate(hf, ids, mask)
    got = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=None)
    assert got.tolist() == expected.tolist()
    _assert_varied(got[:, ids.shape[1] :])


def _check_written(model: zoo.ZooModel, folder: Path, architecture: str) -> None:
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == [architecture]
    assert config["model_type"] == zoo.hf.hf_exportable(model.config)
    generates = type(model).decoding is not None
    assert (folder / "generation_config.json").is_file() is generates
    if generates:
        written = transformers.GenerationConfig.from_pretrained(folder)
        assert written.eos_token_id == model.config.eos_token_id
        assert written.pad_token_id == model.config.pad_token_id
        if model.config.form.cross_attention:
            assert written.decoder_start_token_id == model.config.decoder_start_token_id


@pytest.mark.parametrize("name", list(HF))
def test_converted_model_writes_a_folder_transformers_loads(name, tmp_path):
    spec = HF[name]
    model = zoo.from_hf(spec.build(1.0))
    architecture = zoo.hf.to_hf(model, tmp_path / "out")
    _check_written(model, tmp_path / "out", architecture)
    hf = _load_clean(spec.auto, tmp_path / "out")
    assert type(hf).__name__ == architecture
    _compare(spec.kind, model, hf)
    if spec.kind in ("causal", "seq2seq"):
        model = zoo.from_hf(spec.build(4.0)) if spec.kind == "seq2seq" else model
        zoo.hf.to_hf(model, tmp_path / "gen")
        _compare_generation(model, _load_clean(spec.auto, tmp_path / "gen"))


PRESETS = {  # zoo.create_model(preset, **overrides) -> (family, transformers class, Auto class, kind)
    "gpt-tiny": (
        dict(d_model=64, vocab_size=VOCAB, max_seq_len=64, init_std=0.2),
        "GPT2LMHeadModel",
        "AutoModelForCausalLM",
        "causal",
    ),
    "llama-tiny": (
        dict(d_model=64, d_ff=96, vocab_size=VOCAB, max_seq_len=64, init_std=0.2),
        "LlamaForCausalLM",
        "AutoModelForCausalLM",
        "causal",
    ),
    "bert-tiny": (
        dict(d_model=64, d_ff=128, vocab_size=VOCAB, max_seq_len=64, init_std=0.2),
        "BertModel",
        "AutoModel",
        "base",
    ),
    "t5-tiny": (
        dict(vocab_size=VOCAB, d_ff=256, init_std=0.5),
        "T5ForConditionalGeneration",
        "AutoModelForSeq2SeqLM",
        "seq2seq",
    ),
}


@pytest.mark.parametrize("preset", list(PRESETS))
def test_preset_exports_as_is(preset, tmp_path):
    """A preset's composition (GPT-2's GELU tanh -> gelu_new, T5's scaled tied head, ...) exports unchanged."""
    overrides, architecture, auto, kind = PRESETS[preset]
    model = zoo.create_model(preset, seed=0, **overrides).eval()
    _perturb_vectors(model, 0)
    assert zoo.hf.to_hf(model, tmp_path / "out") == architecture == zoo.hf.family_class(model.config)
    hf = _load_clean(auto, tmp_path / "out")
    _compare(kind, model, hf)
    if kind != "base":
        _compare_generation(model, hf)


@pytest.mark.parametrize("name", list(NATIVE))
def test_native_model_writes_a_folder_transformers_loads(name, tmp_path):
    values, auto, kind, family = NATIVE[name]
    model = _native(values)
    assert zoo.hf.hf_exportable(model.config) == family
    architecture = zoo.hf.to_hf(model, tmp_path / "out", files={"README.md": "# tiny\n"})
    assert (tmp_path / "out" / "README.md").read_text() == "# tiny\n"
    _check_written(model, tmp_path / "out", architecture)
    hf = _load_clean(auto, tmp_path / "out")
    assert type(hf).__name__ == architecture
    _compare(kind, model, hf)
    if kind in ("causal", "seq2seq"):
        _compare_generation(model, hf)
    # and back: the same config and weights (BERT without segments reads its zero token-type table)
    back = _silent_from_hf(tmp_path / "out")
    expected = _resolved(model.config)
    if model.config.arch == "encoder" and not model.config.type_vocab_size:
        expected = expected.replace(type_vocab_size=1)
        assert torch.equal(back.segment.weight, torch.zeros(1, 64))
        back.segment = None
    assert _resolved(back.config) == expected
    _same_state(model, back)


def _resolved(cfg: zoo.ModelConfig) -> zoo.ModelConfig:
    """attn_dropout=None means "= dropout"; HF configs store the number."""
    return cfg.replace(attn_dropout=cfg.dropout if cfg.attn_dropout is None else cfg.attn_dropout)


def test_a_missing_weight_is_detected(tmp_path):
    """The load check above fails when the written file lacks a weight (transformers then initialises it)."""
    model = _native(NATIVE["llama_gqa"][0])
    zoo.hf.to_hf(model, tmp_path / "out")
    file = tmp_path / "out" / "model.safetensors"
    tensors = load_file(file)
    del tensors["model.layers.1.post_attention_layernorm.weight"]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(AssertionError, match="post_attention_layernorm"):
        _load_clean("AutoModelForCausalLM", tmp_path / "out")


def test_an_unexpected_weight_is_detected(tmp_path):
    model = _native(NATIVE["gpt2_gelu_erf"][0])
    zoo.hf.to_hf(model, tmp_path / "out")
    file = tmp_path / "out" / "model.safetensors"
    save_file({**load_file(file), "transformer.extra.weight": torch.zeros(3)}, file, metadata={"format": "pt"})
    with pytest.raises(AssertionError, match="transformer.extra.weight"):
        _load_clean("AutoModelForCausalLM", tmp_path / "out")


def test_classifier_exports_as_bert_for_sequence_classification(tmp_path):
    model = _native(dict(_BERT, type_vocab_size=2, pooler=True))
    head = nn.Linear(64, 3)
    with torch.no_grad():
        head.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(7))
        head.bias.normal_(0, 0.5, generator=torch.Generator().manual_seed(8))
    written = zoo.hf.to_hf(model, tmp_path / "out", classifier=head, label_names=["a", "b", "c"])
    assert written == "BertForSequenceClassification"
    hf = _load_clean("AutoModelForSequenceClassification", tmp_path / "out")
    assert type(hf).__name__ == written
    assert hf.config.id2label == {0: "a", 1: "b", 2: "c"}
    assert hf.config.label2id == {"a": 0, "b": 1, "c": 2}
    ids, mask = _right_padded()
    segments = torch.zeros_like(ids)
    segments[:, 6:] = 1
    with torch.no_grad():
        expected = head(model.pool(model(ids, mask, segments)))
        _close(hf(ids, attention_mask=mask, token_type_ids=segments).logits, expected)
    assert expected.std() > 0.1  # the logits depend on the input: the comparison can fail


def test_bf16_model_writes_bf16(tmp_path):
    model = _native(NATIVE["llama_gqa"][0]).to(torch.bfloat16)
    zoo.hf.to_hf(model, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert {t.dtype for t in load_file(tmp_path / "out" / "model.safetensors").values()} == {torch.bfloat16}
    _same_state(model, zoo.from_hf(tmp_path / "out", dtype=None))


# ---- round trip ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(HF))
def test_round_trip_keeps_every_tensor(name, tmp_path):
    """HF folder -> zoo -> HF folder: the same tensors under the same names, tied weights saved once
    in both files, and the reloaded HF model equal to the original."""
    spec = HF[name]
    hf = spec.build(1.0)
    hf.save_pretrained(tmp_path / "hf")
    zoo.hf.to_hf(zoo.from_hf(tmp_path / "hf"), tmp_path / "zoo")
    original = load_file(tmp_path / "hf" / "model.safetensors")
    written = load_file(tmp_path / "zoo" / "model.safetensors")
    assert written.keys() == original.keys()
    for key in original:
        assert torch.equal(written[key], original[key]), key
    again = _load_clean(spec.auto, tmp_path / "zoo")
    state, expected = again.state_dict(), hf.state_dict()
    assert state.keys() == expected.keys()
    for key in expected:
        assert torch.equal(state[key], expected[key]), key
