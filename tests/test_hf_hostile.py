"""Hugging Face folders made to mislead (issue 20, item 5): an index that names shards outside the
folder, a config.json whose sizes or types disagree with the tensors, weights that are not weights.
Each is one CheckpointError naming the file and the field, raised before a weight is read."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import zoo

transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402  (after the importorskip)
from test_hf import _gpt2_config  # noqa: E402
from test_reliability import one_line_error, run  # noqa: E402


@pytest.fixture
def folder(tmp_path) -> Path:
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(_gpt2_config()).save_pretrained(tmp_path / "hf")
    return tmp_path / "hf"


def _as_index(folder: Path, shard: str) -> Path:
    """The folder's weights replaced by an index naming ``shard`` for every tensor."""
    names = list(load_file(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": dict.fromkeys(names, shard)}))
    return index


def _edit_config(folder: Path, **values) -> Path:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))
    return path


def test_an_index_naming_a_shard_outside_the_folder_reads_nothing(folder, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())  # loadable weights
    index = _as_index(folder, "../outside/model.safetensors")
    with pytest.raises(zoo.CheckpointError, match=re.escape(str(index)) + ".*not a file beside the index"):
        zoo.from_hf(folder)


def test_an_index_naming_an_absolute_path_neither_opens_nor_quotes_it(folder, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:do-not-show")
    index = _as_index(folder, str(secret))
    with pytest.raises(zoo.CheckpointError, match=re.escape(str(index))) as error:
        zoo.from_hf(folder)
    assert "do-not-show" not in str(error.value) and "root:x" not in str(error.value)


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("layer_norm_epsilon", "1e-5", 'layer_norm_epsilon="1e-5" is not a number'),
        ("n_layer", None, "n_layer=null is not an integer"),
        ("n_head", 4.0, "n_head=4.0 is not an integer"),
        ("tie_word_embeddings", "yes", 'tie_word_embeddings="yes" is not true or false'),
    ],
)
def test_a_config_value_of_the_wrong_type_names_its_field(folder, field, value, needle):
    path = _edit_config(folder, **{field: value})
    with pytest.raises(zoo.CheckpointError, match=re.escape(f"{path}: {needle}")):
        zoo.from_hf(folder)


@pytest.mark.parametrize(
    ("width", "needle"),
    [
        (4096, r"has shape \(100, 64\) but config\.json's n_embd=4096 makes it \(100, 4096\)"),
        (1 << 40, r"config\.json: its config asks for sizes no model can have"),  # too large to describe at all
    ],
)
def test_a_config_sized_unlike_the_tensors_is_named_before_a_weight_is_read(folder, width, needle, monkeypatch):
    _edit_config(folder, n_embd=width)
    monkeypatch.setattr("safetensors.torch.load_file", None)  # reading a weight would fail otherwise
    with pytest.raises(zoo.CheckpointError, match=needle):
        zoo.from_hf(folder)


def _rewrite(folder: Path, name: str, change) -> Path:
    file = folder / "model.safetensors"
    tensors = load_file(file)
    tensors[name] = change(tensors[name])
    save_file(tensors, file, metadata={"format": "pt"})
    return file


def test_a_transposed_weight_is_named_with_its_file(folder):
    name = "transformer.h.0.attn.c_attn.weight"  # (64, 192) in GPT-2's Conv1D layout
    file = _rewrite(folder, name, lambda t: t.t().contiguous())
    with pytest.raises(zoo.CheckpointError, match=re.escape(f"{file}: {name} is stored transposed")):
        zoo.from_hf(folder)


def test_integer_weights_are_not_weights(folder):
    name = "transformer.h.1.mlp.c_fc.weight"
    file = _rewrite(folder, name, lambda t: t.to(torch.int32))
    with pytest.raises(zoo.CheckpointError, match=re.escape(f"{file}: {name} holds int32 values")):
        zoo.from_hf(folder)


def test_a_weight_of_another_models_size_names_the_config_field(folder):
    name = "transformer.wte.weight"
    _rewrite(folder, name, lambda t: torch.zeros(t.shape[0] + 7, t.shape[1]))
    with pytest.raises(zoo.CheckpointError, match=re.escape(name) + r".*config\.json's vocab_size=100"):
        zoo.from_hf(folder)


@pytest.mark.slow
def test_zoo_train_from_a_hostile_folder_is_one_line(folder, tmp_path):
    index = _as_index(folder, "../../elsewhere.safetensors")
    done = run("train", "experiment=gpt_generator", f"init_from={folder}", "trainer.max_steps=1", cwd=tmp_path)
    one_line_error(done, "CheckpointError", str(index), "not a file beside the index")
