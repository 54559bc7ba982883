"""Portable model folders: ``config.json`` (the ModelConfig, plain JSON) + ``model.safetensors``.

    zoo.save_pretrained(model, "my-model")
    model = zoo.load_pretrained("my-model")  # same outputs, no pickle anywhere

Both files are written atomically (a kill mid-write leaves the previous file). Loading reads the
safetensors header first and refuses weights that do not fit the config before anything is
allocated, so a damaged or mismatched folder costs a one-line CheckpointError, not the memory of
the model its config.json claims.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.config import ModelConfig
from zoo.io import (
    JSON_LIMIT,
    CheckpointError,
    atomic_write_text,
    atomic_write_with,
    handed_path,
    parse_json,
    read_handed,
)
from zoo.models import ZooModel, build_model
from zoo.registry import ConfigError

DEPTHS = ("n_layers", "n_encoder_layers", "n_decoder_layers")
Shapes = Mapping[str, Sequence[int]]


def save_pretrained(model: ZooModel, folder: str | Path, *, extra: dict[str, Any] | None = None) -> Path:
    """Write ``model.safetensors`` (tied weights once), then ``config.json`` ({"model": config, **extra}),
    each atomically (a config.json appears only beside its weights); the folder is created if
    needed. A failed write (a full disk) is an OSError naming the file."""
    from safetensors.torch import save_model

    folder = Path(folder)
    atomic_write_with(folder / "model.safetensors", lambda tmp: save_model(model, str(tmp)))
    atomic_write_text(folder / "config.json", json.dumps({"model": model.config.to_dict(), **(extra or {})}, indent=2))
    return folder


def load_pretrained(folder: str | Path, *, device: str | torch.device | None = None) -> ZooModel:
    """Rebuild the model of a folder written by ``save_pretrained`` (or ``zoo-export``), in eval mode.

    Every problem with the folder (missing, no or unreadable config.json, a config the weights do
    not fit, a damaged model.safetensors) is a CheckpointError naming the file and the fix."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    folder = Path(folder)
    cfg = read_config(folder)
    weights = folder / "model.safetensors"
    shapes = safetensors_shapes(weights)
    check_weights(cfg, shapes, source=str(weights))
    model = meta_model(cfg, str(weights))
    _match(_tensor_groups(model), shapes, str(weights), exact=True)
    model.to_empty(device=device or "cpu")
    try:
        load_model(model, str(weights), strict=True, device=str(device or "cpu"))
    except (SafetensorError, RuntimeError, OSError) as error:
        raise CheckpointError(
            f"{weights}: the weights file is damaged ({_first_line(error)}); export the model again"
        ) from None
    return model.eval()


def read_config(folder: Path) -> ModelConfig:
    """The ModelConfig of a model folder's ``config.json``; a CheckpointError says what is wrong."""
    if not folder.is_dir():
        what = "is a file, not a model folder" if folder.exists() else "no such folder"
        raise CheckpointError(
            f"{folder}: {what}; pass a folder written by zoo.save_pretrained or zoo-export format=safetensors"
        )
    path = folder / "config.json"
    data = read_handed(folder, "config.json", limit=JSON_LIMIT)  # the folder's own file: zoo.io.handed_path
    if data is None:
        raise CheckpointError(
            f"{path}: missing, so {folder} is not a zoo model folder; pass a folder written by "
            f"zoo.save_pretrained or zoo-export format=safetensors"
        )
    try:
        record = parse_json(data)
    except ValueError as error:
        raise CheckpointError(
            f"{path}: not valid JSON ({_first_line(error)}); restore the file or export the model again"
        ) from None
    if not isinstance(record, dict) or not isinstance(record.get("model"), dict):
        raise CheckpointError(
            f'{path} has no "model" section (the ModelConfig); it was not written by zoo: '
            f"export the model again with zoo-export format=safetensors"
        )
    try:
        return ModelConfig.from_dict(record["model"]).validate()
    except ConfigError as error:
        raise CheckpointError(f"{path}: its model config cannot work: {error}") from None


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, from the header of a safetensors file alone (no tensor is read)."""
    from safetensors import SafetensorError, safe_open

    if handed_path(path.parent, path.name, limit=None) is None:  # the folder's own file, or a refusal
        if (path.parent / "model.onnx").is_file():
            raise CheckpointError(
                f"{path}: missing; {path.parent} is an ONNX export (load its model.onnx with "
                f"onnxruntime), or export again with format=safetensors"
            )
        raise CheckpointError(
            f"{path}: missing; the folder must hold the model.safetensors written beside its "
            f"config.json (export the model again)"
        )
    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118 (not a dict)
    except (SafetensorError, OSError) as error:
        raise CheckpointError(
            f"{path}: not a readable safetensors file ({_first_line(error)}); it is damaged "
            f"or truncated: export the model again"
        ) from None


def check_weights(cfg: ModelConfig, shapes: Shapes, *, source: str = "the weights") -> None:
    """Raise a CheckpointError unless ``shapes`` (tensor name -> shape, names as in the model's
    ``state_dict``) can be the weights of the model ``cfg`` describes.

    Nothing is allocated and nothing deep is built: shapes are compared with a one-layer model on
    the meta device, and depth by counting tensors (linear in each layer count), so a config that
    asks for n_layers=20000 or d_model=32768 beside small weights fails at once. Tied tensors may
    be stored under one of their names (safetensors) or all of them (a state_dict). A vocabulary table may
    hold the true vocabulary's rows without the padding (``vocab_multiple_of``), which loading adds."""
    depths = [name for name in DEPTHS if getattr(cfg, name) is not None]
    shallow = cfg.replace(**dict.fromkeys(depths, 1))
    meta = meta_model(shallow, source)
    groups = _tensor_groups(meta)
    _match(groups, _rows_padded(meta, groups, shapes), source, exact=False)
    per_layer = {
        name: len(_tensor_groups(meta_model(shallow.replace(**{name: 2}), source))) - len(groups) for name in depths
    }
    want = len(groups) + sum((getattr(cfg, name) - 1) * n for name, n in per_layer.items())
    duplicates = sum(max(0, sum(n in shapes for n in names) - 1) for names, _ in groups)
    held = len(shapes) - duplicates
    if held != want:
        sizes = ", ".join(f"{name}={getattr(cfg, name)}" for name, n in per_layer.items() if n)
        raise CheckpointError(
            f"{source}: the config ({sizes}) describes {want} tensors but the weights hold {held}; "
            f"the config and the weights come from different models: use the pair saved together"
        )


def _rows_padded(model: ZooModel, groups: list[tuple[list[str], tuple[int, ...]]], shapes: Shapes) -> Shapes:
    """``shapes`` with each vocabulary table held with the true vocabulary's rows alone taken at the rows of
    ``model`` (``vocab_multiple_of``): loading pads it (``ZooModel.fit_vocab_rows``)."""
    tables, vocab = set(model.vocab_tables()), model.config.vocab_size
    padded = dict(shapes)
    for names, shape in groups:
        if tables & set(names):
            for name in names:
                if name in padded and tuple(padded[name]) == (vocab, *shape[1:]):
                    padded[name] = shape
    return padded


def meta_model(cfg: ModelConfig, source: str) -> ZooModel:
    """The model of ``cfg`` on the meta device (nothing allocated); sizes too large to describe
    at all (beyond int64) are a CheckpointError."""
    try:
        with torch.device("meta"):
            return build_model(cfg)
    except (TypeError, RuntimeError, OverflowError) as error:
        raise CheckpointError(
            f"{source}: its config asks for sizes no model can have ({_first_line(error)}); "
            f"the config is damaged: use the one saved with the weights"
        ) from None


def _tensor_groups(model: nn.Module) -> list[tuple[list[str], tuple[int, ...]]]:
    """The model's distinct tensors: (every state_dict name of it, its shape)."""
    groups: dict[int, tuple[list[str], tuple[int, ...]]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), ([], tuple(tensor.shape)))[0].append(name)
    return list(groups.values())


def _match(groups: list[tuple[list[str], tuple[int, ...]]], shapes: Shapes, source: str, *, exact: bool) -> None:
    """Every tensor of ``groups`` is in ``shapes`` (under one of its names) with its shape; with
    ``exact``, ``shapes`` holds nothing else."""
    for names, shape in groups:
        found = next((n for n in names if n in shapes), None)
        if found is None:
            raise CheckpointError(
                f"{source}: the config describes tensor {names[0]}, which the weights do not hold; "
                f"the config and the weights come from different models: use the pair saved "
                f"together"
            )
        if tuple(shapes[found]) != shape:
            raise CheckpointError(
                f"{source}: the config wants {found} of shape {shape} but the weights hold "
                f"{tuple(shapes[found])}; the config and the weights come from different models: "
                f"use the pair saved together"
            )
    if exact:
        extra = sorted(set(shapes) - {n for names, _ in groups for n in names})
        if extra:
            raise CheckpointError(
                f"{source}: holds {len(extra)} tensors the config does not describe (e.g. "
                f"{extra[0]}); the config and the weights come from different models: use the "
                f"pair saved together"
            )


def _first_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return (text[:157] + "…" if len(text) > 160 else text) or type(error).__name__
