"""Training callbacks of zoo's own."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import RichModelSummary, RichProgressBar
from lightning.pytorch.strategies import DeepSpeedStrategy, ParallelStrategy
from lightning.pytorch.utilities.model_summary import get_formatted_model_size, get_human_readable_count
from lightning.pytorch.utilities.model_summary.model_summary import ModelSummary as Summary
from torchmetrics import Metric, MetricCollection

import zoo
from tasks.errors import DivergedError, EndedOnPurpose
from tasks.run.loggers import CSVLogger
from tasks.run.resume import (
    ResumeState,
    at_boundary,
    crashing,
    unfinished_batches,
    validates_by_interval,
    validation_again,
)
from tasks.strategy import strategy_of
from zoo.stats import peak_flops


class Throughput(L.Callback):
    """Logs ``perf/tokens_per_s`` and, where the device's peak FLOP/s is known, ``perf/mfu`` and
    ``perf/mfu_causal``: model FLOPs utilisation, the training FLOPs per token from ``zoo.stats`` (6N plus
    the attention term, Chowdhery et al. 2022, https://arxiv.org/abs/2204.02311) times tokens per second,
    over the peak of all devices. ``perf/mfu`` counts attention whole (every query against every key:
    PaLM's and nanoGPT's convention); ``perf/mfu_causal`` counts causal self-attention at half of that,
    the keys a query sees (``flops_per_token_train_causal``). They differ by the causal layers' score
    and value products alone, most at long sequences; an encoder's two are equal.

    Tokens are the run's: each data-parallel replica's batches once (Lightning's
    ``distributed_sampler_kwargs``: every process under DDP and FSDP, one tensor-parallel group under
    trainer=tp, whose ranks read the same batches). FLOPs are the whole model's, a split one's too.

    Args:
        peak_flops: peak FLOP/s of one device; None looks the GPU up by name for the trainer's
            precision, in zoo's table of dense peaks (``zoo.stats.peak_flops``: H100 and H200, which
            Lightning lacks or lists with their 2:4-sparse figures), then in Lightning's
            (CPUs are in neither: set it to get an MFU there).
        window: optimizer steps averaged per logged value, logged at the steps it divides (a resumed run's
            first value averages the steps since it started).
    """

    def __init__(self, peak_flops: float | None = None, window: int = 10) -> None:
        self.peak_flops, self.window = peak_flops, window
        self._flops_per_token: dict[int, tuple[int, int]] = {}  # seq_len -> (attention whole, causal half)
        self._tokens = self._flop_total = self._causal_total = 0
        self._start: float | None = None
        self._step: int | None = None  # the optimizer steps taken at the previous batch's end

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._step = trainer.global_step
        device = trainer.strategy.root_device
        if self.peak_flops is None and device.type == "cuda":
            from lightning.fabric.utilities.throughput import get_available_flops

            dtype = self.matmul_dtype(str(trainer.precision))
            found = peak_flops(torch.cuda.get_device_name(device), dtype)
            self.peak_flops = found or get_available_flops(device, torch.float32 if dtype == "tf32" else dtype)

    @staticmethod
    def matmul_dtype(precision: str) -> torch.dtype | str:
        """The dtype a Lightning ``precision`` runs its matmuls in, as ``zoo.stats.peak_flops`` takes it:
        "bf16-mixed" -> bfloat16, "16-mixed" -> float16, "32-true" -> "tf32" where float32 matmuls may use
        tensor cores (``torch.set_float32_matmul_precision`` other than "highest"), else float32."""
        if "bf16" in precision:
            return torch.bfloat16
        if "16" in precision:
            return torch.float16
        if "64" in precision:
            return torch.float64
        return "tf32" if torch.get_float32_matmul_precision() != "highest" else torch.float32

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._start is None:
            self._sync(trainer)
            self._start = time.perf_counter()
        ids = batch["input_ids"]
        whole, causal = self._flops(trainer, pl_module, ids.shape[1])
        tokens = ids.numel() + (batch["decoder_input_ids"].numel() if "decoder_input_ids" in batch else 0)
        self._tokens += tokens
        self._flop_total += ids.numel() * whole
        self._causal_total += ids.numel() * causal

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._step_done(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        with contextlib.suppress(OSError):  # a step the crash checkpoint counts as done (its update was) is
            self._step_done(trainer)  # logged as one; a failed write is not the error to report

    def _step_done(self, trainer: L.Trainer) -> None:
        if self._start is None:
            return  # no batch of this run has started (an interrupt while it was set up)
        stepped, self._step = trainer.global_step != self._step, trainer.global_step
        if not stepped or trainer.global_step % self.window:  # on the window's steps: a resumed run logs
            return  # where one that never stopped does (its first window is shorter)
        self._sync(trainer)
        seconds = time.perf_counter() - self._start
        replicas = self._replicas(trainer)
        metrics = {"perf/tokens_per_s": self._tokens * replicas / seconds}
        if self.peak_flops:  # the FLOPs of all replicas over the peak of all devices
            per_flop = replicas / trainer.world_size / seconds / self.peak_flops
            metrics["perf/mfu"] = self._flop_total * per_flop
            metrics["perf/mfu_causal"] = self._causal_total * per_flop
        self._log(trainer, metrics)
        self._tokens, self._flop_total, self._causal_total, self._start = 0, 0, 0, time.perf_counter()

    @staticmethod
    def _log(trainer: L.Trainer, metrics: dict[str, float]) -> None:
        """Host floats straight to the loggers and ``callback_metrics``, as Lightning's LearningRateMonitor
        logs: through ``self.log`` each would become a device tensor, read back at the logging interval."""
        trainer.callback_metrics.update({name: torch.tensor(value) for name, value in metrics.items()})
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.fit_loop.epoch_loop._batches_that_stepped)

    def _flops(self, trainer: L.Trainer, pl_module: L.LightningModule, seq_len: int) -> tuple[int, int]:
        """Training FLOPs per token at ``seq_len``: (attention counted whole, causal attention at half)."""
        if seq_len not in self._flops_per_token:  # the model itself: no meta copy built per new length
            counted = zoo.stats(strategy_of(trainer).stats_model(pl_module.model), seq_len=seq_len)  # tp: its config
            self._flops_per_token[seq_len] = (counted.flops_per_token_train, counted.flops_per_token_train_causal)
        return self._flops_per_token[seq_len]

    @staticmethod
    def _replicas(trainer: L.Trainer) -> int:
        """The processes that read different batches."""
        strategy = trainer.strategy
        return strategy.distributed_sampler_kwargs["num_replicas"] if isinstance(strategy, ParallelStrategy) else 1

    @staticmethod
    def _sync(trainer: L.Trainer) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()


class ProgressBar(RichProgressBar):
    """Lightning's rich progress bar without what means nothing in a step-counted run: the epoch
    count "0/-2" (max_epochs=-1) and the logger version ("v_num: logs").

    Args:
        test_label: the test pass's label, which zoo-train uses to say how to skip it (a beam
            search translator's test pass can take longer than a short run's training).
    """

    def __init__(self, test_label: str = "Testing", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.test_label = test_label

    @property
    def test_description(self) -> str:  # Lightning's label of the test bar
        return self.test_label

    def _get_train_description(self, current_epoch: int) -> str:  # Lightning's hook for the bar's label
        if self.trainer.max_epochs is None or self.trainer.max_epochs < 0:
            return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"
        return super()._get_train_description(current_epoch)

    @property
    def total_train_batches(self) -> int | float:
        """The count the training bar runs to: the epoch's batches, or fewer where ``max_steps``
        ends the run first. The bar counts batches from the epoch's start, a resumed run's too;
        Lightning's own total (only the steps left) reads ``620/19`` there."""
        trainer = self.trainer
        total = trainer.num_training_batches
        if trainer.max_epochs == -1 and trainer.max_steps is not None and trainer.max_steps > 0:
            done = trainer.fit_loop.epoch_loop.batch_progress.current.processed  # this epoch's, before now
            left = (trainer.max_steps - trainer.global_step) * trainer.accumulate_grad_batches
            total = min(total, done + left)
        return total

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items


