"""How training writes, reads and removes checkpoints.

- ``ZooCheckpointIO`` is the Trainer's checkpoint plugin: every save (best, last, on exception,
  the final one) is atomic and refuses non-finite weights; every load goes through
  ``zoo.load_weights_file`` (weights only, no URLs); it removes only checkpoints this run wrote
  or that lie in its own checkpoint folder.
- A run's claim on its directory is tasks/run/run_dirs.py's (``claim_run_dir``).
- ``base_reference`` and ``with_base``: a LoRA run with ``adapter.save=only`` writes checkpoints
  without its frozen base tensors, naming instead where they came from (``init_from``) and their
  sha256; every load puts them back from there, and refuses a base that is missing or changed.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO

import zoo
from tasks.errors import DivergedError


class ZooCheckpointIO(CheckpointIO):
    """Args:
    own_dir: the run's checkpoint folder; removing files elsewhere is refused.
    preloaded: checkpoints already read by the caller (path -> contents), not read twice.
    superseded: checkpoints that a later one replaces (``on_exception.ckpt``): removed once a
        checkpoint of the same or a later step is saved (by the rule of ``remove_checkpoint``),
        so that none is left to resume from a step behind.
    """

    def __init__(
        self,
        own_dir: str | os.PathLike | None = None,
        preloaded: dict[str, dict[str, Any]] | None = None,
        superseded: list[str | os.PathLike] | None = None,
    ) -> None:
        self.own_dir = Path(own_dir).resolve() if own_dir is not None else None
        self.preloaded = {str(Path(k).resolve()): v for k, v in (preloaded or {}).items()}
        self.superseded = [Path(p).resolve() for p in superseded or []]
        self.written: set[Path] = set()

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError("zoo's checkpoint writer takes no storage_options")
        bad = non_finite(checkpoint.get("state_dict", {}))
        if bad:
            raise DivergedError(
                f"the weights are no longer finite ({bad} is not); {Path(path).name} was not "
                f"written, the previous one is kept"
            )
        zoo.atomic_save(checkpoint, path)
        saved = Path(path).resolve()
        self.written.add(saved)
        step = checkpoint.get("global_step")
        for stale in self.superseded:
            theirs = checkpoint_step(stale) if stale != saved and stale.is_file() else None
            if theirs is not None and isinstance(step, int) and theirs <= step:
                self.remove_checkpoint(stale)

    def load_checkpoint(
        self, path: str | os.PathLike, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        key = str(Path(path).resolve()) if "://" not in str(path) else str(path)
        if key in self.preloaded:
            return self.preloaded.pop(key)
        checkpoint = zoo.load_weights_file(path, map_location or "cpu")  # weights_only=True, whatever was asked
        return with_base(checkpoint, source=f"ckpt_path={path}", map_location=map_location or "cpu")

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        path = Path(path).resolve()
        mine = path in self.written or (self.own_dir is not None and self.own_dir in path.parents)
        if mine and path.is_file():
            path.unlink()
            self.written.discard(path)


def non_finite(state: dict[str, Any]) -> str | None:
    """The name of the first floating-point tensor in ``state`` holding a NaN or an infinity."""
    for name, value in state.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not torch.isfinite(value).all():
            return name
    return None


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The global step a checkpoint was saved at (through the weights-only loader); None when it
    cannot be read or holds none."""
    path = Path(path)
    try:
        info = path.stat()
        return _step(str(path.resolve()), info.st_mtime_ns, info.st_size)
    except (OSError, zoo.CheckpointError):
        return None


