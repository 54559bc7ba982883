"""Hugging Face model folders on disk: reading one as ``save_pretrained`` writes it (config.json and
model.safetensors, sharded safetensors, or pytorch_model.bin read weights-only), resolving a hub
repo id to its cached folder. ``zoo.to_hf`` writes one through ``zoo.folders.atomic_folder``.

Every file is read through ``zoo.io.read_handed`` / ``handed_path``: it must be the folder's own
(no link out of it but into a hub cache's blobs, a regular file, no hard link to a name elsewhere)
and no larger than its kind allows, checked before it is read."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from zoo.hf.mapping import FAMILIES
from zoo.io import (
    INDEX_LIMIT,
    JSON_LIMIT,
    CheckpointError,
    handed_path,
    load_weights_file,
    parse_json,
    read_handed,
)

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9]")  # org/name, as the hub spells repo ids
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}  # safetensors' dtype names (others read as uint8: no weights either way)
HUB_FILES = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
]


def is_hf_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding a HF ``config.json`` (with a ``model_type``). A config.json
    that is not the folder's own file (``zoo.io.handed_path``) or not JSON counts: reading the folder
    then says why in one line (a zoo folder's config.json is JSON without a ``model_type``)."""
    if not Path(path).is_dir():
        return False
    try:
        data = read_handed(path, "config.json", limit=JSON_LIMIT)
        if data is None:
            return False
        values = parse_json(data)
    except ValueError:  # CheckpointError too
        return True
    return isinstance(values, dict) and "model_type" in values


def resolve(source: str | os.PathLike) -> Path:
    """The local folder ``source`` names; ``hf:<repo id>`` (or a string ``org/name`` that is no local
    path) downloaded through ``huggingface_hub`` into its cache (config, safetensors and tokenizer
    files only). A Path is always local. Offline, a hub id fails with a CheckpointError saying so."""
    text = os.fspath(source)
    hub = text.startswith("hf:") or (
        isinstance(source, str) and REPO_ID.fullmatch(text) is not None and not Path(text).exists()
    )
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
        raise CheckpointError(
            f"{text}: the hub model cannot be fetched ({reason}); check the repo id and that this "
            f"machine is online, or pass the path of a downloaded folder.{local}"
        ) from error


def read_config(folder: Path) -> SimpleNamespace:
    """config.json with the family's defaults under it (config.json leaves defaults out), every value
    the family reads of the type transformers writes (a CheckpointError names the first that is not)."""
    path = folder / "config.json"
    data = read_handed(folder, "config.json", limit=JSON_LIMIT)
    if data is None:
        raise CheckpointError(
            f"{folder}: no config.json; point at a Hugging Face model folder (config.json + "
            "model.safetensors), as save_pretrained writes it"
        )
    try:
        values = parse_json(data)
    except ValueError as error:
        raise CheckpointError(f"{path}: not readable JSON ({error}); restore the file") from error
    if not isinstance(values, dict):
        raise CheckpointError(f"{path}: holds a JSON {type(values).__name__}, not a model config; restore the file")
    model_type = values.get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(
            f"{path}: model_type={repr(model_type)[:60]} is not a family zoo reads; supported: "
            f"{', '.join(FAMILIES.names())}"
        )
    defaults = FAMILIES.get(model_type).defaults
    for key, value in values.items():
        check_value(path, key, value, defaults.get(key))
    return SimpleNamespace(**{**defaults, **values})


