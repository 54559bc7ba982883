"""zoo-export: a checkpoint as a portable folder.

- ``format=safetensors``: config.json, config.yaml, model.safetensors, tokenizer.json (and the
  classifier head); ``zoo.load_pretrained(folder)`` reloads the model with identical outputs.
- ``format=onnx``: model.onnx with dynamic batch and sequence axes (its weights in model.onnx.data
  beside it when the model is too large for one file), checked with onnxruntime against PyTorch
  (the max abs difference is printed), plus tokenizer.json and config.json.
- ``format=hf``: a folder transformers loads (tasks/cli/export_hf.py); ``out=`` must be new or empty.

Every format is written into a temporary sibling of ``out=`` and checked there; a new or empty
``out=`` is then that folder, renamed whole (a failure or a kill leaves nothing under its name).
``out=`` may also be a folder a previous zoo-export wrote: its config.json carries a ``zoo_export``
record listing the files that export wrote. Then only the files this export writes are replaced,
each by an atomic rename (config.json last); nothing else in the folder is touched. Any other
non-empty folder is refused unless ``overwrite=true``, which still replaces only those files.
``out=`` is never a symbolic link, a file, or below a file.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

import zoo
from tasks import ZooTask
from tasks.cli.card import model_card
from tasks.cli.common import conf_dir, hydra_errors, quiet_libraries, task_and_checkpoint, user_errors
from tasks.cli.export_hf import export_hf
from tasks.errors import UserError
from zoo.attention import Attention
from zoo.io import atomic_write_text

FORMATS = ("safetensors", "onnx", "hf")
RECORD = "zoo_export"  # the key of config.json that marks a folder zoo-export wrote
ONNX_PACKAGES = ("onnx", "onnxscript", "onnxruntime")


class ExportGraph(nn.Module):
    """What the exported graph computes: the model's outputs by form (decoder -> next-token logits;
    encoder -> hidden states; encoder_decoder -> decoder logits), through the task's export head
    (``ZooTask.export_head``: classifier logits, masked-LM logits, or the outputs unchanged)."""

    def __init__(self, task: ZooTask) -> None:
        super().__init__()
        self.task, self.form = task, type(task.model)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, decoder_input_ids: Tensor | None = None) -> Tensor:
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "decoder_input_ids": decoder_input_ids}
        outputs = self.task.model(**{name: given[name] for name in self.form.input_names})
        return self.task.export_head(outputs, attention_mask)

    def example_inputs(self, batch: int = 2, length: int = 16) -> dict[str, Tensor]:
        """The form's example inputs (``ZooModel.example_inputs``: padding in the first row)."""
        return self.form.example_inputs(self.task.model.config, batch=batch, length=length)


# ---- the destination folder ---------------------------------------------------------------------
def files_of(task: ZooTask, fmt: str) -> list[str]:
    """Every file an export of ``task`` in format ``fmt`` may write into its folder."""
    if fmt == "onnx":
        return ["config.json", "model.onnx", "model.onnx.data", "tokenizer.json", "README.md"]
    return ["config.json", "model.safetensors", "config.yaml", "tokenizer.json", "README.md", *task.export_modules()]


def exported_files(folder: Path) -> list[str] | None:
    """The files a previous zoo-export recorded in ``folder``'s config.json; None when the folder
    holds no export of ours (no config.json, not JSON, or no ``zoo_export`` record)."""
    path = folder / "config.json"
    if not path.is_file() or path.stat().st_size > 64 * 2**20:
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    entry = record.get(RECORD) if isinstance(record, dict) else None
    files = entry.get("files") if isinstance(entry, dict) else None
    if not isinstance(files, list) or not all(isinstance(name, str) for name in files):
        return None
    return files


def check_out(out: Path) -> None:
    """Refuse an ``out=`` that no export can become: a symbolic link, a file, or a path below a file."""
    try:
        zoo.io.check_folder_path(out)
    except FileExistsError as error:
        raise UserError(f"out={error}") from None


