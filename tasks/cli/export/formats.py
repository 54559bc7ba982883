"""zoo-export's formats: one registered class each (``format=<name>``), which knows the files it
writes, how it writes them into the staged folder and checks them there, and what the model card
says about them. A new format is a class here with ``@export_format``; zoo-export, the model card
and the tests that walk :data:`EXPORT_FORMATS` take it from there.

- ``safetensors``: config.json, config.yaml, model.safetensors, tokenizer.json (and the task's own
  modules, e.g. a classifier's head); ``zoo.load_pretrained(folder)`` reloads the model, compared.
- ``onnx``: model.onnx (+ model.onnx.data for a large model), checked with onnxruntime (onnx.py).
- ``hf``: a folder transformers loads, checked by transformers (hf.py); always a new folder.
- ``gguf``: model.gguf, the file llama.cpp runs, checked by transformers' GGUF loading (gguf.py)
  and by llama.cpp where llama-cpp-python is installed.

onnxruntime and llama.cpp run in a child process with a time limit (tasks/cli/export/checker.py, the
``checker`` settings): when one crashes, hangs or cannot be imported, the export is kept whole and
zoo-export ends with one line and exit status 3 (``checker.unchecked=keep``, the default), or nothing
is written (``refuse``).
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import torch
from omegaconf import DictConfig

import zoo
from tasks import ZooTask
from tasks.cli.export.checker import CheckerFailed, Checking, Unchecked
from tasks.cli.export.destination import RECORD, check_destination, check_new, export_record
from tasks.cli.export.gguf import export_gguf, gguf_problem, require_gguf
from tasks.cli.export.hf import export_hf
from tasks.cli.export.onnx import ExportGraph, onnx_difference, onnx_program, require_onnx
from zoo.folders import atomic_folder
from zoo.io import atomic_write_text
from zoo.registry import Registry

ONNX_INPUTS = {  # an example value for each input a zoo model's graph may take (ZooModel.input_names)
    "input_ids": "input_ids",
    "attention_mask": "np.ones_like(input_ids)",
    "decoder_input_ids": "np.full((1, 1), {cfg.decoder_start_token_id}, dtype=np.int64)",
}
FOLDER = 'folder = "path/to/this/folder"'
TOKENIZER = 'tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")'


class ExportFormat(ABC):
    """One zoo-export format. ``name`` is its ``format=``; ``title`` completes the card's "exported
    as ..."; ``library`` is the card's ``library_name`` for the Hugging Face Hub."""

    name: ClassVar[str]
    title: ClassVar[str]
    library: ClassVar[str] = "zoo"
    card_needs_class: ClassVar[bool] = False  # the card names the transformers class (``card_class``)
    head_in_graph: ClassVar[bool] = False  # the file computes a task's head itself (an ONNX graph does)

    @classmethod
    def from_config(cls, cfg: DictConfig) -> ExportFormat:
        """The format with its settings from zoo-export's config (conf/export.yaml)."""
        return cls()

    def require(self) -> None:
        """Refuse, naming the extra, when a package the format needs is not installed (before any load)."""
        return None  # a format that needs no more than zoo's own dependencies

    def check_task(self, task: ZooTask) -> None:
        """Refuse a task this format cannot carry, in one line, before anything is written."""
        return None  # a format that carries every task

    @abstractmethod
    def files(self, task: ZooTask) -> list[str]:
        """Every file an export of ``task`` in this format may write into its folder."""

    def check_destination(self, task: ZooTask, out: Path, *, overwrite: bool) -> None:
        """Refuse an ``out=`` where the export could replace a file it did not write."""
        check_destination(out, self.files(task), overwrite=overwrite)

    def card_class(self, task: ZooTask) -> str | None:
        """The transformers class the card names (``hf`` only)."""
        return None

    @abstractmethod
    def write(self, task: ZooTask, checkpoint: dict[str, Any], out: Path, card: str | None) -> tuple[float, str]:
        """Write ``out``, checked in its staged folder before it appears; the check's figure and the line
        zoo-export prints."""

    def pipeline(self, hf_class: str | None) -> str | None:
        """The Hub's ``pipeline_tag`` for the card, when the format's loader has one."""
        return None

    @abstractmethod
    def load_code(self, task: ZooTask, hf_class: str | None) -> list[str]:
        """The lines of the card's Python block that load the folder."""


EXPORT_FORMATS: Registry[type[ExportFormat]] = Registry("export format")


def export_format(cls: type[ExportFormat]) -> type[ExportFormat]:
    """Register ``cls`` under its ``name``."""
    return EXPORT_FORMATS.register(cls.name)(cls)


