"""What ``init_from`` reports and refuses: the console line of what was loaded, the refusal of a
checkpoint whose tensors do not fit the model, and of ``adapter.save=only`` without a base to name."""

from __future__ import annotations

from typing import Any

import torch

import zoo


def loaded_line(loaded: Any, skipped: list[str], fresh: list[str], adapter: list[str]) -> str:
    """What ``init_from`` did, for the console: tensors loaded, skipped (with a few names) and new; the
    adapter's matrices are told apart from tensors that had no weights to load."""

    def few(names: list[str]) -> str:
        return ", ".join(names[:4]) + ("…" if len(names) > 4 else "")

    parts = [f"{len(loaded)} tensors loaded"]
    if skipped:
        parts.append(f"{len(skipped)} skipped ({few(skipped)})")
    if adapter:
        parts.append(f"{len(adapter)} adapter matrices added (LoRA's B starts at zero: the model starts as loaded)")
    if fresh:
        parts.append(f"{len(fresh)} freshly initialised ({few(fresh)})")
    return ", ".join(parts)


def no_base_error(why: str) -> zoo.ConfigError:
    """The refusal of ``adapter.save=only`` in a run whose base could not be named (``why``)."""
    return zoo.ConfigError(
        f"adapter.save=only keeps the frozen base out of checkpoints, but this run has {why}: its "
        f"base would be lost; set init_from=<checkpoint, HF folder or GGUF file>, or "
        f"adapter.save=full"
    )


def check_tensors(cfg: zoo.ModelConfig, state: dict[str, Any], source: str) -> None:
    """Raise a CheckpointError unless ``state`` holds the tensors of the model ``cfg`` describes,
    before anything is allocated (``zoo.check_weights``)."""
    shapes = {
        k.removeprefix("model."): tuple(v.shape)
        for k, v in state.items()
        if k.startswith("model.") and isinstance(v, torch.Tensor)
    }
    zoo.check_weights(cfg, shapes, source=source)


def first_line(error: BaseException, limit: int = 200) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def size_diff(theirs: zoo.ModelConfig, mine: zoo.ModelConfig) -> str:
    fields = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "max_seq_len")
    diffs = [
        f"{f}={getattr(theirs, f)} there, {getattr(mine, f)} here"
        for f in fields
        if getattr(theirs, f) != getattr(mine, f)
    ]
    return "; ".join(diffs) or "same sizes"