class ModelSummary(RichModelSummary):
    """Lightning's rich model summary without its FLOPs, which count a forward of an example input
    that zoo's tasks do not define (so they always read 0; ``zoo.stats`` gives FLOPs per token), and
    without the train/eval mode of each module, and without the metric collections (no parameters;
    their values are in the progress bar and metrics.csv); the parameter counts on one line, a model
    split by trainer=tp counted whole (``WholeSummary``)."""

    def _summary(self, trainer: L.Trainer, pl_module: L.LightningModule) -> Any:
        if isinstance(trainer.strategy, DeepSpeedStrategy) and trainer.strategy.zero_stage_3:
            summary = super()._summary(trainer, pl_module)  # Lightning's summary of its partitioned weights
        else:
            summary = WholeSummary(pl_module, max_depth=self._max_depth)
        summary._layer_summary = {
            name: layer
            for name, layer in summary._layer_summary.items()
            if not isinstance(layer._module, Metric | MetricCollection)
        }
        return summary

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        from rich import get_console
        from rich.table import Table

        columns = [(name, values) for name, values in summary_data if name not in ("FLOPs", "Mode")]
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for name, _ in columns:
            table.add_column(
                name if name else " ",
                justify="right" if name == "Params" else "left",
                style="dim" if not name else None,
            )
        for row in zip(*(values for _, values in columns), strict=True):
            table.add_row(*row)
        console = get_console()
        console.print(table)
        frozen = total_parameters - trainable_parameters
        console.print(
            f"[bold]Parameters[/]: {get_human_readable_count(int(total_parameters))} "
            f"({get_human_readable_count(int(trainable_parameters))} trainable"
            + (f", {get_human_readable_count(int(frozen))} frozen" if frozen else "")
            + f"), {get_formatted_model_size(model_size)} MB"
        )