def files_of(task: ZooTask, fmt: str) -> list[str]:
    """Every file an export of ``task`` in format ``fmt`` may write into its folder."""
    return EXPORT_FORMATS.get(fmt, field="format")().files(task)


@export_format
class Safetensors(ExportFormat):
    name, title = "safetensors", "safetensors"

    def files(self, task: ZooTask) -> list[str]:
        return [
            "config.json",
            "model.safetensors",
            "config.yaml",
            "tokenizer.json",
            "README.md",
            *task.export_modules(),
        ]

    def write(self, task: ZooTask, checkpoint: dict[str, Any], out: Path, card: str | None) -> tuple[float, str]:
        diff = export_safetensors(task, checkpoint["zoo_run"], out, card)
        return diff, f"exported {out}/model.safetensors; zoo.load_pretrained reload: max abs diff {diff:.3g}"

    def load_code(self, task: ZooTask, hf_class: str | None) -> list[str]:
        extras = [
            f"# also here: {name} (the task's own module; config.json holds its settings)"
            for name in task.export_modules()
        ]
        return [
            "import zoo",
            "from tokenizers import Tokenizer",
            "",
            FOLDER,
            f"model = zoo.load_pretrained(folder)  # {type(task.model).__name__}, in eval mode",
            TOKENIZER,
            *extras,
        ]


def export_safetensors(task: ZooTask, info: dict, out: Path, card: str | None = None) -> float:
    """Write the safetensors folder (config.json with its record, config.yaml, the tokenizer, the
    task's own modules, e.g. a classifier's head.safetensors) and return the max abs difference of
    the reloaded model's outputs, measured before the folder takes its place (``atomic_folder``)."""
    from safetensors.torch import save_model

    files = [name for name in files_of(task, "safetensors") if name != "README.md" or card is not None]
    extra = {
        "task": info["task"],
        **task.export_info(head_in_graph=Safetensors.head_in_graph),
        RECORD: export_record(out, "safetensors", files),
    }
    with atomic_folder(out, merge=True, last=["config.json"]) as stage:
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


@export_format
class Onnx(ExportFormat):
    name, title = "onnx", "ONNX"
    head_in_graph = True

    def __init__(self, opset: int = 18, checking: Checking | None = None) -> None:
        self.opset, self.checking = opset, checking or Checking()

    @classmethod
    def from_config(cls, cfg: DictConfig) -> ExportFormat:
        return cls(opset=cfg.opset, checking=Checking.from_config(cfg.checker))

    def require(self) -> None:
        require_onnx()

    def files(self, task: ZooTask) -> list[str]:
        return ["config.json", "model.onnx", "model.onnx.data", "tokenizer.json", "README.md"]

    def write(self, task: ZooTask, checkpoint: dict[str, Any], out: Path, card: str | None) -> tuple[float, str]:
        diff = export_onnx(task, checkpoint["zoo_run"], out, self.opset, card, checking=self.checking)
        return diff, f"exported {out}/model.onnx; onnxruntime vs PyTorch: max abs diff {diff:.3g}"

    def load_code(self, task: ZooTask, hf_class: str | None) -> list[str]:
        cfg = task.model.config
        inputs = ", ".join(f'"{n}": {ONNX_INPUTS.get(n, "...").format(cfg=cfg)}' for n in type(task.model).input_names)
        return [
            "import numpy as np",
            "import onnxruntime",
            "from tokenizers import Tokenizer",
            "",
            FOLDER,
            TOKENIZER,
            'session = onnxruntime.InferenceSession(f"{folder}/model.onnx")',
            'input_ids = np.array([tokenizer.encode("Hello").ids], dtype=np.int64)',
            f"(output,) = session.run(None, {{{inputs}}})",
        ]


def export_onnx(
    task: ZooTask, info: dict, out: Path, opset: int, card: str | None = None, *, checking: Checking | None = None
) -> float:
    """Write the ONNX folder and return the max abs difference between onnxruntime and PyTorch,
    measured before the folder takes its place (``atomic_folder``: the weights file, when there is
    one, moves in before the graph that names it, config.json last). An Unchecked, after the folder
    took its place, when onnxruntime could not check the graph and ``checking`` keeps it."""
    require_onnx()
    checking = checking or Checking()
    program, graph = onnx_program(task, opset)
    card_file = ["README.md"] if card is not None else []
    with atomic_folder(out, merge=True, last=["model.onnx", "config.json"]) as stage:
        with zoo.io.naming(stage / "model.onnx"):
            program.save(stage / "model.onnx")  # + model.onnx.data when over torch's single-file limit
        record = export_record(out, "onnx", ["config.json", *os.listdir(stage), "tokenizer.json", *card_file])
        config = {
            "model": task.model.config.to_dict(),
            "task": info["task"],
            **task.export_info(head_in_graph=Onnx.head_in_graph),
            RECORD: record,
        }
        atomic_write_text(stage / "config.json", json.dumps(config, indent=2))
        zoo.io.atomic_write_with(stage / "tokenizer.json", lambda tmp: task.tokenizer.save(str(tmp)))
        if card is not None:
            atomic_write_text(stage / "README.md", card)
        try:
            diff, failed = onnx_difference(graph, stage / "model.onnx", checking, shown=out / "model.onnx"), None
        except CheckerFailed as crashed:
            diff, failed = float("nan"), checking.unchecked(crashed)  # refusing: a UserError, nothing written
    if failed is not None:
        raise Unchecked(failed)
    return diff


