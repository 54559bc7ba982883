"""The values of a composed config that would fail only later (after the data is read, or
mid-training), refused in one line now: numbers out of range, the seed, the optimizer's own settings,
and the model's own rules (``check_model``: ``ModelConfig.validate`` and what it asks of the data).
No Lightning and no model built: zoo-train checks them before it imports either (tasks/cli/verbs.py)."""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, OmegaConf

import zoo
from tasks.cli.schemas import model_config
from tasks.data.settings import check_settings
from tasks.optim import SCHEDULE_KEYS, optimizer_settings

POSITIVE = (
    "optimizer.lr",
    "trainer.max_steps",
    "trainer.val_check_interval",
    "trainer.log_every_n_steps",
    "trainer.accumulate_grad_batches",
)
NON_NEGATIVE = (
    "scheduler.warmup_steps",
    "optimizer.weight_decay",
    "optimizer.eps",
    "trainer.gradient_clip_val",
    "trainer.num_sanity_val_steps",
    "scheduler.min_lr_ratio",
)
WHOLE = (
    "trainer.max_steps",
    "trainer.log_every_n_steps",
    "trainer.accumulate_grad_batches",
    "scheduler.warmup_steps",
    "trainer.num_sanity_val_steps",
)
MAX_SEED = 2**32 - 1  # Lightning's seed_everything (and numpy's) take 0 .. 2**32 - 1


def check_values(cfg: DictConfig) -> None:
    """Values that would only fail later (after the data is read, or mid-training) fail now."""
    check_seed(OmegaConf.select(cfg, "seed", default=None))
    data = OmegaConf.select(cfg, "data", default=None)
    if isinstance(data, DictConfig):  # the data module's own rule (tasks/data/settings.py), before it is built
        check_settings(OmegaConf.to_container(data, resolve=True))
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


def check_model(cfg: DictConfig) -> zoo.ModelConfig:
    """The composed model, checked by the library's rules (``ModelConfig.validate``: sizes, heads, the
    chosen components' and the form's checks) and against the data it reads: a learned position table
    shorter than ``data.seq_len``, packed documents for a mask that does not read them. Builds nothing
    and needs no Lightning: zoo-train asks it before importing either, and again (through
    ``check_composition``) for the model a run trains, which ``init_from=`` or ``resume=`` may replace."""
    model = model_config(cfg.model).validate()
    seq_len = OmegaConf.select(cfg, "data.seq_len", default=None)
    limit = zoo.position_limit(model)
    if seq_len and limit is not None and seq_len > limit:
        raise zoo.ConfigError(
            f"data.seq_len={seq_len} is longer than the learned position table "
            f"(model.max_seq_len={limit}); raise one or lower the other"
        )
    if (
        OmegaConf.select(cfg, "data.packing", default=None) == "documents"
        and not zoo.mask.MASK.get(model.resolved_mask).documents
    ):
        raise zoo.ConfigError(
            f"data.packing=documents gives the model document ids, which mask={model.resolved_mask} "
            f"does not read; add model/mask=document (or use data.packing=concat)"
        )
    return model


def check_seed(seed: Any, key: str = "seed") -> None:
    """A seed is a whole number in [0, 2**32 - 1] (what Lightning and numpy seed with); None: not set."""
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise zoo.ConfigError(f"{key}={seed!r} must be a whole number in [0, {MAX_SEED}] (2**32 - 1)")