class WholeSummary(Summary):
    """Lightning's model summary with each layer's and the model's parameters counted as one process
    holds them unsplit (the strategy's ``local_parameter_count``): under trainer=tp, not this rank's
    share."""

    @property
    def param_nums(self) -> list[int]:
        count = strategy_of(self._model._trainer).local_parameter_count
        return [count(layer._module) for layer in self._layer_summary.values()]

    @property
    def total_parameters(self) -> int:
        return strategy_of(self._model._trainer).local_parameter_count(self._model)

    @property
    def trainable_parameters(self) -> int:
        return strategy_of(self._model._trainer).local_parameter_count(self._model, trainable_only=True)


UNWRITTEN_ROWS = "zoo_unwritten_metrics"
"""The checkpoint entry of the metrics rows a failed write left unwritten (written when the run resumes)."""


class CrashCheckpoint(L.Callback):
    """Saves ``<dirpath>/<filename>.ckpt`` when training stops on an exception or Ctrl-C after at
    least one optimizer step of this run; resume with ``ckpt_path=`` that file.

    Not Lightning's ``OnExceptionCheckpoint``: with that callback present, ``fit(ckpt_path=None)``
    means "resume from the last checkpoint found", so a new run in a directory that already holds
    one would silently continue it. Here a run resumes only when asked to. Nothing is saved when
    the run fails before its first step (a resume that cannot load must not replace the file it
    resumes from with an untrained model) or when it diverged (the weights would not help).

    Single-process runs only: in a distributed run an exception usually hits one process, and
    saving needs all of them (a barrier), so it would hang instead of failing. There the
    ``last.ckpt`` of the latest validation is the point to resume from.
    """

    def __init__(self, dirpath: str | os.PathLike, filename: str = "on_exception") -> None:
        self.path = os.path.join(os.fspath(dirpath), f"{filename}.ckpt")
        self.start_step: int | None = None
        self.saved: str | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start_step = trainer.global_step  # after a resume: the step it resumed at

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Keep the metrics rows a failed write left unwritten (tasks.run.loggers.CSVLogger) in the checkpoint,
        so that the resumed run writes them: every step's row once, none lost."""
        rows = [row for logger in trainer.loggers if isinstance(logger, CSVLogger) for row in logger.unwritten_rows()]
        if rows:
            checkpoint[UNWRITTEN_ROWS] = rows
        tracked = any(isinstance(c, ResumeState) for c in trainer.callbacks)  # it knows where the step is
        if crashing(trainer) and "loops" in checkpoint and not tracked:  # a batch under way is not kept; a
            done = trainer.global_step - 1 if trainer.validating else trainer.global_step  # validation is rerun
            at_boundary(checkpoint["loops"]["fit_loop"], trainer, unfinished_batches(trainer), done)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        rows = checkpoint.get(UNWRITTEN_ROWS)
        if rows:  # but for those the resumed run logs again (of the step a crash checkpoint is before)
            for logger in trainer.loggers:
                if isinstance(logger, CSVLogger):
                    logger.write_back(rows, checkpoint["global_step"], validation_again(checkpoint))

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, EndedOnPurpose) or trainer.world_size != 1:
            return  # an end on purpose (a pruned trial), or weights not worth resuming (diverged)
        if self.start_step is None or trainer.global_step <= self.start_step:
            return  # not a single step of this run: what it started from is still there
        try:
            for callback in trainer.callbacks:  # the checkpoint of a step whose update is done is of the state after it
                if isinstance(callback, ResumeState):
                    callback.end_the_update(trainer)
            trainer.save_checkpoint(self.path, weights_only=False)
        except Exception as error:  # a full disk, say: the error that stopped training is the one to report
            reason = " ".join(str(error).split())[:200]
            print(f"note: {self.path} could not be saved ({type(error).__name__}: {reason})")
            return
        self.saved = self.path


