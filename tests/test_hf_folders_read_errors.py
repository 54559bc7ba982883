"""HF folders that cannot be read: no or a damaged config.json, an unknown model_type, missing or
damaged weight files, a missing shard or tensor, files of the wrong shape, a hub id offline, and a
missing local path that is not taken for a hub id. Each is a CheckpointError naming the file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import zoo

transformers = pytest.importorskip("transformers")

from hf_folder_models import HF  # noqa: E402  (after the importorskip)
from safetensors.torch import load_file, save_file  # noqa: E402


# ---- errors reading -----------------------------------------------------------------------------------
@pytest.fixture
def gpt2_folder(tmp_path) -> Path:
    HF["gpt2"].build(1.0).save_pretrained(tmp_path / "hf")
    return tmp_path / "hf"


def test_folder_without_config(gpt2_folder):
    (gpt2_folder / "config.json").unlink()
    with pytest.raises(zoo.CheckpointError, match="config.json"):
        zoo.from_hf(gpt2_folder)


def test_folder_with_damaged_config(gpt2_folder):
    (gpt2_folder / "config.json").write_text('{"model_type": "gpt2", ')
    with pytest.raises(zoo.CheckpointError, match="config.json"):
        zoo.from_hf(gpt2_folder)


@pytest.mark.parametrize("model_type", ["bart", None])
def test_folder_with_unknown_model_type(gpt2_folder, model_type):
    config = json.loads((gpt2_folder / "config.json").read_text())
    config.pop("model_type")
    if model_type:
        config["model_type"] = model_type
    (gpt2_folder / "config.json").write_text(json.dumps(config))
    supported = re.escape(", ".join(zoo.hf.FAMILIES.names()))
    with pytest.raises(zoo.CheckpointError, match=rf"config\.json.*model_type={model_type!r}.*supported: {supported}$"):
        zoo.from_hf(gpt2_folder)


def test_folder_without_weights(gpt2_folder):
    (gpt2_folder / "model.safetensors").unlink()
    with pytest.raises(zoo.CheckpointError, match="model.safetensors"):
        zoo.from_hf(gpt2_folder)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_folder_with_damaged_safetensors(gpt2_folder, damage):
    file = gpt2_folder / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(
        {"garbage": b"\x00not safetensors" * 64, "truncated": data[: len(data) // 2], "empty": b""}[damage]
    )
    with pytest.raises(zoo.CheckpointError, match=re.escape(str(file))):
        zoo.from_hf(gpt2_folder)


def test_folder_with_damaged_pytorch_model_bin(gpt2_folder):
    (gpt2_folder / "model.safetensors").unlink()
    file = gpt2_folder / "pytorch_model.bin"
    torch.save(HF["gpt2"].build(1.0).state_dict(), file)
    file.write_bytes(file.read_bytes()[:1000])  # cut short
    with pytest.raises(zoo.CheckpointError, match="pytorch_model.bin"):
        zoo.from_hf(gpt2_folder)


def test_sharded_folder_with_a_missing_shard(tmp_path):
    HF["llama_gqa"].build(1.0).save_pretrained(tmp_path, max_shard_size="40KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(zoo.CheckpointError, match=re.escape(shard.name)):
        zoo.from_hf(tmp_path)


def test_folder_missing_a_backbone_tensor_names_it(gpt2_folder):
    file = gpt2_folder / "model.safetensors"
    tensors = load_file(file)
    del tensors["transformer.h.1.mlp.c_fc.weight"]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=re.escape("transformer.h.1.mlp.c_fc.weight")):
        zoo.from_hf(gpt2_folder)


def test_is_hf_folder(gpt2_folder, tmp_path):
    assert zoo.hf.is_hf_folder(gpt2_folder)
    assert not zoo.hf.is_hf_folder(tmp_path)  # no config.json
    (tmp_path / "config.json").write_text('{"arch": "decoder"}')  # zoo's own config: no model_type
    assert not zoo.hf.is_hf_folder(tmp_path)


def test_hub_id_offline_fails_fast_with_a_checkpoint_error(monkeypatch):
    pytest.importorskip("huggingface_hub")
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # the hub reads HF_HUB_OFFLINE when it is imported (transformers imported it already)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)
    with pytest.raises(zoo.CheckpointError, match=r"hf:zoo-test-org/no-such-model.*online"):
        zoo.from_hf("hf:zoo-test-org/no-such-model")


# ---- what a review found wrong in zoo/hf once, fixed -------------------------------------------------
@pytest.mark.parametrize("damage", ["config_is_a_list", "index_map_is_a_list", "bin_is_a_list"])
def test_folder_files_of_the_wrong_shape(gpt2_folder, damage):
    if damage == "config_is_a_list":
        file = gpt2_folder / "config.json"
        file.write_text("[1, 2]")
    elif damage == "index_map_is_a_list":
        (gpt2_folder / "model.safetensors").unlink()
        file = gpt2_folder / "model.safetensors.index.json"
        file.write_text(json.dumps({"weight_map": ["model.safetensors"]}))
    else:
        (gpt2_folder / "model.safetensors").unlink()
        file = gpt2_folder / "pytorch_model.bin"
        torch.save([torch.zeros(1)], file)
    with pytest.raises(zoo.CheckpointError, match=re.escape(file.name)):
        zoo.from_hf(gpt2_folder)


@pytest.mark.parametrize("source", ["./no-such-folder", Path("runs/no-such-folder")])
def test_missing_local_path_is_not_a_hub_id(source, tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    import huggingface_hub.constants

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)
    with pytest.raises(zoo.CheckpointError) as error:
        zoo.from_hf(source)
    assert "hub" not in str(error.value), str(error.value)
