"""Hugging Face model folders on disk: reading one as ``save_pretrained`` writes it (config.json and
model.safetensors, sharded safetensors, or pytorch_model.bin read weights-only), resolving a hub
repo id to its cached folder. ``zoo.to_hf`` writes one through ``zoo.io.atomic_folder``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from torch import Tensor

from zoo.hf.mapping import FAMILIES
from zoo.io import CheckpointError, load_weights_file

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9]")  # org/name, as the hub spells repo ids
HUB_FILES = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
             "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]


def is_hf_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding a HF ``config.json`` (with a ``model_type``)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        return "model_type" in json.loads(config.read_text())
    except (OSError, ValueError):
        return False


def resolve(source: str | os.PathLike) -> Path:
    """The local folder ``source`` names; ``hf:<repo id>`` (or a string ``org/name`` that is no local
    path) downloaded through ``huggingface_hub`` into its cache (config, safetensors and tokenizer
    files only). A Path is always local. Offline, a hub id fails with a CheckpointError saying so."""
    text = os.fspath(source)
    hub = text.startswith("hf:") or (isinstance(source, str) and REPO_ID.fullmatch(text) is not None
                                     and not Path(text).exists())
    if not hub:
        return Path(text)
    repo = text.removeprefix("hf:")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as error:
        raise CheckpointError(f"{text}: reading a hub model needs huggingface_hub (pip install 'zoo[hf]')") from error
    try:
        return Path(snapshot_download(repo, allow_patterns=HUB_FILES))
    except Exception as error:  # offline, no such repo, gated: the hub's own message says which
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        local = "" if text.startswith("hf:") else " It is no local folder either."
        raise CheckpointError(f"{text}: the hub model cannot be fetched ({reason}); check the repo id and that this "
                              f"machine is online, or pass the path of a downloaded folder.{local}") from error


def read_config(folder: Path) -> SimpleNamespace:
    """config.json with the family's defaults under it (config.json leaves defaults out)."""
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: no config.json; point at a Hugging Face model folder (config.json + "
                              "model.safetensors), as save_pretrained writes it")
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: not readable JSON ({error}); restore the file") from error
    if not isinstance(values, dict):
        raise CheckpointError(f"{path}: holds a JSON {type(values).__name__}, not a model config; restore the file")
    model_type = values.get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(f"{path}: model_type={model_type!r} is not a family zoo reads; supported: "
                              f"{', '.join(FAMILIES.names())}")
    return SimpleNamespace(**{**FAMILIES.get(model_type).defaults, **values})


def read_tensors(folder: Path) -> dict[str, Tensor]:
    """Every tensor of the folder's weights: safetensors first, else pytorch_model.bin (weights-only)."""
    present = [name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not present:
        raise CheckpointError(f"{folder}: no weights ({', '.join(WEIGHT_FILES[::2])}); copy them into the folder")
    name = present[0]
    files = [name]
    if name.endswith(".index.json"):
        try:
            files = sorted(set(json.loads((folder / name).read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise CheckpointError(f"{folder / name}: not a weight index ({error}); restore the file") from error
    tensors: dict[str, Tensor] = {}
    for file in files:
        tensors.update(_read_file(folder / file))
    return tensors


def _read_file(path: Path) -> dict[str, Tensor]:
    if path.suffix != ".safetensors":
        state = load_weights_file(path, what="weights file")
        state = state.get("state_dict", state) if isinstance(state, dict) else state
        if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
            raise CheckpointError(f"{path}: holds no state dict of tensors; restore the file")
        return dict(state)
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise CheckpointError(f"{path}: missing (the index names it); copy it into the folder")
    try:
        return load_file(path)
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"{path}: not a readable safetensors file ({error}); restore it") from error


def write_json(path: Path, values: dict[str, Any]) -> None:
    path.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")