@functools.lru_cache(maxsize=16)
def _step(path: str, mtime_ns: int, size: int) -> int | None:  # a file read once per version of it
    checkpoint = zoo.load_weights_file(path)
    step = checkpoint.get("global_step") if isinstance(checkpoint, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


# ---- adapter-only checkpoints (adapter.save=only) ---------------------------------------------------
BASE_KEY = "zoo_base"
"""The checkpoint entry of an adapter-only checkpoint: ``{"source", "format", "sha256", "keys"}``."""


def fingerprint(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over the tensors' names, dtypes, shapes and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def base_reference(source: str, state: dict[str, torch.Tensor], keys: list[str]) -> dict[str, Any]:
    """What an adapter-only checkpoint records of its base: ``source`` (init_from: a zoo checkpoint,
    an HF folder or ``hf:<repo>``, a GGUF file; a path made absolute), its ``format`` (:data:`BASE_FORMATS`),
    the base tensors ``keys`` it leaves out and their fingerprint as ``state`` (the source's own tensors)
    holds them."""
    where = source if source.startswith("hf:") else str(Path(source).expanduser().resolve())
    return {
        "source": where,
        "format": base_format(source),
        "sha256": fingerprint({k: state[k] for k in keys}),
        "keys": sorted(keys),
    }


BASE_FORMATS = ("zoo", "hf", "gguf")
"""What a base can be: a zoo-train checkpoint, a Hugging Face folder (or ``hf:<repo>``), a llama.cpp GGUF file
(read as float32, as ``init_from`` reads it)."""


def base_format(source: str) -> str:
    """The :data:`BASE_FORMATS` entry of ``source`` (an ``init_from`` value)."""
    if source.lower().endswith(".gguf"):
        return "gguf"
    return "hf" if source.startswith("hf:") or zoo.hf.is_hf_folder(source) else "zoo"


def with_base(
    checkpoint: dict[str, Any], *, source: str, map_location: Any = "cpu", _seen: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """``checkpoint`` with its base tensors put back when it is adapter-only (unchanged otherwise):
    read from the source it names, checked against its fingerprint. A missing base or another one
    is a CheckpointError naming the file and the fix."""
    ref = checkpoint.get(BASE_KEY) if isinstance(checkpoint, dict) else None
    if ref is None:
        return checkpoint
    if not (
        isinstance(ref, dict)
        and isinstance(ref.get("source"), str)
        and isinstance(ref.get("sha256"), str)
        and ref.get("format") in BASE_FORMATS
        and isinstance(ref.get("keys"), list)
    ):
        raise zoo.CheckpointError(
            f"{source}: its base reference ({BASE_KEY}) is damaged; use a checkpoint zoo-train wrote"
        )
    base = ref["source"]
    if ref["source"] in _seen:
        raise zoo.CheckpointError(f"{source}: its base {base} refers back to itself; use a checkpoint zoo-train wrote")
    if not base.startswith("hf:") and not Path(base).exists():
        raise zoo.CheckpointError(
            f"{source} holds only a LoRA adapter (adapter.save=only); its base {base} is gone: "
            f"put that file back there (moved files can be linked), or train with "
            f"adapter.save=full"
        )
    state = _base_state(ref, map_location, _seen | {base})
    keys = ref["keys"]
    missing = [k for k in keys if k not in state]
    if missing or fingerprint({k: state[k] for k in keys}) != ref["sha256"]:
        what = f"lacks {missing[0]}" if missing else "has other weights"
        raise zoo.CheckpointError(
            f"{source} holds only a LoRA adapter (adapter.save=only) trained on another base: "
            f"{base} {what} (sha256 {ref['sha256'][:12]}… recorded); put back the base it was "
            f"trained from"
        )
    checkpoint["state_dict"] = {**{k: state[k] for k in keys}, **checkpoint["state_dict"]}
    return checkpoint


def _base_state(ref: dict[str, Any], map_location: Any, seen: frozenset[str]) -> dict[str, torch.Tensor]:
    """The tensors of the base ``ref`` names, under the task's names (``model.…``)."""
    base = ref["source"]
    if ref["format"] in ("hf", "gguf"):  # a pretrained model's own files: read as init_from read them
        try:
            model = (
                zoo.from_gguf(base, dtype=torch.float32)
                if ref["format"] == "gguf"
                else zoo.from_hf(base, dtype=torch.float32)
            )
        except ValueError as error:  # CheckpointError (a missing or damaged file) included: it names the file
            raise zoo.CheckpointError(
                f"the base {base} of an adapter-only checkpoint cannot be read ({' '.join(str(error).split())[:200]})"
            ) from None
        return {f"model.{k}": v for k, v in model.state_dict().items()}
    checkpoint = zoo.load_weights_file(base, map_location)
    state = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        raise zoo.CheckpointError(
            f"{base}: the base of an adapter-only checkpoint holds no state_dict; put back the "
            f"zoo-train checkpoint it was trained from"
        )
    return with_base(checkpoint, source=base, map_location=map_location, _seen=seen)["state_dict"]
