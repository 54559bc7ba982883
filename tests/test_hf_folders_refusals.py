"""What ``zoo.to_hf`` refuses, before anything is written: compositions no transformers class
computes (the message names the setting and the formats that can export it), a folder that exists,
a classifier that does not fit, files that would leave the folder; and a write that fails or is
vetoed by its check leaves nothing behind. The cases a review found wrong once are at the end."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import zoo

transformers = pytest.importorskip("transformers")

from hf_folder_models import (  # noqa: E402  (after the importorskip)
    _BERT,
    _GPT,
    _LLAMA,
    _T5,
    NATIVE,
    _compare,
    _load_clean,
    _native,
    _right_padded,
)
from hf_tiny import _close  # noqa: E402

# ---- refusals -----------------------------------------------------------------------------------------
REFUSED = {  # a composition no transformers class computes -> the setting the message must name
    "alibi": (dict(_LLAMA, position="alibi"), "position=alibi"),
    "post_norm_llama": (dict(_LLAMA, norm_placement="post"), "norm_placement=post"),
    "learned_rmsnorm_decoder": (dict(_GPT, norm="rmsnorm"), "norm=rmsnorm"),
    "prefix_mask": (dict(_GPT, mask="prefix"), "mask=prefix"),
    "sandwich_norm": (dict(_LLAMA, norm_placement="sandwich"), "norm_placement=sandwich"),
    "encoder_decoder_rope": (
        dict(_T5, position="rope", attn_scale=None, logit_scale=1.0, tie_embeddings=False, ffn="relu"),
        "position=rope",
    ),
    "sinusoidal_encoder": (dict(_BERT, position="sinusoidal", max_seq_len=None), "position=sinusoidal"),
    "ntk_rope": (dict(_LLAMA, rope_scaling="ntk", rope_scaling_factor=2.0), "rope_scaling=ntk"),
    "scaled_embeddings": (dict(_GPT, embed_scale=8.0), "embed_scale=8.0"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_unexportable_composition_is_refused_before_writing(name, tmp_path):
    values, field = REFUSED[name]
    registered = zoo.list_components()
    for key in ("position", "norm_placement", "mask"):
        if key in values:
            assert values[key] in registered[key], f"{key}={values[key]} is no longer registered; update the test"
    model = zoo.build_model(zoo.ModelConfig(**values), seed=0)
    with pytest.raises(zoo.ConfigError) as refused:
        zoo.hf.hf_exportable(model.config)
    message = str(refused.value)
    assert field in message and "format=safetensors" in message and "onnx" in message, message
    with pytest.raises(zoo.ConfigError, match=re.escape(field)):
        zoo.hf.to_hf(model, tmp_path / "out")
    with pytest.raises(zoo.ConfigError, match=re.escape(field)):
        zoo.hf.family_class(model.config)
    assert list(tmp_path.iterdir()) == []  # no folder, no temporary sibling


def test_existing_folder_is_not_overwritten(tmp_path):
    model = _native(NATIVE["gpt2_gelu_erf"][0])
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="out"):
        zoo.hf.to_hf(model, out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary sibling left
    (tmp_path / "file").write_text("a file")
    with pytest.raises(FileExistsError):
        zoo.hf.to_hf(model, tmp_path / "file")
    assert (tmp_path / "file").read_text() == "a file"


def test_existing_empty_folder_is_filled(tmp_path):
    model = _native(NATIVE["gpt2_gelu_erf"][0])
    (tmp_path / "out").mkdir()
    zoo.hf.to_hf(model, tmp_path / "out")
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    """A failure while the folder is being written (here: the disk fills up at the weights) removes
    the temporary folder: no target folder appears."""
    import safetensors.torch

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    model = _native(NATIVE["gpt2_gelu_erf"][0])
    with pytest.raises(OSError):
        zoo.hf.to_hf(model, tmp_path / "out", files={"README.md": "x"})
    assert list(tmp_path.iterdir()) == []


def test_check_sees_the_finished_folder_and_can_veto_it(tmp_path):
    model = _native(NATIVE["llama_gqa"][0])
    seen: list[list[str]] = []

    def veto(folder: Path) -> None:
        seen.append(sorted(p.name for p in folder.iterdir()))
        _compare("causal", model, _load_clean("AutoModelForCausalLM", folder))  # the folder loads as it will
        raise RuntimeError("vetoed")

    with pytest.raises(RuntimeError, match="vetoed"):
        zoo.hf.to_hf(model, tmp_path / "out", check=veto)
    assert seen == [["config.json", "generation_config.json", "model.safetensors"]]
    assert list(tmp_path.iterdir()) == []
    written = zoo.hf.to_hf(model, tmp_path / "out", check=lambda folder: None)
    assert written == zoo.hf.family_class(model.config) == "LlamaForCausalLM"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_classifier_needs_the_pooler(tmp_path):
    model = _native(dict(_BERT, type_vocab_size=2, pooler=False, mlm_head=True))
    with pytest.raises(zoo.ConfigError, match="pooler"):
        zoo.hf.to_hf(model, tmp_path / "out", classifier=nn.Linear(64, 3), label_names=["a", "b", "c"])
    assert list(tmp_path.iterdir()) == []


def test_classifier_on_a_decoder_is_refused(tmp_path):
    model = _native(NATIVE["gpt2_gelu_erf"][0])
    with pytest.raises(zoo.ConfigError):
        zoo.hf.to_hf(model, tmp_path / "out", classifier=nn.Linear(64, 3))
    assert list(tmp_path.iterdir()) == []


# ---- what a review found wrong in zoo/hf once, fixed -------------------------------------------------
def _refused_or_loads_clean(write: Callable[[], str], tmp_path: Path, auto: str) -> nn.Module | None:
    """Either a ConfigError/ValueError with nothing written, or a folder transformers loads with no
    missing or unexpected weight; the loaded model, or None when refused."""
    try:
        write()
    except ValueError:  # ConfigError is a ValueError
        assert list(tmp_path.iterdir()) == []
        return None
    return _load_clean(auto, tmp_path / "out")


def test_bert_without_pooler_or_mlm_head(tmp_path):
    model = _native(dict(_BERT, type_vocab_size=2))
    hf = _refused_or_loads_clean(lambda: zoo.hf.to_hf(model, tmp_path / "out"), tmp_path, "AutoModel")
    if hf is not None:
        ids, mask = _right_padded()
        keep = mask.bool()
        with torch.no_grad():
            _close(model(ids, mask)[keep], hf(ids, attention_mask=mask).last_hidden_state[keep])


def test_bert_with_pooler_and_mlm_head(tmp_path):
    model = _native(dict(_BERT, type_vocab_size=2, pooler=True, mlm_head=True))
    hf = _refused_or_loads_clean(lambda: zoo.hf.to_hf(model, tmp_path / "out"), tmp_path, "AutoModelForMaskedLM")
    if hf is not None:
        _compare("mlm", model, hf)


def test_classifier_over_an_encoder_with_mlm_head(tmp_path):
    model = _native(dict(_BERT, type_vocab_size=2, pooler=True, mlm_head=True))
    head = nn.Linear(64, 3)
    hf = _refused_or_loads_clean(
        lambda: zoo.hf.to_hf(model, tmp_path / "out", classifier=head), tmp_path, "AutoModelForSequenceClassification"
    )
    if hf is not None:
        ids, mask = _right_padded()
        with torch.no_grad():
            _close(hf(ids, attention_mask=mask).logits, head(model.pool(model(ids, mask))))


def test_qwen2_with_its_own_head_dim(tmp_path):
    model = _native(dict(NATIVE["qwen2"][0], head_dim=32))
    hf = _refused_or_loads_clean(lambda: zoo.hf.to_hf(model, tmp_path / "out"), tmp_path, "AutoModelForCausalLM")
    if hf is not None:
        _compare("causal", model, hf)


def test_label_names_must_match_the_classifier(tmp_path):
    model = _native(dict(_BERT, type_vocab_size=2, pooler=True))
    with pytest.raises(ValueError, match="label"):
        zoo.hf.to_hf(model, tmp_path / "out", classifier=nn.Linear(64, 3), label_names=["a", "b"])
    assert list(tmp_path.iterdir()) == []


def test_classifier_width_must_be_d_model(tmp_path):
    model = _native(dict(_BERT, type_vocab_size=2, pooler=True))
    with pytest.raises(ValueError, match="classifier|in_features|d_model"):
        zoo.hf.to_hf(model, tmp_path / "out", classifier=nn.Linear(32, 3))
    assert list(tmp_path.iterdir()) == []


def test_classifier_without_bias(tmp_path):
    model = _native(dict(_BERT, type_vocab_size=2, pooler=True))
    with pytest.raises(ValueError, match="bias"):  # BertForSequenceClassification's classifier has one
        zoo.hf.to_hf(model, tmp_path / "out", classifier=nn.Linear(64, 3, bias=False))
    assert list(tmp_path.iterdir()) == []


def test_extra_files_stay_inside_the_folder(tmp_path):
    model = _native(NATIVE["gpt2_gelu_erf"][0])
    with pytest.raises(ValueError):
        zoo.hf.to_hf(model, tmp_path / "out", files={"../escape.txt": "x"})
    assert list(tmp_path.iterdir()) == []
