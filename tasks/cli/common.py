"""What the console verbs share: where conf/ is, the typed model schema, reading checkpoints, and
how a verb ends on a user's mistake (one line, no traceback)."""

from __future__ import annotations

import dataclasses
import errno
import functools
import re
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

import zoo
from tasks import TASKS, ZooTask
from tasks.data import DATA_MODULES, TextDataModule
from tasks.errors import DivergedError, UserError

USER_ERRORS = (zoo.ConfigError, zoo.CheckpointError, UserError)
"""Exceptions whose message is the whole story: a verb prints it in one line and exits 2."""


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
    check_values(cfg)
    seq_len = cfg.data.get("seq_len")
    limit = zoo.position_limit(model)
    if seq_len and limit is not None and seq_len > limit:
        raise zoo.ConfigError(f"data.seq_len={seq_len} is longer than the learned position table "
                              f"(model.max_seq_len={limit}); raise one or lower the other")
    task_cls.check_settings(OmegaConf.to_container(cfg.task, resolve=True), model)
    return model


POSITIVE = ("optimizer.lr", "data.batch_size", "data.seq_len", "trainer.max_steps", "trainer.val_check_interval",
            "trainer.log_every_n_steps", "trainer.accumulate_grad_batches", "data.vocab_size")
NON_NEGATIVE = ("optimizer.warmup_steps", "optimizer.weight_decay", "trainer.gradient_clip_val",
                "trainer.num_sanity_val_steps", "data.num_workers")


def check_values(cfg: DictConfig) -> None:
    """Values that would only fail later (after the data is read, or mid-training) fail now."""
    for key in POSITIVE + NON_NEGATIVE:
        value = OmegaConf.select(cfg, key, default=None)
        if value is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if key == "trainer.max_steps" and value == -1:  # Lightning's "no limit" (max_epochs decides)
            continue
        if (value <= 0 and key in POSITIVE) or value < 0:
            bound = "> 0" if key in POSITIVE else ">= 0"
            raise zoo.ConfigError(f"{key}={value} must be {bound}")
    ratio = OmegaConf.select(cfg, "optimizer.min_lr_ratio", default=None)
    if ratio is not None and not 0 <= ratio <= 1:
        raise zoo.ConfigError(f"optimizer.min_lr_ratio={ratio} must be between 0 and 1 (a fraction of optimizer.lr)")
    interval = OmegaConf.select(cfg, "trainer.val_check_interval", default=None)
    if isinstance(interval, float) and interval > 1:
        raise zoo.ConfigError(f"trainer.val_check_interval={interval}: a fraction of an epoch is at most 1.0; give "
                              f"a whole number of steps instead")


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
    """Rebuild a trained task from its checkpoint alone, through zoo's one weights-only loader."""
    checkpoint = zoo.load_weights_file(ckpt_path, map_location)
    task = task_from_checkpoint(checkpoint, ckpt_path)
    return task.eval(), checkpoint["zoo_run"]


def task_from_checkpoint(checkpoint: Any, ckpt_path: str | Path) -> ZooTask:
    """The task a loaded checkpoint holds, with its weights; a CheckpointError when it is not a
    zoo-train checkpoint or its config disagrees with its tensors."""
    info = checkpoint.get("zoo_run") if isinstance(checkpoint, dict) else None
    if not isinstance(info, dict) or info.get("task") not in TASKS:
        raise zoo.CheckpointError(f"{ckpt_path} is not a zoo-train checkpoint (it has no zoo_run record); "
                                  f"pass a checkpoint from <run>/checkpoints/")
    return TASKS[info["task"]].from_checkpoint(checkpoint, source=str(ckpt_path))


def data_module(info: dict[str, Any], task: ZooTask, **overrides: Any) -> TextDataModule:
    """The data module a checkpoint was trained on, with its own tokenizer."""
    if info.get("data_module") not in DATA_MODULES:
        raise zoo.CheckpointError(f"the checkpoint names data module {info.get('data_module')!r}, which is not one "
                                  f"of zoo's {sorted(DATA_MODULES)}")
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


def fail(error: BaseException, code: int = 2) -> typing.NoReturn:
    """End the verb with one line on stderr: ``zoo: <kind>: <message>``."""
    print(f"zoo: {type(error).__name__}: {error}", file=sys.stderr)
    sys.exit(code)


F = TypeVar("F", bound=Callable[..., Any])

NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
NO_WRITE = {errno.EROFS, errno.EACCES, errno.EPERM}


def user_errors(fn: F) -> F:
    """Decorate a verb: a user's mistake (USER_ERRORS), a diverged training run, Ctrl-C, a full disk or
    a folder it may not write end it with one line and an exit code (2 for a mistake; 130 for Ctrl-C;
    1 for the rest), not a traceback.
    Everything else is a bug in zoo and keeps its traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as error:
            fail(error)
        except DivergedError as error:
            fail(error, code=1)
        except KeyboardInterrupt:
            print("zoo: interrupted", file=sys.stderr)
            sys.exit(130)
        except OSError as error:
            if error.errno in NO_SPACE:
                fail(UserError(f"cannot write {error.filename or 'a file'}: no space left on the device; free "
                               f"some space or choose another output folder"), code=1)
            if error.errno in NO_WRITE and error.filename:
                fail(UserError(f"cannot write {error.filename}: {error.strerror}; choose a folder you can write "
                               f"(paths.output_dir / hydra.run.dir, or out=)"), code=1)
            raise

    return typing.cast(F, wrapper)


def literal(cfg: DictConfig, key: str) -> str | None:
    """A free-text value (``prompt=``, ``text=``) exactly as given: no ``${...}`` interpolation
    (the OmegaConf escapes that quote_free_text adds are undone); None when missing."""
    if key not in cfg or OmegaConf.is_missing(cfg, key):
        return None
    value = OmegaConf.to_container(cfg, resolve=False).get(key)
    if value is None:
        return None
    return re.sub(r"(\\*)\$\{", lambda m: "\\" * (len(m.group(1)) // 2) + "${", str(value))