def check_destination(out: Path, files: Sequence[str], *, overwrite: bool) -> None:
    """Refuse ``out=`` when the export could replace a file it did not write: a non-empty folder
    that is no export of ours, or a file of ours that the previous export did not write
    (``overwrite`` allows both: only ``files`` are replaced, nothing is deleted)."""
    check_out(out)
    if not out.is_dir():
        return
    folders = [name for name in files if (out / name).is_dir()]
    if folders:
        raise UserError(f"out={out}: {_names(folders)} is a folder where the export writes a file; move it away "
                        f"or choose another out=")
    if overwrite:
        return
    previous = exported_files(out)
    if previous is None:
        present = sorted(p.name for p in out.iterdir())
        if present:
            raise UserError(f"out={out} holds files zoo-export did not write ({_names(present)}); choose a new or "
                            f"empty folder, or set overwrite=true to replace {_names(files)} there (nothing else is "
                            f"touched)")
        return
    foreign = [name for name in files if name not in previous and os.path.lexists(out / name)]
    if foreign:
        raise UserError(f"out={out}: {_names(foreign)} was not written by zoo-export; move it away, or set "
                        f"overwrite=true to replace it")


def export_record(out: Path, fmt: str, written: Sequence[str]) -> dict[str, Any]:
    """The ``zoo_export`` record of config.json: the files of this export and those a previous
    export wrote there (still ours, so a later export may replace them)."""
    kept = [name for name in exported_files(out) or [] if os.path.lexists(out / name)]
    return {"format": fmt, "zoo_version": zoo.__version__, "files": sorted({*kept, *written})}


