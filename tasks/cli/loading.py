"""A trained task back from its checkpoint: what zoo-train stores beside the weights (``run_info``),
reading a checkpoint through zoo's weights-only loader with its layout checked, the task and the
data module it was trained on, and the precisions zoo-eval and zoo-generate run it in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

import zoo
from tasks import TASKS, ZooTask
from tasks.data import DATA_MODULES, TextDataModule
from tasks.errors import UserError
from tasks.run.checkpoints import with_base


def run_info(cfg: DictConfig, task_name: str) -> dict[str, Any]:
    """Plain data stored in each checkpoint: the resolved config as YAML text and how to rebuild
    the data module (a class name from zoo's own list, never an import path)."""
    data = OmegaConf.to_container(cfg.data, resolve=True)
    module = data.pop("_target_").rsplit(".", 1)[-1]
    return {"task": task_name, "data_module": module, "data": data, "config_yaml": OmegaConf.to_yaml(cfg, resolve=True)}


def load_task(ckpt_path: str | Path, map_location: str = "cpu") -> tuple[ZooTask, dict[str, Any]]:
    """Rebuild a trained task from its checkpoint alone, through zoo's one weights-only loader."""
    task, checkpoint = task_and_checkpoint(ckpt_path, map_location)
    return task, checkpoint["zoo_run"]


def for_inference(task: ZooTask, cfg: DictConfig) -> None:
    """``quantize=`` and ``kv_cache=`` of zoo-eval and zoo-generate: the task's model, its LoRA adapter
    merged, in those precisions (``zoo.quantize``); a setting it cannot take is one line naming it."""
    weights, kv_cache = cfg.get("quantize"), cfg.get("kv_cache")
    if weights is None and kv_cache is None:
        return
    if kv_cache is not None and kv_cache not in zoo.kv_cache.KV_FORMATS:
        formats = " or ".join(zoo.kv_cache.KV_FORMATS.names())
        raise UserError(f"kv_cache={kv_cache} is not a KV-cache format; choose {formats}, or null for the weights' own")
    task.merge_adapter()
    try:
        zoo.quantize(task.model, weights=weights, kv_cache=kv_cache)
    except zoo.ConfigError as error:  # what remains is about the weights
        raise UserError(f"quantize={weights}: {error}") from None


def task_and_checkpoint(ckpt_path: str | Path, map_location: str = "cpu") -> tuple[ZooTask, dict[str, Any]]:
    """``load_task``, with the whole checkpoint it was read from (its step count and callback states)."""
    checkpoint = read_checkpoint(ckpt_path, map_location=map_location)
    task = TASKS.get(checkpoint["zoo_run"]["task"]).from_checkpoint(checkpoint, source=f"ckpt_path={ckpt_path}")
    return task.eval(), checkpoint


def read_checkpoint(
    path: str | Path, field: str = "ckpt_path", map_location: str = "cpu", *, base: bool = True
) -> dict[str, Any]:
    """A zoo-train checkpoint through the weights-only loader, its layout checked; every problem is
    a CheckpointError naming ``field``. An adapter-only one (``adapter.save=only``) gets its base
    tensors back from the base it names, checked (``base=False``: left out, for reading its config)."""
    try:
        checkpoint = zoo.load_weights_file(path, map_location)
    except zoo.CheckpointError as error:
        raise zoo.CheckpointError(f"{field}={error}") from None
    problem = layout_problem(checkpoint)
    if problem:
        raise zoo.CheckpointError(
            f"{field}={path} is not a zoo-train checkpoint: {problem}; pass one from <run>/checkpoints/"
        )
    return with_base(checkpoint, source=f"{field}={path}", map_location=map_location) if base else checkpoint


LAYOUT = {
    "zoo_run": dict,
    "hyper_parameters": dict,
    "state_dict": dict,
    "global_step": int,
    "zoo_run.task": str,
    "zoo_run.data_module": str,
    "zoo_run.data": dict,
    "zoo_run.config_yaml": str,
    "hyper_parameters.model": dict,
    "hyper_parameters.optimizer": dict,
    "tokenizer_json": str,
}
"""What a checkpoint that zoo-train wrote holds, and of which type."""


def layout_problem(checkpoint: Any) -> str | None:
    """What keeps ``checkpoint`` from being one zoo-train wrote (None: nothing)."""
    if not isinstance(checkpoint, dict):
        return f"it holds a {type(checkpoint).__name__}, not a dict"
    for key, kind in LAYOUT.items():
        outer, _, inner = key.partition(".")
        value = checkpoint.get(outer) if not inner else checkpoint[outer].get(inner)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"{key} is {type(value).__name__}, not {kind.__name__}"
    if checkpoint["zoo_run"]["task"] not in TASKS:
        return f"zoo_run.task={checkpoint['zoo_run']['task']!r} is not one of {TASKS.names()}"
    bad = next(
        (k for k, v in checkpoint["state_dict"].items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)),
        None,
    )
    if bad is not None:
        return f"state_dict entry {bad!r} is not a named tensor"
    return None


def data_module(info: dict[str, Any], task: ZooTask, **overrides: Any) -> TextDataModule:
    """The data module a checkpoint was trained on, with its own tokenizer; ``overrides`` are the
    user's ``data.*`` settings. Overrides that name a data module of their own (``+data=<name>``,
    whose ``_target_`` comes with it) replace the checkpoint's data, which a pretrained model
    (``info`` without a data module) needs."""
    overrides = dict(overrides)
    target = overrides.pop("_target_", None)
    if target is not None:  # +data=<name>: that data set, read with the model's tokenizer
        info, overrides = {"data_module": str(target).rsplit(".", 1)[-1], "data": overrides}, {}
    elif info.get("data_module") is None:
        raise UserError(
            f"ckpt_path={info.get('source')} is a pretrained model, which brings no data to evaluate "
            f"on; name it, e.g. +data=stdlib_code data.seq_len=128 (a conf/data/ file, then its "
            f"settings)"
        )
    if info.get("data_module") not in DATA_MODULES:
        raise zoo.CheckpointError(
            f"the checkpoint names data module {info.get('data_module')!r}, which is not one "
            f"of zoo's {DATA_MODULES.names()}"
        )
    cls = DATA_MODULES.get(info["data_module"])
    unknown = sorted(set(overrides) - set(info["data"]))
    if unknown:
        raise UserError(
            f"data.{unknown[0]} is not a setting of the checkpoint's data ({cls.__name__}); its settings: "
            f"{', '.join(sorted(info['data']))}"
        )
    settings = {**info["data"], **overrides}
    limit = task.model.max_positions
    if isinstance(settings.get("seq_len"), int) and limit is not None and settings["seq_len"] > limit:
        raise UserError(
            f"data.seq_len={settings['seq_len']} is longer than the model's position table "
            f"(max_seq_len={limit}); give at most data.seq_len={limit}"
        )
    try:
        dm = cls(**settings)
    except (TypeError, ValueError) as error:
        raise zoo.CheckpointError(f"the checkpoint's data settings do not fit {cls.__name__} ({error})") from None
    dm.use_tokenizer(task.tokenizer, task.special_tokens)  # with its special ids (an HF folder's, a GGUF file's)
    return dm
