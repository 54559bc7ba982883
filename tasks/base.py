"""What every task shares: the zoo model built from plain config, one step for train/val/test
(the task's ``model_step`` computes the loss and updates its per-stage metrics, the base logs them
as ``stage/name``), the methods the verbs call (``respond``, ``export_*``), AdamW with weight-decay
groups, linear warmup then cosine decay, the tokenizer carried inside checkpoints."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import torch
from tokenizers import Tokenizer
from torch import Tensor, nn
from torchmetrics import Metric, MetricCollection

import zoo
from tasks.data.tokenizers import Specials
from tasks.errors import UserError
from tasks.optim import SCHEDULE_KEYS, build_optimizer, warmup_cosine
from tasks.run.checkpoints import BASE_KEY, base_reference
from tasks.run.init_from import check_tensors, first_line, loaded_line, no_base_error, size_diff
from tasks.run.precision import clip_under_mixed_precision
from tasks.strategy import PipelineBatch, pipeline_step_of, strategy_of
from zoo.generation import generate

STAGES = ("train", "val", "test")


SAVE_MODES = ("full", "only")  # adapter.save: whole checkpoints, or the trained tensors and a reference to the base


DECODING = (
    *("max_new_tokens", "do_sample", "temperature", "top_k", "top_p"),
    *("num_beams", "length_penalty", "repetition_penalty", "no_repeat_ngram_size"),
)
"""The settings of ``ZooModel.generate`` that say how a model decodes (not what it is given)."""


class ZooTask(L.LightningModule):
    """Base task. ``model`` is a full ModelConfig as a plain dict (what ``save_hyperparameters``
    stores), so ``Task.load_from_checkpoint(path)`` rebuilds the model with no conf/ present."""

    forms: ClassVar[tuple[str, ...]] = ()  # architecture forms the task can train
    pipelined: ClassVar[bool] = False  # cuts batches and losses into stages (pipeline_batch, pipeline_loss): trainer=pp
    chats: ClassVar[bool] = False  # answers a conversation (``chat``): zoo-generate chat=true
    label_names: list[str] | None = None  # a classifier's, by class index (the model card lists them)

    def __init__(
        self,
        *,
        model: dict[str, Any],
        optimizer: dict[str, Any],
        scheduler: dict[str, Any] | None = None,
        tokenizer_json: str | None = None,
        adapter: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["tokenizer_json"])
        cfg = zoo.ModelConfig.from_dict(dict(model))
        self.check_model_config(cfg)
        self.model = zoo.build_model(cfg)
        settings = dict(adapter or {})
        name = settings.pop("name", "none")
        self.adapter_save = settings.pop("save", "full")  # conf/adapter: full, or only (the adapter + its base's name)
        if self.adapter_save not in SAVE_MODES or (self.adapter_save == "only" and name == "none"):
            raise zoo.ConfigError(
                f"adapter.save={self.adapter_save!r}: choose auto (only with init_from=, else full), full or only "
                f"(only with an adapter such as adapter=lora: without one every tensor trains)"
            )
        if name != "none":  # conf/adapter: LoRA freezes the model and trains its adapters
            zoo.adapters.apply(self.model, name, **settings)
        self.optimizer_settings = dict(optimizer)
        moved = {k: self.optimizer_settings.pop(k) for k in SCHEDULE_KEYS if k in self.optimizer_settings}
        self.scheduler_settings = {**moved, **(scheduler or {})}  # conf/scheduler: warmup then cosine decay
        self.tokenizer_json = tokenizer_json
        self.run_info: dict[str, Any] | None = None  # set by zoo-train; stored in checkpoints as plain data
        self.specials: dict[str, Any] | None = None  # the tokenizer's special ids when not zoo's own (an HF folder's)
        self.base_ref: dict[str, Any] | None = None  # adapter.save=only: where the frozen base comes from (init_from)
        self.compiled_loss: Callable[[dict[str, Any]], Tensor] | None = None  # compile=true: train_loss compiled

    @classmethod
    def check_model_config(cls, cfg: zoo.ModelConfig) -> None:
        """Raise ConfigError when this task cannot train a model of that config."""
        if cls.forms and cfg.arch not in cls.forms:
            raise zoo.ConfigError(
                f"arch={cfg.arch!r} cannot be trained by {cls.__name__}, which trains "
                f"{' or '.join(cls.forms)} models (choose another model or task)"
            )
        cfg.validate()

    @classmethod
    def check_settings(cls, settings: dict[str, Any], model: zoo.ModelConfig) -> None:
        """Raise ConfigError for task settings (``task.*``) that cannot work with ``model``."""

    def configure_model(self) -> None:
        """Lightning's hook for a strategy that splits the model once its processes are up: a strategy
        with a ``parallelize`` (trainer=tp: tasks.parallel) splits each block over the ranks; the
        others keep it whole."""
        strategy_of(self._trainer).parallelize(self)  # no trainer: load_from_checkpoint calls this hook too

    def train_loss(self, batch: dict[str, Any]) -> Tensor:
        """The loss of a training batch, for a task whose training step computes nothing else (no metric
        reads it in training): what ``compile_steps`` compiles whole. A task whose training updates metrics
        does not define it and trains through ``model_step``."""
        raise NotImplementedError(f"{type(self).__name__} trains through model_step")

    def training_loss(self, batch: dict[str, Any]) -> Tensor:
        """``train_loss``, compiled when ``compile_steps`` compiled it."""
        return (self.compiled_loss or self.train_loss)(batch)

    def compile_steps(self) -> None:
        """compile=true: the model's forward through ``torch.compile``, in place (parameter names, and so
        checkpoints, stay the plain model's), and a ``train_loss`` compiled whole: the loss over the
        vocabulary then runs in the model's graph instead of eagerly after it (scripts/bench/device.py
        measures the two)."""
        self.model.compile()
        if type(self).train_loss is not ZooTask.train_loss:
            self.compiled_loss = torch.compile(self.train_loss)

    def pipeline_batch(self, batch: dict[str, Tensor]) -> PipelineBatch:
        """The batch as pipeline stages take it (a ``pipelined`` task's; trainer=pp asks it)."""
        raise NotImplementedError(f"{type(self).__name__} is not cut into pipeline stages")

    def pipeline_loss(self, hidden: Tensor, target: dict[str, Tensor], stage: str) -> Tensor:
        """On a pipeline's last stage: one microbatch's losses, summed, from its final hidden states (a
        ``pipelined`` task's; trainer=pp asks it)."""
        raise NotImplementedError(f"{type(self).__name__} is not cut into pipeline stages")

    def pipeline_step(self) -> Callable[[ZooTask, dict[str, Any], str], Tensor] | None:
        """The strategy's ``pipeline_step`` when it runs the model as pipeline stages (trainer=pp:
        tasks.parallel.pipeline; it calls the task's ``pipeline_loss`` on the last stage), else None."""
        return pipeline_step_of(self._trainer)

    @cached_property
    def tokenizer(self) -> Tokenizer:
        if self.tokenizer_json is None:
            raise RuntimeError("this task has no tokenizer (it is stored in checkpoints by training)")
        return Tokenizer.from_str(self.tokenizer_json)

    @property
    def special_tokens(self) -> Specials:
        """Where the tokenizer's special tokens are: zoo's own ids, or those an HF folder's tokenizer recorded."""
        return Specials.from_record(self.specials) if self.specials else Specials.zoo()

    def log_text(self, text: str) -> None:
        """Print a sample and keep it in <run dir>/samples.txt (text does not fit the metric loggers)."""
        self.print(text)
        if self.trainer.is_global_zero and self.trainer.default_root_dir:
            with open(Path(self.trainer.default_root_dir) / "samples.txt", "a", encoding="utf-8") as f:
                f.write(text + "\n")

    # ---- one step for every stage: the task computes, the base logs ---------------------------------
    def metrics(self, stage: str) -> dict[str, Metric]:
        """The metrics this task keeps at ``stage`` ("train", "val" or "test"), by name; logged after
        the loss as ``<stage>/<name>``. Called once per stage by ``add_metrics``."""
        return {}

    def add_metrics(self) -> None:
        """Give the task ``train_metrics``, ``val_metrics`` and ``test_metrics``: a MetricCollection per
        stage made by ``metrics``. Each task calls it last in its ``__init__``, when what the metrics
        need (e.g. the number of labels) is known."""
        train, val, test = (MetricCollection(self.metrics(stage), prefix=f"{stage}/") for stage in STAGES)
        self.train_metrics, self.val_metrics, self.test_metrics = train, val, test

    def metrics_at(self, stage: str) -> MetricCollection:
        """The MetricCollection of ``stage`` (empty when the task keeps no metrics there)."""
        return {"train": self.train_metrics, "val": self.val_metrics, "test": self.test_metrics}[stage]

    def model_step(self, batch: dict[str, Any], batch_idx: int, stage: str) -> Tensor:
        """The loss of one batch at ``stage``; updates ``metrics_at(stage)`` with what the batch shows."""
        raise NotImplementedError(f"{type(self).__name__} does not define model_step")

    def shared_step(self, batch: dict[str, Any], batch_idx: int, stage: str) -> Tensor:
        """``model_step``, then the log: ``<stage>/loss`` (averaged over processes except in training; on
        the progress bar in validation, and in training as ``StopOnNonFinite`` reads it at the logging
        interval: a value on Lightning's bar would be read from the device at every step) and the stage's
        metrics (on the bar in validation). The model's auxiliary losses (an MoE router's,
        ``ZooModel.aux_losses``) are logged as ``<stage>/<name>`` and added to the loss that training
        minimises; ``<stage>/loss`` stays the task's own, comparable across models."""
        pipeline = self.pipeline_step()
        loss = self.model_step(batch, batch_idx, stage) if pipeline is None else pipeline(self, batch, stage)
        size = len(batch["input_ids"])
        self.log(f"{stage}/loss", loss, prog_bar=stage == "val", sync_dist=stage != "train", batch_size=size)
        for name, value in self.model.aux_losses().items():
            self.log(f"{stage}/{name}", value, sync_dist=stage != "train", batch_size=size)
            if stage == "train":
                loss = loss + value
        self.log_dict(self.metrics_at(stage), prog_bar=stage == "val")
        return loss

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        return self.shared_step(batch, batch_idx, "train")

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.shared_step(batch, batch_idx, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.shared_step(batch, batch_idx, "test")

    # ---- what the verbs ask: each task answers in its own way ---------------------------------------
    def generation_settings(self) -> dict[str, Any]:
        """The ``model.generate`` keywords this task decodes with where they are not generate's defaults
        (its validation samples, its translations); {} for a task that does not generate."""
        return {}

    def decoding_settings(self) -> dict[str, Any]:
        """Every decoding setting of ``ZooModel.generate`` (:data:`DECODING`) this task decodes with: its
        own, and generate's defaults for the rest. zoo-generate decodes with them where its command line
        says nothing else, and ``zoo-export format=hf`` writes them into generation_config.json."""
        defaults = inspect.signature(generate).parameters  # where generate declares them
        return {name: defaults[name].default for name in DECODING} | self.generation_settings()

    def respond(self, prompt: str, **settings: Any) -> str:
        """What zoo-generate prints for ``prompt``. ``settings`` are those of conf/generate.yaml
        (max_new_tokens, do_sample, temperature, top_k, top_p, num_beams, top, seed); a task reads the
        ones it needs. A setting that cannot work is a UserError or a zoo.ConfigError naming it."""
        raise NotImplementedError(f"{type(self).__name__} does not answer prompts")

    def prompt_ids(self, prompt: str) -> list[int]:
        """The prompt's token ids (special tokens included) for a model that reads it whole; a
        UserError when they are more than its positions can number."""
        ids = self.tokenizer.encode(prompt).ids
        limit = self.model.max_positions
        if limit is not None and len(ids) > limit:
            raise UserError(
                f"prompt= is {len(ids)} tokens long but this model numbers at most {limit} positions "
                f"(max_seq_len); shorten it"
            )
        return ids

    def export_info(self, *, head_in_graph: bool) -> dict[str, Any]:
        """Fields this task adds to the config.json of an export, beside the model config, the task name and
        the export record; ``head_in_graph``: the exported file computes the task's head itself (ONNX)."""
        return {}

    def export_modules(self) -> dict[str, nn.Module]:
        """Modules of the task outside ``model`` that a safetensors export writes, by file name."""
        return {}

    def export_head(self, outputs: Tensor, attention_mask: Tensor) -> Tensor:
        """What the exported graph returns, given the model's outputs (hidden states or logits) and
        the (B, T) attention mask: the outputs themselves unless the task adds a head."""
        return outputs

    def hf_classifier(self) -> tuple[nn.Linear, list[str]] | None:
        """For ``zoo-export format=hf``: a linear head over the pooled output with its label names
        (written as a sequence-classification model), or None when the model is exported as it is."""
        return None

    def merge_adapter(self) -> None:
        """Fold a LoRA adapter into the model's weights (what an export writes: a plain dense model)."""
        if zoo.adapters.adapted_layers(self.model):
            zoo.adapters.merge(self.model)

    def export_tokenizer(self) -> Tokenizer:
        """The tokenizer an export carries: the one the task encodes with, as a user's tokenizer
        call should encode (a task that adds tokens around its inputs says so here)."""
        return self.tokenizer

    # ---- checkpoints ------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["tokenizer_json"] = self.tokenizer_json
        checkpoint["zoo_run"] = self.run_info
        if self.specials is not None:
            checkpoint["tokenizer_specials"] = self.specials
        state = {k.replace("_orig_mod.", ""): v for k, v in checkpoint["state_dict"].items()}
        if self.adapter_save == "only":  # the frozen base stays where init_from read it; loaders put it back
            self.reference_base(None)  # zoo-train checked it at the start: a run without a base never gets here
            left_out = set(self.base_ref["keys"])
            state = {k: v for k, v in state.items() if k not in left_out}
            checkpoint[BASE_KEY] = self.base_ref
        checkpoint["state_dict"] = state

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.tokenizer_json = checkpoint.get("tokenizer_json")
        self.run_info = checkpoint.get("zoo_run")
        self.specials = checkpoint.get("tokenizer_specials")
        self.base_ref = checkpoint.get(BASE_KEY) or self.base_ref
        self.__dict__.pop("tokenizer", None)

    def reference_base(self, resumed: dict[str, Any] | None) -> None:
        """With ``adapter.save=only``, make sure the checkpoints can name their base: init_from's, or
        that of the adapter-only checkpoint being resumed; a ConfigError before training otherwise."""
        if self.adapter_save != "only":
            return
        self.base_ref = self.base_ref or (resumed or {}).get(BASE_KEY)
        if self.base_ref is None:
            raise no_base_error(
                "ckpt_path's checkpoint holds the whole model and names no base" if resumed else "no init_from"
            )

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
        check_tensors(cfg, {k: v for k, v in state.items() if not zoo.adapters.is_adapter_tensor(k)}, source)
        bad = next((k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()), None)
        if bad is not None:
            raise zoo.CheckpointError(
                f"{source}: tensor {bad} holds NaN or infinite values; use a checkpoint saved before the run diverged"
            )
        try:
            Tokenizer.from_str(checkpoint["tokenizer_json"])
        except Exception as error:  # the tokenizers library raises its own exception types
            raise zoo.CheckpointError(f"{source}: its tokenizer cannot be read ({first_line(error)})") from None
        try:
            task = cls(**hparams, tokenizer_json=checkpoint["tokenizer_json"])
        except (TypeError, ValueError, zoo.ConfigError) as error:
            raise zoo.CheckpointError(
                f"{source}: its task settings do not fit {cls.__name__} ({first_line(error)})"
            ) from None
        task.on_load_checkpoint(checkpoint)
        try:
            task.load_state_dict(state)
        except RuntimeError as error:
            raise zoo.CheckpointError(
                f"{source}: its tensors do not fit {cls.__name__} ({first_line(error)})"
            ) from None
        return task

    def init_from(self, checkpoint: dict[str, Any], *, source: str, partial: bool = False) -> None:
        """Start from another checkpoint's weights (e.g. a classifier from a masked-LM run).

        The backbone must fit: the same form, and every tensor both models have of the same shape;
        otherwise a ConfigError says what differs, unless ``partial`` (``init_partial=true``) asks to
        load whatever fits. Tensors only this task has (a classifier head) start fresh. The vocabulary's
        tables fit whatever their padding (``vocab_multiple_of``): an unpadded model's rows start a padded
        preset, the padding rows zero."""
        own = self.state_dict()
        state = dict(checkpoint["state_dict"])
        theirs = zoo.ModelConfig.from_dict(dict(checkpoint["hyper_parameters"]["model"]))
        mine = self.model.config
        if theirs.vocab_size == mine.vocab_size:  # its vocabulary tables padded otherwise (vocab_multiple_of)
            self.model.fit_vocab_rows(state, theirs.padded_vocab_size, prefix="model.")
        problems = []
        if theirs.form is not mine.form:
            problems.append(f"it has arch={theirs.arch!r} and this run trains arch={mine.arch!r}")
        clash = [k for k, v in state.items() if k in own and own[k].shape != v.shape]
        if clash:
            k = clash[0]
            problems.append(
                f"{len(clash)} tensors differ in shape, e.g. {k} {tuple(state[k].shape)} there, "
                f"{tuple(own[k].shape)} here ({size_diff(theirs, mine)})"
            )
        loaded = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
        if problems and not partial:
            raise zoo.ConfigError(
                f"init_from={source}: {'; '.join(problems)}; only {len(loaded)} of {len(own)} "
                f"tensors would load. Choose a checkpoint of the same form and sizes, or set "
                f"init_partial=true to load what fits"
            )
        self.load_state_dict(loaded, strict=False)
        if self.adapter_save == "only":  # the base tensors that stay frozen: checkpoints name them, not hold them
            trains = {k for k, p in self.named_parameters(remove_duplicate=False) if p.requires_grad}
            base = [k for k in loaded if k not in trains]
            self.base_ref = base_reference(source, checkpoint["state_dict"], base)  # as the source holds them
        skipped = sorted(set(state) - set(loaded))
        fresh = sorted(set(own) - set(loaded))
        adapter = [k for k in fresh if zoo.adapters.is_adapter_tensor(k)]
        print(f"init_from {source}: {loaded_line(loaded, skipped, [k for k in fresh if k not in adapter], adapter)}")

    # ---- optimisation -------------------------------------------------------------------------------
    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: Any = None,
    ) -> None:
        """Lightning's clipping (``trainer.gradient_clip_val`` by ``gradient_clip_algorithm``), fused
        optimizers included: Lightning's mixed-precision plugin refuses to clip for an optimizer that
        unscales gradients inside its own step (fused AdamW), so ``clip_under_mixed_precision`` does."""
        if not clip_under_mixed_precision(
            self.trainer.precision_plugin, optimizer, gradient_clip_val, gradient_clip_algorithm
        ):
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_optimizer(self, self.optimizer_settings)  # optimizer.name: adamw, muon (tasks.optim)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            warmup_cosine(self.scheduler_settings["warmup_steps"], total, self.scheduler_settings["min_lr_ratio"]),
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def padding_mask(batch: dict[str, Any]) -> Tensor | None:
    """The mask the model applies to ``batch``: its ``attention_mask`` when its collate padded a row
    (``batch["padded"]``, decided on the host from the lengths), None when nothing is padding. The
    model then takes its unmasked kernels without reading the mask on the device to find out
    (``zoo.kernel_inputs.keep_mask``). A batch that does not say is taken as padded."""
    return batch["attention_mask"] if batch.get("padded", True) else None


def top_count(top: Any) -> int:
    """``top=`` of zoo-generate: how many labels or tokens to show, at least one; a UserError otherwise."""
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise UserError(f"top={top!r} must be a whole number >= 1 (how many labels or tokens to show)")
    return top