class ValidateAtTheEnd(L.Callback):
    """Ends training with a validation (and so with the checkpoints that follow it) when the last
    step is not a validation step: a run shorter than ``trainer.val_check_interval`` still has a
    best and a last checkpoint, and the last one resumes exactly (it is saved inside the loop, not
    after it, where Lightning counts the epoch as finished)."""

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if 0 < trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True  # Lightning validates when a run is asked to stop

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """A checkpoint written by this last validation counts the last step as logged, when the step is
        not one Lightning validates at anyway. Lightning counts a step for its loggers only after the
        validation that follows it; a restart from the checkpoint of a validation its interval asked for
        makes up for that, but not from one only the stop asked for (this one, at a step off the
        interval): a run that finished there, resumed with more steps, would log each row one step early."""
        stopping = trainer.validating and trainer.state.fn == "fit" and 0 < trainer.max_steps <= trainer.global_step
        state = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.state_dict", {})
        if stopping and "_batches_that_stepped" in state and not validates_by_interval(trainer):
            state["_batches_that_stepped"] = max(state["_batches_that_stepped"], trainer.global_step)


class StopOnNonFinite(L.Callback):
    """Stops training with a DivergedError when the loss or the gradients turn NaN or infinite, without
    making the host wait for the device at every step; no non-finite weights are ever saved.

    Each optimizer step folds the finiteness of its loss and of its gradients' norm into flags kept on
    the device, and a step whose flag is up does not change the weights: an optimizer that takes the
    gradient scaler's ``found_inf`` (fused AdamW) skips it on the device (weights, moments and step
    count unchanged); any other optimizer has the flag read at that step, before its update, and the
    run stops there, as it always did. The flags are read at the logging interval
    (``trainer.log_every_n_steps``, in the one read that also puts the training loss on the progress
    bar), before a validation's checkpoints and before any checkpoint is written (a crash checkpoint
    too): a run with fused AdamW stops at the first logging interval (or validation) after the step that
    diverged, naming that step, with the weights of the last finite step. The checkpoint writer refuses
    non-finite weights besides. Gradients are not checked under fp16 mixed precision, whose loss
    scaler skips such steps by design (a non-finite loss still stops the run).

    Args:
        monitor: the validated metric checkpoints follow (``monitor.metric``); a non-finite value
            stops the run before a checkpoint could be chosen as "best" on it.
    """

    def __init__(self, monitor: str | None = None) -> None:
        self.monitor = monitor
        self._flags: dict[str, torch.Tensor] = {}  # on the device: see _start
        self._start_step = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start(pl_module.device)
        self._start_step = trainer.global_step

    def _start(self, device: torch.device) -> None:
        """The device-side flags: a non-finite loss in this optimizer step, a non-finite loss or gradient
        norm since training started; the optimizer steps taken since then, and the first one that was not
        finite (0: none) with its loss."""
        zero = torch.zeros((), device=device)
        self._flags = {
            "step_loss_bad": zero.bool(),
            "loss_bad": zero.bool(),
            "grad_bad": zero.bool(),
            "steps": zero.long(),
            "first_bad": zero.long(),
            "first_loss": zero.float(),
            "step_loss": zero.float(),
        }

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        if not self._flags:
            self._start(loss.device)
        flags, loss = self._flags, loss.detach().float()
        bad = ~torch.isfinite(loss).all()
        flags["step_loss"] = torch.where(bad, loss.mean(), flags["step_loss"])  # the non-finite value to name
        flags["step_loss_bad"] = flags["step_loss_bad"] | bad

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        from lightning.fabric.plugins.precision.amp import _optimizer_handles_unscaling

        if not self._flags:
            self._start(pl_module.device)
        flags = self._flags
        fp16 = "16-mixed" in str(trainer.precision) and "bf16" not in str(trainer.precision)
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        grad_bad = torch.zeros_like(flags["grad_bad"])
        if grads and not fp16:
            grad_bad = ~torch.isfinite(torch.nn.utils.get_total_norm(grads))
        bad = flags["step_loss_bad"] | grad_bad
        flags["steps"] = flags["steps"] + 1
        new = bad & (flags["first_bad"] == 0)
        flags["first_bad"] = torch.where(new, flags["steps"], flags["first_bad"])
        flags["first_loss"] = torch.where(new, flags["step_loss"], flags["first_loss"])
        flags["loss_bad"] = flags["loss_bad"] | flags["step_loss_bad"]
        flags["grad_bad"] = flags["grad_bad"] | grad_bad
        flags["step_loss_bad"] = torch.zeros_like(bad)
        if not fp16 and _optimizer_handles_unscaling(optimizer):
            optimizer.found_inf = bad.float()  # the fused step skips itself on the device (GradScaler's protocol)
        else:
            self.check(trainer)  # no device-side skip: read now, before the update

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer._logger_connector.should_update_logs:  # Lightning's logging interval (LearningRateMonitor's test)
            self.check(trainer, show="train/loss")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self.check(trainer)  # before the checkpoint callbacks (Lightning runs them last): no NaN best or last
        value = trainer.callback_metrics.get(self.monitor) if self.monitor else None
        if value is not None and not torch.isfinite(value).all():
            raise DivergedError(_diverged(trainer, f"{self.monitor} is {float(value)}"))

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        self.check(trainer)  # any checkpoint: a crash checkpoint, one saved every n steps

    def check(self, trainer: L.Trainer, show: str | None = None) -> None:
        """Raise DivergedError when a step since training started was not finite: one read from the
        device, which also brings the logged metric ``show`` (the training loss) to the progress bar."""
        if not self._flags:
            return
        flags = self._flags
        shown = trainer.callback_metrics.get(show) if show else None
        value = flags["first_loss"].new_zeros(()) if shown is None else shown.detach().float().mean()
        value = torch.where(flags["first_bad"] > 0, torch.nan, value).item()  # the one host read
        if value == value:
            if shown is not None:
                trainer.progress_bar_metrics[show] = value
            return
        step = self._start_step + int(flags["first_bad"])
        what = "the gradient norm is not finite"
        if bool(flags["loss_bad"]):
            what = f"train/loss is {float(flags['first_loss'])}"
        raise DivergedError(_diverged(trainer, what, step))


def _diverged(trainer: L.Trainer, what: str, step: int | None = None) -> str:
    """The one line of a DivergedError: the step (default the current one), what was not finite, whether
    the weights still are, the checkpoint to go back to, and what to change."""
    from tasks.run.checkpoints import non_finite

    last = next(
        (
            c.best_model_path
            for c in trainer.checkpoint_callbacks
            if getattr(c, "monitor", "") is None and c.best_model_path
        ),
        None,
    )
    keep = f"the last checkpoint is {last}" if last else "no checkpoint was saved before it"
    bad = non_finite(trainer.lightning_module.state_dict())
    weights = f"the weights are no longer finite ({bad})" if bad else "stopped before the weights became NaN"
    return (
        f"training diverged at step {trainer.global_step + 1 if step is None else step}: {what}; {weights}; "
        f"{keep} (checkpoints of non-finite weights are never written). Lower optimizer.lr, raise "
        f"scheduler.warmup_steps or keep trainer.gradient_clip_val"
    )
