"""What zoo-train (and zoo-eval, for its values) refuses before any data is read: combinations
the model, task, data and adapter cannot run, and values that would only fail later; each a
zoo.ConfigError that names the key and the fix."""

from __future__ import annotations

import math
import sys

from omegaconf import DictConfig, OmegaConf

import zoo
from tasks import TASKS, ZooTask
from tasks.base import no_base_error
from tasks.cli.schemas import model_config


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
