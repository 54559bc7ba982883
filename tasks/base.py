"""What every task shares: the zoo model built from plain config, AdamW with weight-decay groups,
linear warmup then cosine decay, the tokenizer carried inside checkpoints."""

from __future__ import annotations

import math
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import torch
from tokenizers import Tokenizer
from torch import nn

import zoo


class ZooTask(L.LightningModule):
    """Base task. ``model`` is a full ModelConfig as a plain dict (what ``save_hyperparameters``
    stores), so ``Task.load_from_checkpoint(path)`` rebuilds the model with no conf/ present."""

    forms: ClassVar[tuple[str, ...]] = ()  # architecture forms the task can train

    def __init__(self, *, model: dict[str, Any], optimizer: dict[str, Any], tokenizer_json: str | None = None) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["tokenizer_json"])
        cfg = zoo.ModelConfig.from_dict(dict(model))
        self.check_model_config(cfg)
        self.model = zoo.build_model(cfg)
        self.optimizer_settings = dict(optimizer)
        self.tokenizer_json = tokenizer_json
        self.run_info: dict[str, Any] | None = None  # set by zoo-train; stored in checkpoints as plain data

    @classmethod
    def check_model_config(cls, cfg: zoo.ModelConfig) -> None:
        """Raise ConfigError when this task cannot train a model of that config."""
        if cls.forms and cfg.arch not in cls.forms:
            raise zoo.ConfigError(f"arch={cfg.arch!r} cannot be trained by {cls.__name__}; it needs arch in "
                                  f"{list(cls.forms)} (choose another model or task)")
        cfg.validate()

    @classmethod
    def check_settings(cls, settings: dict[str, Any], model: zoo.ModelConfig) -> None:
        """Raise ConfigError for task settings (``task.*``) that cannot work with ``model``."""

    @cached_property
    def tokenizer(self) -> Tokenizer:
        if self.tokenizer_json is None:
            raise RuntimeError("this task has no tokenizer (it is stored in checkpoints by training)")
        return Tokenizer.from_str(self.tokenizer_json)

    def log_text(self, text: str) -> None:
        """Print a sample and keep it in <run dir>/samples.txt (text does not fit the metric loggers)."""
        self.print(text)
        if self.trainer.is_global_zero and self.trainer.default_root_dir:
            with open(Path(self.trainer.default_root_dir) / "samples.txt", "a", encoding="utf-8") as f:
                f.write(text + "\n")

    # ---- steps: tasks whose stages differ only in name define ``step`` -------------------------------
    def step(self, batch: dict[str, Any], stage: str) -> torch.Tensor:
        """Loss of one batch at ``stage`` ("train", "val" or "test"), logging its metrics."""
        raise NotImplementedError(f"{type(self).__name__} defines its own *_step methods")

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return self.step(batch, "train")

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.step(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.step(batch, "test")

    # ---- checkpoints ------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["tokenizer_json"] = self.tokenizer_json
        checkpoint["zoo_run"] = self.run_info
        checkpoint["state_dict"] = {k.replace("_orig_mod.", ""): v for k, v in checkpoint["state_dict"].items()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.tokenizer_json = checkpoint.get("tokenizer_json")
        self.run_info = checkpoint.get("zoo_run")
        self.__dict__.pop("tokenizer", None)

    @classmethod
    def from_checkpoint(cls, checkpoint: dict[str, Any], *, source: str = "the checkpoint") -> ZooTask:
        """Rebuild the task of a checkpoint loaded with ``zoo.load_weights_file``. Its config is
        checked against the tensors it holds on the meta device first, so a config that asks for
        absurd sizes is refused before anything is allocated."""
        hparams = dict(checkpoint.get("hyper_parameters") or {})
        state = checkpoint.get("state_dict")
        if not isinstance(hparams.get("model"), dict) or not isinstance(state, dict):
            raise zoo.CheckpointError(f"{source} has no model config or weights; pass a checkpoint of zoo-train")
        try:
            cfg = zoo.ModelConfig.from_dict(dict(hparams["model"]))
            cls.check_model_config(cfg)
        except zoo.ConfigError as error:
            raise zoo.CheckpointError(f"{source}: its model config cannot work: {error}") from None
        check_tensors(cfg, state, source)
        bad = next((k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()), None)
        if bad is not None:
            raise zoo.CheckpointError(f"{source}: tensor {bad} holds NaN or infinite values; use a checkpoint saved "
                                      f"before the run diverged")
        try:
            Tokenizer.from_str(checkpoint["tokenizer_json"])
        except Exception as error:  # the tokenizers library raises its own exception types
            raise zoo.CheckpointError(f"{source}: its tokenizer cannot be read ({_first_line(error)})") from None
        try:
            task = cls(**hparams, tokenizer_json=checkpoint["tokenizer_json"])
        except (TypeError, ValueError, zoo.ConfigError) as error:
            raise zoo.CheckpointError(f"{source}: its task settings do not fit {cls.__name__} "
                                      f"({_first_line(error)})") from None
        task.on_load_checkpoint(checkpoint)
        try:
            task.load_state_dict(state)
        except RuntimeError as error:
            raise zoo.CheckpointError(f"{source}: its tensors do not fit {cls.__name__} ({_first_line(error)})") \
                from None
        return task

    def init_from(self, checkpoint: dict[str, Any], *, source: str, partial: bool = False) -> None:
        """Start from another checkpoint's weights (e.g. a classifier from a masked-LM run).

        The backbone must fit: the same form, and every tensor both models have of the same shape;
        otherwise a ConfigError says what differs, unless ``partial`` (``init_partial=true``) asks to
        load whatever fits. Tensors only this task has (a classifier head) start fresh."""
        own = self.state_dict()
        state = checkpoint["state_dict"]
        theirs = zoo.ModelConfig.from_dict(dict(checkpoint["hyper_parameters"]["model"]))
        mine = self.model.config
        problems = []
        if theirs.arch != mine.arch:
            problems.append(f"it has arch={theirs.arch!r} and this run trains arch={mine.arch!r}")
        clash = [k for k, v in state.items() if k in own and own[k].shape != v.shape]
        if clash:
            k = clash[0]
            problems.append(f"{len(clash)} tensors differ in shape, e.g. {k} {tuple(state[k].shape)} there, "
                            f"{tuple(own[k].shape)} here ({_size_diff(theirs, mine)})")
        loaded = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
        if problems and not partial:
            raise zoo.ConfigError(f"init_from={source}: {'; '.join(problems)}; only {len(loaded)} of {len(own)} "
                                  f"tensors would load. Choose a checkpoint of the same form and sizes, or set "
                                  f"init_partial=true to load what fits")
        self.load_state_dict(loaded, strict=False)
        skipped = sorted(set(state) - set(loaded))
        fresh = sorted(set(own) - set(loaded))
        print(f"init_from {source}: {len(loaded)} tensors loaded, {len(skipped)} skipped "
              f"({', '.join(skipped[:4])}{'…' if len(skipped) > 4 else ''}), {len(fresh)} freshly initialised")

    # ---- optimisation -------------------------------------------------------------------------------
    def configure_optimizers(self) -> dict[str, Any]:
        settings = dict(self.optimizer_settings)
        warmup, min_ratio = settings.pop("warmup_steps"), settings.pop("min_lr_ratio")
        optimizer = adamw(self, **settings)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(warmup, total, min_ratio))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def check_tensors(cfg: zoo.ModelConfig, state: dict[str, Any], source: str) -> None:
    """Raise a CheckpointError unless ``state`` holds the tensors of the model ``cfg`` describes,
    before anything is allocated (``zoo.check_weights``)."""
    shapes = {k.removeprefix("model."): tuple(v.shape) for k, v in state.items()
              if k.startswith("model.") and isinstance(v, torch.Tensor)}
    zoo.check_weights(cfg, shapes, source=source)


def _first_line(error: BaseException, limit: int = 200) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _size_diff(theirs: zoo.ModelConfig, mine: zoo.ModelConfig) -> str:
    fields = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "max_seq_len")
    diffs = [f"{f}={getattr(theirs, f)} there, {getattr(mine, f)} here" for f in fields
             if getattr(theirs, f) != getattr(mine, f)]
    return "; ".join(diffs) or "same sizes"


def adamw(module: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float] | list[float],
          eps: float = 1e-8, fused: bool | None = None) -> torch.optim.AdamW:
    """AdamW whose weight decay skips biases, norms and embeddings (Loshchilov & Hutter 2019; the
    GPT-2/BERT practice): only matrices of linear layers decay."""
    embeddings = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for p in module.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 and id(p) not in embeddings else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if fused is None:
        fused = all(p.is_cuda for p in decay + no_decay) and bool(decay + no_decay)
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused or None)


def warmup_cosine(warmup_steps: int, total_steps: int, min_ratio: float):
    """LR multiplier: linear from 1/warmup to 1, then half a cosine down to ``min_ratio``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor
