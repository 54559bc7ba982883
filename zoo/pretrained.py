"""Portable model folders: ``config.json`` (the ModelConfig, plain JSON) + ``model.safetensors``.

    zoo.save_pretrained(model, "my-model")
    model = zoo.load_pretrained("my-model")  # same outputs, no pickle anywhere
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from zoo.config import ModelConfig
from zoo.models import ZooModel, build_model


def save_pretrained(model: ZooModel, folder: str | Path, *, extra: dict[str, Any] | None = None) -> Path:
    """Write ``config.json`` ({"model": config, **extra}) and ``model.safetensors`` (tied weights once)."""
    from safetensors.torch import save_model

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model": model.config.to_dict(), **(extra or {})}, indent=2))
    save_model(model, str(folder / "model.safetensors"))
    return folder


def load_pretrained(folder: str | Path, *, device: str | torch.device | None = None) -> ZooModel:
    """Rebuild the model of a folder written by ``save_pretrained`` (or ``zoo-export``), in eval mode."""
    from safetensors.torch import load_model

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    cfg = ModelConfig.from_dict(config["model"])
    with torch.device("meta"):
        model = build_model(cfg)
    model.to_empty(device=device or "cpu")
    load_model(model, str(folder / "model.safetensors"), strict=True, device=str(device or "cpu"))
    return model.eval()
