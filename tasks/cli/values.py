"""The values of a composed config that would fail only later (after the data is read, or
mid-training), refused in one line now: numbers out of range, the seed, the optimizer's own settings.
No Lightning and no model: zoo-train checks them before it imports either (tasks/cli/verbs.py)."""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, OmegaConf

import zoo
from tasks.optim import SCHEDULE_KEYS, optimizer_settings

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
MAX_SEED = 2**32 - 1  # Lightning's seed_everything (and numpy's) take 0 .. 2**32 - 1
MAX_VOCAB = 1 << 22  # 4,194,304: beyond any tokenizer in use (the largest are ~256k); training one would not fit


def check_values(cfg: DictConfig) -> None:
    """Values that would only fail later (after the data is read, or mid-training) fail now."""
    check_seed(OmegaConf.select(cfg, "seed", default=None))
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
    optimizer = OmegaConf.select(cfg, "optimizer", default=None)
    if optimizer is not None:  # each optimizer's own settings (tasks.optim), the scheduler's set apart
        settings = OmegaConf.to_container(optimizer, resolve=True)
        optimizer_settings({k: v for k, v in settings.items() if k not in SCHEDULE_KEYS})
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


def check_seed(seed: Any, key: str = "seed") -> None:
    """A seed is a whole number in [0, 2**32 - 1] (what Lightning and numpy seed with); None: not set."""
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise zoo.ConfigError(f"{key}={seed!r} must be a whole number in [0, {MAX_SEED}] (2**32 - 1)")