def weight_files(folder: Path) -> list[Path]:
    """The folder's weight files: model.safetensors first, else the shards its index names (plain
    names beside the index, never a path out of the folder), else pytorch_model.bin."""
    present = [name for name in WEIGHT_FILES if handed_path(folder, name, limit=None) is not None]
    if not present:
        raise CheckpointError(f"{folder}: no weights ({', '.join(WEIGHT_FILES[::2])}); copy them into the folder")
    index = folder / present[0]
    if not index.name.endswith(".index.json"):
        return [index]
    data = read_handed(folder, index.name, limit=INDEX_LIMIT) or b""  # a refusal names the index itself
    try:
        shards = set(parse_json(data)["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{index}: not a weight index ({error}); restore the file") from error
    for shard in shards:
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", "..") or "\0" in shard:
            raise CheckpointError(
                f"{index}: names the shard {_shown(shard)}, which is not a file beside the index "
                f"(an index names its shards by plain file names); nothing was read: restore the "
                f"index saved with the shards"
            )
    return [folder / shard for shard in sorted(shards)]


def tensor_headers(files: list[Path]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Every tensor of ``files`` without reading it: a meta tensor of its shape and dtype from a
    safetensors header (pytorch_model.bin has no header: its tensors are read, weights-only), and
    the file each one is in."""
    tensors: dict[str, Tensor] = {}
    where: dict[str, str] = {}
    for path in files:
        found = _read_file(path) if path.suffix != ".safetensors" else _header(path)
        tensors.update(found)
        where.update(dict.fromkeys(found, str(path)))
    return tensors, where


def read_tensors(files: list[Path], known: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
    """Every tensor of ``files``: safetensors read in full, the rest taken from ``known`` (what
    :func:`tensor_headers` already read) or read weights-only."""
    known = known or {}
    tensors: dict[str, Tensor] = {}
    for path in files:
        if path.suffix != ".safetensors" and known:
            continue
        tensors.update(_read_file(path))
    return {**{n: t for n, t in known.items() if not t.is_meta}, **tensors}


def _header(path: Path) -> dict[str, Tensor]:
    from safetensors import SafetensorError, safe_open

    real = _weights_path(path)
    try:
        with safe_open(str(real), framework="pt") as f:
            slices = {name: f.get_slice(name) for name in f.keys()}  # noqa: SIM118 (not a dict)
            return {
                name: torch.empty(s.get_shape(), dtype=DTYPES.get(s.get_dtype(), torch.uint8), device="meta")
                for name, s in slices.items()
            }
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"{path}: not a readable safetensors file ({error}); restore it") from error


def _weights_path(path: Path) -> Path:
    """The real path of the weights file ``path`` of a handed folder (``zoo.io.handed_path``: no size
    limit, a safetensors header bounds its file); a CheckpointError when it is missing or refused."""
    real = handed_path(path.parent, path.name, limit=None)
    if real is None:
        raise CheckpointError(f"{path}: missing (the index names it); copy it into the folder")
    return real


def _read_file(path: Path) -> dict[str, Tensor]:
    if path.suffix != ".safetensors":
        _weights_path(path)  # checked; read by the name the user knows (the errors name it)
        state = load_weights_file(path, what="weights file")
        state = state.get("state_dict", state) if isinstance(state, dict) else state
        if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
            raise CheckpointError(f"{path}: holds no state dict of tensors; restore the file")
        return dict(state)
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    real = _weights_path(path)
    try:
        return load_file(real)
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"{path}: not a readable safetensors file ({error}); restore it") from error


# ---- the types of config.json's values ------------------------------------------------------------------
OPTIONAL_INTS = ("n_inner", "num_decoder_layers", "num_key_value_heads", "head_dim", "sliding_window")
FLAGS = (
    "tie_word_embeddings",
    "scale_attn_weights",
    "scale_attn_by_inverse_layer_idx",
    "add_cross_attention",
    "is_decoder",
    "attention_bias",
    "mlp_bias",
    "use_sliding_window",
    "scale_decoder_outputs",
    "is_encoder_decoder",
)
ROPE = {
    "rope_theta": "number",
    "factor": "number",
    "partial_rotary_factor": "number?",
    "rope_type": "text",
    "type": "text",
}
KINDS = {
    "rope_parameters": "mapping?",
    "rope_scaling": "mapping?",
    "layer_types": "texts?",
    "partial_rotary_factor": "number?",
    "max_window_layers": "integer",
    "position_embedding_type": "text",
    "model_type": "text",
}
WHAT = {
    "integer": "an integer",
    "number": "a number",
    "flag": "true or false",
    "text": "a string",
    "mapping": "an object",
    "texts": "a list of strings",
    "token": "a token id (an integer or a list of them)",
}


def kind_of(key: str, default: Any) -> str | None:
    """What transformers writes for ``key`` (``"integer"``, ``"number?"``: a number or null...);
    None for a key zoo does not read."""
    if key.endswith("_token_id"):
        return "token?"
    if key in KINDS:
        return KINDS[key]
    if key in OPTIONAL_INTS:
        return "integer?"
    if key in FLAGS or isinstance(default, bool):
        return "flag"
    return {int: "integer", float: "number", str: "text"}.get(type(default))


def check_value(path: Path, key: str, value: Any, default: Any) -> None:
    """Raise a CheckpointError naming ``path`` and ``key`` unless ``value`` has the type that
    transformers writes there (``rope_parameters``' own values too)."""
    kind = kind_of(key, default)
    if kind is None or _fits(kind, value):
        if isinstance(value, dict) and key in ("rope_parameters", "rope_scaling"):
            for inner, inner_value in value.items():
                if inner in ROPE and not _fits(ROPE[inner], inner_value):
                    _refuse(path, f"{key}.{inner}", inner_value, ROPE[inner])
        return
    _refuse(path, key, value, kind)


def _fits(kind: str, value: Any) -> bool:
    if value is None:
        return kind.endswith("?")
    kind = kind.rstrip("?")
    if isinstance(value, bool):
        return kind == "flag"
    if kind == "token":
        return isinstance(value, int) or (isinstance(value, list) and all(_fits("integer", v) for v in value))
    if kind == "number":
        return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
    if kind == "texts":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, {"integer": int, "text": str, "mapping": dict, "flag": bool}[kind])


def _refuse(path: Path, key: str, value: Any, kind: str) -> None:
    what = WHAT[kind.rstrip("?")] + (" or null" if kind.endswith("?") else "")
    raise CheckpointError(
        f"{path}: {key}={_shown(value)} is not {what}; correct it, or use the config.json saved with these weights"
    )


def _shown(value: Any, limit: int = 60) -> str:
    """A value of a handed file as a message shows it: JSON, on one line, cut short."""
    text = json.dumps(value) if not isinstance(value, str) or len(value) < 4 * limit else json.dumps(value[:limit])
    return text if len(text) <= limit else text[: limit - 1] + "…"


def write_json(path: Path, values: dict[str, Any]) -> None:
    path.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")
