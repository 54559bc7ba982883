"""What the console verbs share: where conf/ is, the typed model schema, reading checkpoints; how a
verb ends on a user's mistake (one line, no traceback) is tasks/cli/boundary.py, re-exported here."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import re
import sys
import typing
import warnings
from pathlib import Path
from typing import Any, Optional

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

import zoo
from tasks import TASKS, ZooTask
from tasks.base import no_base_error
from tasks.checkpoints import with_base
from tasks.cli.boundary import USER_ERRORS, fail, hydra_errors, user_errors
from tasks.data import DATA_MODULES, TextDataModule
from tasks.errors import UserError

RAISE_ERRORS_ENV = "ZOO_RAISE_ERRORS"
"""Set (non-empty) by a sweeper that records each job's error itself: zoo-train lets the exception
propagate instead of ending the process with one line; one whose ``exit_quietly`` attribute is true
(a process that has nothing to report) ends the job with None instead."""


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
    fields: list[tuple[str, Any, Any]] = [("preset", Optional[str], dataclasses.field(default=None))]  # noqa: UP045
    for f in dataclasses.fields(zoo.ModelConfig):
        base = [t for t in typing.get_args(hints[f.name]) if t is not type(None)] or [hints[f.name]]
        fields.append((f.name, Optional[base[0]], dataclasses.field(default=None)))  # noqa: UP045
    schema = dataclasses.make_dataclass("ModelChoices", fields)
    ConfigStore.instance().store(group="schema", name="model", node=schema)


def register_configs() -> None:
    """What composing zoo-train's config needs before Hydra starts: the typed model and data
    schemas and our Optuna sweeper (``hydra/sweeper=zoo_optuna``, also from an editable install,
    which Hydra's plugin scan does not see). Verbs and scripts call it in ``main``, not on import."""
    from hydra_plugins.zoo_optuna_sweeper import sweeper

    register_model_schema()
    register_data_schemas()
    sweeper.register()


def register_data_schemas() -> None:
    """``schema/data/<DataModule>``: each data module's arguments with their defaults and its
    ``_target_``; a ``conf/data/*.yaml`` extends one and states only what differs, so a default
    lives in one place (the module's signature). Values stay untyped here: ``check_values`` and
    the module refuse a bad one in one line that names it (Hydra's own type errors do not)."""
    for name in DATA_MODULES.names():
        cls = DATA_MODULES.get(name)
        target = f"{cls.__module__.rsplit('.', 1)[0]}.{name}"
        fields = {"_target_": ("_target_", str, dataclasses.field(default=target))}
        for klass in reversed([k for k in cls.__mro__ if issubclass(k, TextDataModule)]):  # base first
            hints = typing.get_type_hints(klass.__init__)
            for arg in inspect.signature(klass.__init__).parameters.values():
                if arg.kind is not arg.KEYWORD_ONLY:
                    continue
                if dict in (typing.get_origin(t) or t for t in typing.get_args(hints[arg.name])):
                    field = dataclasses.field(default_factory=dict)  # source_args: {} to add keys to
                else:
                    field = dataclasses.field(default=MISSING if arg.default is arg.empty else arg.default)
                fields[arg.name] = (arg.name, Any, field)
        ConfigStore.instance().store(
            group="schema/data", name=name, node=dataclasses.make_dataclass(name, list(fields.values()))
        )


def model_config(node: DictConfig) -> zoo.ModelConfig:
    """The ``model`` node -> a ModelConfig (not yet validated): the preset with every non-null field applied."""
    values = OmegaConf.to_container(node, resolve=True)
    preset = values.pop("preset", None)
    given = {k: v for k, v in values.items() if v is not None}
    if preset is None and given.get("arch") is not None:  # a model read from init_from=<HF folder>: every field
        return zoo.ModelConfig(**given)
    if preset is None:
        raise zoo.ConfigError(f"model.preset is not set; choose a model, e.g. model=gpt-tiny ({zoo.list_models()})")
    return zoo.get_config(preset, **given)


def check_composition(cfg: DictConfig) -> zoo.ModelConfig:
    """Everything that can be checked before data is loaded; raises zoo.ConfigError."""
    task_cls = task_class(cfg.task._target_)
    model = model_config(cfg.model)
    task_cls.check_model_config(model)  # the task's needs first (arch), then ModelConfig.validate
    check_values(cfg)
    seq_len = cfg.data.get("seq_len")
    limit = zoo.position_limit(model)
    if seq_len and limit is not None and seq_len > limit:
        raise zoo.ConfigError(
            f"data.seq_len={seq_len} is longer than the learned position table "
            f"(model.max_seq_len={limit}); raise one or lower the other"
        )
    task_cls.check_settings(OmegaConf.to_container(cfg.task, resolve=True), model)
    based = cfg.get("init_from") or cfg.get("ckpt_path")
    if OmegaConf.select(cfg, "adapter.save", default="full") == "only" and not based:
        raise no_base_error("no init_from")  # a resumed checkpoint may name one: the task checks it once read
    adapter = OmegaConf.select(cfg, "adapter.name", default="none")
    if zoo.adapters.ADAPTERS.get(adapter, field="adapter").freezes_base and not based:
        print(
            "zoo: warning: the adapter trains beside a frozen model with random weights (no init_from=): nothing "
            "pretrained is adapted; give init_from=<checkpoint, HF folder or GGUF file>, or drop adapter=",
            file=sys.stderr,
        )
    if cfg.data.get("packing") == "documents" and not zoo.mask.MASK.get(model.resolved_mask).documents:
        raise zoo.ConfigError(
            f"data.packing=documents gives the model document ids, which mask={model.resolved_mask} "
            f"does not read; add model/mask=document (or use data.packing=concat)"
        )
    return model


POSITIVE = (
    "optimizer.lr",
    "data.batch_size",
    "data.seq_len",
    "trainer.max_steps",
    "trainer.val_check_interval",
    "trainer.log_every_n_steps",
    "trainer.accumulate_grad_batches",
    "data.vocab_size",
)
NON_NEGATIVE = (
    "scheduler.warmup_steps",
    "optimizer.weight_decay",
    "optimizer.eps",
    "trainer.gradient_clip_val",
    "trainer.num_sanity_val_steps",
    "data.num_workers",
    "scheduler.min_lr_ratio",
)
WHOLE = (
    "data.batch_size",
    "data.seq_len",
    "trainer.max_steps",
    "trainer.log_every_n_steps",
    "trainer.accumulate_grad_batches",
    "data.vocab_size",
    "scheduler.warmup_steps",
    "trainer.num_sanity_val_steps",
    "data.num_workers",
)
MAX_VOCAB = 1 << 22  # 4,194,304: beyond any tokenizer in use (the largest are ~256k); training one would not fit


def check_values(cfg: DictConfig) -> None:
    """Values that would only fail later (after the data is read, or mid-training) fail now."""
    for key in POSITIVE + NON_NEGATIVE:
        value = OmegaConf.select(cfg, key, default=None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise zoo.ConfigError(f"{key}={value!r} must be a finite number")
        if key in WHOLE and not isinstance(value, int):
            raise zoo.ConfigError(f"{key}={value!r} must be a whole number")
        if key == "trainer.max_steps" and value == -1:  # Lightning's "no limit" (max_epochs decides)
            continue
        if (value <= 0 and key in POSITIVE) or value < 0:
            raise zoo.ConfigError(f"{key}={value} must be {'> 0' if key in POSITIVE else '>= 0'}")
    if OmegaConf.select(cfg, "scheduler.min_lr_ratio", default=0) > 1:
        raise zoo.ConfigError(
            f"scheduler.min_lr_ratio={cfg.scheduler.min_lr_ratio} must be at most 1 (a fraction of optimizer.lr)"
        )
    betas = OmegaConf.select(cfg, "optimizer.betas", default=None)
    if betas is not None and (len(betas) != 2 or not all(isinstance(b, int | float) and 0 <= b < 1 for b in betas)):
        raise zoo.ConfigError(f"optimizer.betas={list(betas)} must be two numbers in [0, 1), e.g. [0.9, 0.95]")
    interval = OmegaConf.select(cfg, "trainer.val_check_interval", default=None)
    if isinstance(interval, float) and interval > 1:
        raise zoo.ConfigError(
            f"trainer.val_check_interval={interval}: a fraction of an epoch is at most 1.0; give "
            f"a whole number of steps instead"
        )
    vocab = OmegaConf.select(cfg, "data.vocab_size", default=None)
    if isinstance(vocab, int) and vocab > MAX_VOCAB:
        raise zoo.ConfigError(
            f"data.vocab_size={vocab} is more than any tokenizer needs (at most {MAX_VOCAB:,}); lower it"
        )


def task_class(target: str) -> type[ZooTask]:
    """The task class a config names, among zoo's own tasks only."""
    for cls in map(TASKS.get, TASKS.names()):
        if target in (f"{cls.__module__}.{cls.__name__}", f"tasks.{cls.__name__}"):
            return cls
    raise zoo.ConfigError(f"task._target_={target!r} is not a zoo task; choose one of {TASKS.names()}")


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
    if kv_cache is not None and kv_cache not in zoo.kv_cache.KV_DTYPES:
        raise UserError(
            f"kv_cache={kv_cache} is not a KV-cache precision; choose {' or '.join(zoo.kv_cache.KV_DTYPES)}"
            f", or null for the weights' own"
        )
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


def quote_free_text(argv: list[str], keys: tuple[str, ...] = ("prompt", "text")) -> list[str]:
    """Let ``prompt="def fib(n):"`` through the shell and Hydra's override grammar unchanged: the
    shell strips the quotes, so the value is quoted again here unless it already is."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key in keys and not (value[:1] in "'\"" and value[-1:] == value[:1] and len(value) > 1):
            value = _quoted(value)
        out.append(f"{key}{sep}{value}" if sep else arg)
    return out


def _quoted(text: str) -> str:
    """``text`` as a Hydra quoted value that OmegaConf keeps as plain text: each ``${`` escaped for
    OmegaConf (n backslashes before it become 2n + 1), then quotes and the backslashes before a
    quote or the end escaped for Hydra (the only places Hydra reads a backslash)."""
    text = re.sub(r"(\\*)\$\{", lambda m: "\\" * (2 * len(m.group(1)) + 1) + "${", text)
    text = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), text)
    return f"'{text}'"


def quiet_libraries() -> None:
    """Hide what libraries print that a user cannot act on: Lightning's tip to install its cloud
    logger, and a deprecation inside Lightning's own pytree helper."""
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: "litlogger" not in record.getMessage()
    )


def literal(cfg: DictConfig, key: str) -> str | None:
    """A free-text value (``prompt=``, ``text=``) exactly as given: no ``${...}`` interpolation
    (the OmegaConf escapes that quote_free_text adds are undone); None when missing."""
    if key not in cfg or OmegaConf.is_missing(cfg, key):
        return None
    value = OmegaConf.to_container(cfg, resolve=False).get(key)
    if value is None:
        return None
    return re.sub(r"(\\*)\$\{", lambda m: "\\" * (len(m.group(1)) // 2) + "${", str(value))


__all__ = ["USER_ERRORS", "fail", "hydra_errors", "user_errors"]  # tasks.cli.boundary's, for the verbs