def _names(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# ---- the formats --------------------------------------------------------------------------------
def export_safetensors(task: ZooTask, info: dict, out: Path, card: str | None = None) -> float:
    """Write the safetensors folder (config.json with its record, config.yaml, the tokenizer, the
    task's own modules, e.g. a classifier's head.safetensors) and return the max abs difference of
    the reloaded model's outputs, measured before the folder takes its place (``atomic_folder``)."""
    from safetensors.torch import save_model

    files = [name for name in files_of(task, "safetensors") if name != "README.md" or card is not None]
    extra = {"task": info["task"], **task.export_info("safetensors"), RECORD: export_record(out, "safetensors", files)}
    with zoo.io.atomic_folder(out, merge=True, last=["config.json"]) as stage:
        zoo.save_pretrained(task.model, stage, extra=extra)
        atomic_write_text(stage / "config.yaml", info["config_yaml"])
        if card is not None:
            atomic_write_text(stage / "README.md", card)
        zoo.io.atomic_write_with(stage / "tokenizer.json", lambda tmp: task.tokenizer.save(str(tmp)))
        for name, module in task.export_modules().items():
            zoo.io.atomic_write_with(stage / name, lambda tmp, module=module: save_model(module, str(tmp)))
        reloaded = zoo.load_pretrained(stage)
        inputs = ExportGraph(task).example_inputs()
        with torch.no_grad():
            return (task.model(**inputs) - reloaded(**inputs)).abs().max().item()


def require_onnx() -> None:
    """format=onnx needs the ``export`` extra; a UserError names it when a package is missing."""
    for package in ONNX_PACKAGES:
        if importlib.util.find_spec(package) is None:
            raise UserError(f"format=onnx needs the package {package}, which is not installed; install the export "
                            f"extra: pip install -e \".[export]\"")


@contextmanager
def exporter_quiet() -> Iterator[None]:
    """Silence what torch's ONNX exporter says that a user cannot act on: a line per torchvision
    operator it skips (torchvision is not a dependency) and a note that inputs sharing a dynamic
    axis (batch, seq) share its name."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*The axis name: .* will not be used")
            yield
    finally:
        registration.setLevel(level)


def export_onnx(task: ZooTask, info: dict, out: Path, opset: int, card: str | None = None) -> float:
    """Write the ONNX folder and return the max abs difference between onnxruntime and PyTorch,
    measured before the folder takes its place (``atomic_folder``: the weights file, when there is
    one, moves in before the graph that names it, config.json last)."""
    require_onnx()
    program, graph = onnx_program(task, opset)
    card_file = ["README.md"] if card is not None else []
    with zoo.io.atomic_folder(out, merge=True, last=["model.onnx", "config.json"]) as stage:
        with zoo.io.naming(stage / "model.onnx"):
            program.save(stage / "model.onnx")  # + model.onnx.data when over torch's single-file limit
        record = export_record(out, "onnx", ["config.json", *os.listdir(stage), "tokenizer.json", *card_file])
        config = {"model": task.model.config.to_dict(), "task": info["task"], **task.export_info("onnx"),
                  RECORD: record}
        atomic_write_text(stage / "config.json", json.dumps(config, indent=2))
        zoo.io.atomic_write_with(stage / "tokenizer.json", lambda tmp: task.tokenizer.save(str(tmp)))
        if card is not None:
            atomic_write_text(stage / "README.md", card)
        return onnx_difference(graph, stage / "model.onnx")


def onnx_program(task: ZooTask, opset: int) -> tuple[Any, ExportGraph]:
    """The task's graph traced by torch's ONNX exporter, with dynamic batch and sequence axes."""
    graph = ExportGraph(task).eval()
    for layer in graph.modules():  # explicit matmuls: the exporter's view of the fused kernel's output
        if isinstance(layer, Attention):  # layout differs from what its decomposition produces
            layer.kernel = "math"
    inputs = graph.example_inputs()
    batch, seq, target = torch.export.Dim("batch"), torch.export.Dim("seq"), torch.export.Dim("target")
    shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    if "decoder_input_ids" in inputs:
        shapes["decoder_input_ids"] = {0: batch, 1: target}
    with exporter_quiet():
        program = torch.onnx.export(graph, (), kwargs=inputs, dynamic_shapes=shapes, input_names=list(inputs),
                                    output_names=["output"], opset_version=opset, dynamo=True, verbose=False)
    return program, graph


def onnx_difference(graph: ExportGraph, path: Path) -> float:
    """Max abs difference of onnxruntime's outputs and PyTorch's, at other shapes than the traced
    ones (the axes must really be dynamic)."""
    import numpy as np
    import onnxruntime

    check = graph.example_inputs(batch=3, length=11)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {k: v.numpy() for k, v in check.items()})[0]
    with torch.no_grad():
        want = graph(**check).numpy()
    return float(np.abs(got - want).max())


def hf_verb(task: ZooTask, checkpoint: dict[str, Any], out: Path, command: str) -> float:
    """format=hf: a new folder (never into an existing one), checked by transformers when installed;
    ``zoo.to_hf`` writes it through ``atomic_folder``."""
    check_out(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"out={out}: format=hf writes a new folder and this one is not empty; choose a new or empty "
                        f"folder (nothing is overwritten)")
    hf_class = zoo.hf.family_class(task.model.config, classifier=task.hf_classifier() is not None)
    diff = export_hf(task, out, model_card(task, checkpoint, fmt="hf", command=command, hf_class=hf_class))
    if diff is None:
        print(f"exported {out} for transformers (not checked: transformers is not installed)")
        return float("nan")
    print(f"exported {out} for transformers; its reload vs zoo: max abs diff {diff:.3g}, same greedy tokens")
    return diff


# ---- the verb -----------------------------------------------------------------------------------
@hydra_errors
@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="export")
@user_errors
def main(cfg: DictConfig) -> float:
    for key in ("ckpt_path", "out"):
        if OmegaConf.is_missing(cfg, key):
            raise UserError(f"{key}= is not set; zoo-export ckpt_path=<checkpoint> out=<folder> [format=onnx]")
    if cfg.format not in FORMATS:
        raise UserError(f"format={cfg.format!r} is not an export format; choose format=safetensors, onnx or hf")
    if not isinstance(cfg.overwrite, bool):
        raise UserError(f"overwrite={cfg.overwrite!r} must be true or false")
    if cfg.format == "onnx":
        require_onnx()
    quiet_libraries()
    out = Path(cfg.out).expanduser()
    check_out(out)
    task, checkpoint = task_and_checkpoint(cfg.ckpt_path)
    task.merge_adapter()  # a LoRA run is exported as the dense model it computes
    info, command = checkpoint["zoo_run"], " ".join(["zoo-export", *sys.argv[1:]])
    if cfg.format == "hf":
        return hf_verb(task, checkpoint, out, command)
    check_destination(out, files_of(task, cfg.format), overwrite=cfg.overwrite)
    card = model_card(task, checkpoint, fmt=cfg.format, command=command)
    if cfg.format == "safetensors":
        diff = export_safetensors(task, info, out, card)
        print(f"exported {out}/model.safetensors; zoo.load_pretrained reload: max abs diff {diff:.3g}")
    else:
        diff = export_onnx(task, info, out, cfg.opset, card)
        print(f"exported {out}/model.onnx; onnxruntime vs PyTorch: max abs diff {diff:.3g}")
    return diff


if __name__ == "__main__":
    main()