@export_format
class HF(ExportFormat):
    """A new folder only: transformers' files are not merged into a previous export."""

    name, title, library, card_needs_class = "hf", "a Hugging Face transformers folder", "transformers", True

    def check_task(self, task: ZooTask) -> None:
        self.card_class(task)  # refuses, naming why

    def files(self, task: ZooTask) -> list[str]:
        return [
            "config.json",
            "model.safetensors",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "README.md",
        ]

    def check_destination(self, task: ZooTask, out: Path, *, overwrite: bool) -> None:
        check_new(out, self.name)

    def card_class(self, task: ZooTask) -> str | None:
        return zoo.hf.family_class(task.model.config, classifier=task.hf_classifier() is not None)

    def write(self, task: ZooTask, checkpoint: dict[str, Any], out: Path, card: str | None) -> tuple[float, str]:
        diff = export_hf(task, out, card)
        if diff is None:
            return float("nan"), f"exported {out} for transformers (not checked: transformers is not installed)"
        return diff, f"exported {out} for transformers; its reload vs zoo: max abs diff {diff:.3g}, same greedy tokens"

    def pipeline(self, hf_class: str | None) -> str | None:
        return zoo.hf.pipeline_tag(hf_class or "")

    def load_code(self, task: ZooTask, hf_class: str | None) -> list[str]:
        auto = zoo.hf.auto_class(hf_class or "") or hf_class
        note = f"  # {hf_class}" if auto != hf_class else ""
        return [
            f"from transformers import {auto}, AutoTokenizer",
            "",
            FOLDER,
            "tokenizer = AutoTokenizer.from_pretrained(folder)",
            f"model = {auto}.from_pretrained(folder){note}",
        ]


@export_format
class GGUF(ExportFormat):
    """model.gguf (tokenizer, special ids and chat template inside) beside config.json and the card."""

    name, title, library = "gguf", "a llama.cpp GGUF file", "gguf"

    def __init__(self, dtype: str = "f32", checking: Checking | None = None) -> None:
        if dtype not in zoo.gguf.FILE_TYPES:
            raise zoo.ConfigError(
                f"gguf.dtype={dtype!r} is not a GGUF weight type zoo writes; choose {', '.join(zoo.gguf.FILE_TYPES)}"
            )
        self.dtype, self.checking = dtype, checking or Checking()

    @classmethod
    def from_config(cls, cfg: DictConfig) -> ExportFormat:
        return cls(dtype=str(cfg.gguf.dtype), checking=Checking.from_config(cfg.checker))

    def require(self) -> None:
        require_gguf()

    def check_task(self, task: ZooTask) -> None:
        gguf_problem(task)

    def files(self, task: ZooTask) -> list[str]:
        return ["config.json", "model.gguf", "README.md"]

    def write(self, task: ZooTask, checkpoint: dict[str, Any], out: Path, card: str | None) -> tuple[float, str]:
        files = [name for name in self.files(task) if name != "README.md" or card is not None]
        config = {
            "model": task.model.config.to_dict(),
            "task": checkpoint["zoo_run"]["task"],
            **task.export_info(head_in_graph=self.head_in_graph),
            RECORD: export_record(out, self.name, files),
        }
        return export_gguf(task, out, self.dtype, config, card, self.checking)

    def pipeline(self, hf_class: str | None) -> str | None:
        return "text-generation"

    def load_code(self, task: ZooTask, hf_class: str | None) -> list[str]:
        return [
            "# llama.cpp: llama-cli -m path/to/this/folder/model.gguf",
            "import zoo",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            FOLDER,
            'got = zoo.read_gguf(f"{folder}/model.gguf")  # got.model, got.tokenizer, got.chat_template',
            'tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file="model.gguf")',
            'model = AutoModelForCausalLM.from_pretrained(folder, gguf_file="model.gguf")',
        ]
