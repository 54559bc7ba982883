"""What the console verbs share: where conf/ is, the typed model schema, reading checkpoints."""

from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path
from typing import Any, Optional

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

import zoo
from tasks import TASKS, ZooTask
from tasks.data import DATA_MODULES, TextDataModule


def conf_dir() -> str:
    """conf/ of a source checkout or editable install; inside the package in a built wheel."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / "conf", here.parents[1] / "conf"):
        if (candidate / "train.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError("zoo's conf/ directory was not found next to the tasks package")


def register_model_schema() -> None:
    """Every ModelConfig field as an optional, typed key of ``model`` (null = keep the preset's),
    so ``model.n_layers=4`` needs no ``+`` and ``model.n_layers=four`` fails at composition."""
    hints = typing.get_type_hints(zoo.ModelConfig)
    # typing.Optional, not X | None: OmegaConf reads only the former
    fields: list[tuple[str, Any, Any]] = [("preset", Optional[str], dataclasses.field(default=None)),  # noqa: UP045
                                          ("compile", bool, dataclasses.field(default=False))]
    for f in dataclasses.fields(zoo.ModelConfig):
        base = [t for t in typing.get_args(hints[f.name]) if t is not type(None)] or [hints[f.name]]
        fields.append((f.name, Optional[base[0]], dataclasses.field(default=None)))  # noqa: UP045
    schema = dataclasses.make_dataclass("ModelChoices", fields)
    ConfigStore.instance().store(group="schema", name="model", node=schema)


def model_config(node: DictConfig) -> zoo.ModelConfig:
    """The ``model`` node -> a ModelConfig (not yet validated): the preset with every non-null field applied."""
    values = OmegaConf.to_container(node, resolve=True)
    values.pop("compile", None)  # how to run the model, not what it is: train.py applies it
    preset = values.pop("preset", None)
    if preset is None:
        raise zoo.ConfigError(f"model.preset is not set; choose a model, e.g. model=gpt-tiny ({zoo.list_models()})")
    return zoo.get_config(preset, **{k: v for k, v in values.items() if v is not None})


def check_composition(cfg: DictConfig) -> zoo.ModelConfig:
    """Everything that can be checked before data is loaded; raises zoo.ConfigError."""
    task_cls = task_class(cfg.task._target_)
    model = model_config(cfg.model)
    task_cls.check_model_config(model)  # the task's needs first (arch), then ModelConfig.validate
    seq_len = cfg.data.get("seq_len")
    if model.position == "learned" and seq_len and model.max_seq_len and seq_len > model.max_seq_len:
        raise zoo.ConfigError(f"data.seq_len={seq_len} is longer than the learned position table "
                              f"(model.max_seq_len={model.max_seq_len}); raise one or lower the other")
    return model


def task_class(target: str) -> type[ZooTask]:
    """The task class a config names, among zoo's own tasks only."""
    for cls in TASKS.values():
        if target in (f"{cls.__module__}.{cls.__name__}", f"tasks.{cls.__name__}"):
            return cls
    raise zoo.ConfigError(f"task._target_={target!r} is not a zoo task; choose one of {sorted(TASKS)}")


def run_info(cfg: DictConfig, task_name: str) -> dict[str, Any]:
    """Plain data stored in each checkpoint: the resolved config as YAML text and how to rebuild
    the data module (a class name from zoo's own list, never an import path)."""
    data = OmegaConf.to_container(cfg.data, resolve=True)
    module = data.pop("_target_").rsplit(".", 1)[-1]
    return {"task": task_name, "data_module": module, "data": data,
            "config_yaml": OmegaConf.to_yaml(cfg, resolve=True)}


def load_task(ckpt_path: str | Path, map_location: str = "cpu") -> tuple[ZooTask, dict[str, Any]]:
    """Rebuild a trained task from its checkpoint alone (weights_only: plain data and tensors)."""
    checkpoint = torch.load(ckpt_path, map_location=map_location, weights_only=True)
    info = checkpoint.get("zoo_run")
    if info is None or info.get("task") not in TASKS:
        raise ValueError(f"{ckpt_path} is not a zoo-train checkpoint (no zoo_run record)")
    task = TASKS[info["task"]].load_from_checkpoint(ckpt_path, map_location=map_location, weights_only=True)
    task.eval()
    return task, info


def data_module(info: dict[str, Any], task: ZooTask, **overrides: Any) -> TextDataModule:
    """The data module a checkpoint was trained on, with its own tokenizer."""
    if info["data_module"] not in DATA_MODULES:
        raise ValueError(f"unknown data module {info['data_module']!r}")
    dm = DATA_MODULES[info["data_module"]](**{**info["data"], **overrides})
    dm.tokenizer = task.tokenizer
    return dm


def quote_free_text(argv: list[str], keys: tuple[str, ...] = ("prompt", "text")) -> list[str]:
    """Let ``prompt="def fib(n):"`` through the shell and Hydra's override grammar unchanged: the
    shell strips the quotes, so the value is quoted again here unless it already is."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key in keys and not (value[:1] in "'\"" and value[-1:] == value[:1] and len(value) > 1):
            value = "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
        out.append(f"{key}{sep}{value}" if sep else arg)
    return out


def fail(error: Exception) -> typing.NoReturn:
    print(f"zoo: {type(error).__name__}: {error}", file=sys.stderr)
    sys.exit(2)
