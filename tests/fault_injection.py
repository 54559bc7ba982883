"""Fault injection for the exact-resume tests (tests/test_resume_anywhere.py): an interrupt that lands at a
chosen phase of a chosen optimizer step, by a raised KeyboardInterrupt (what SIGINT becomes) or a signal
the process sends itself.

The fault is a callback added to the trainer by ``injected`` (a patch of ``tasks.cli.train.training.build_trainer``),
not by the config: the run's stored config stays zoo's own, so ``zoo-train resume=<run dir>`` (which refuses
a ``_target_`` that conf/ does not name) resumes it without the fault.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import torch

PHASES = (
    "setup",  # as the attempt is set up, before a checkpoint is restored or a batch read (any step: 0)
    "epoch_start",  # as the epoch whose first step it is starts, before its first batch is read
    "fetch",  # inside the train loader's fetch of the step's (last) batch, before it is handed out
    "forward",  # before the forward of the step's last micro-batch (its earlier ones have their gradients)
    "backward",  # inside the backward of the step's last micro-batch
    "update",  # after the optimizer's update, before Lightning counts the step
    "batch_end",  # after the step is counted and the scheduler stepped, before its row is logged
    "epoch_end",  # inside the end of the epoch whose last step it is (the epoch counted as run, not yet as done)
    "validation",  # inside the validation after the step (after its first batch)
    "checkpoint",  # inside the save of the validation's checkpoint
)
HOW = {"raise": None, "sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}


class Fault(L.Callback):
    """Interrupts step ``step`` (the step-th optimizer step) at ``phase`` (:data:`PHASES`), ``how`` (:data:`HOW`):
    "raise" raises KeyboardInterrupt there, a signal is sent to this process there (and lands at the next
    bytecode, as a real one does)."""

    def __init__(self, phase: str, step: int, how: str = "raise") -> None:
        if phase not in PHASES or how not in HOW:
            raise ValueError(f"fault {phase}/{how}: phases {PHASES}, ways {tuple(HOW)}")
        self.phase, self.step, self.how = phase, step, how
        self.fired = False

    def _fire(self) -> None:
        if self.fired:
            return
        self.fired = True
        if HOW[self.how] is None:
            raise KeyboardInterrupt(f"fault {self.phase} at step {self.step}")
        os.kill(os.getpid(), HOW[self.how])

    @staticmethod
    def _last_micro_batch(trainer: L.Trainer) -> bool:
        """Whether the batch under way (read, counted ready) is the last of its optimizer step."""
        return trainer.fit_loop.epoch_loop.batch_progress.current.ready % trainer.accumulate_grad_batches == 0

    def _this_step(self, trainer: L.Trainer) -> bool:  # the step under way is the step-th
        return trainer.global_step + 1 == self.step

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loader = trainer.train_dataloader
        collate = loader.collate_fn
        accumulate = trainer.accumulate_grad_batches

        def fetch(items: Any) -> Any:  # called for the batch about to be handed out (ready not yet counted)
            ready = trainer.fit_loop.epoch_loop.batch_progress.current.ready
            if self.phase == "fetch" and self._this_step(trainer) and (ready + 1) % accumulate == 0:
                self._fire()
            return collate(items)

        loader.collate_fn = fetch  # the loader's iterator takes it when the epoch starts (at its first batch)
        for optimizer in trainer.optimizers:
            optimizer.register_step_post_hook(self._after_update)

    def _after_update(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        trainer = self._trainer
        if self.phase == "update" and self._this_step(trainer):
            self._fire()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer
        if self.phase == "setup":
            self._fire()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.phase == "forward" and self._this_step(trainer) and self._last_micro_batch(trainer):
            self._fire()

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        if self.phase == "backward" and self._this_step(trainer) and self._last_micro_batch(trainer):

            def inside(grad: torch.Tensor) -> torch.Tensor:
                self._fire()
                return grad

            loss.register_hook(inside)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.phase == "batch_end" and trainer.global_step == self.step and self._last_micro_batch(trainer):
            self._fire()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.phase == "epoch_start" and self._this_step(trainer):
            self._fire()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.phase == "epoch_end" and trainer.global_step == self.step:
            self._fire()

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        at_step = not trainer.sanity_checking and trainer.global_step == self.step
        if self.phase == "validation" and at_step and batch_idx == 0:  # the first batch's outputs are lost with it
            self._fire()

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.phase == "checkpoint" and trainer.global_step == self.step and trainer.validating:
            self._fire()


def from_env(value: str) -> Fault:
    """A Fault from ``phase:step:how`` (the ZOO_TEST_FAULT variable of a zoo-train subprocess)."""
    phase, step, how = value.split(":")
    return Fault(phase, int(step), how)


@contextlib.contextmanager
def injected(fault: Fault | None) -> Iterator[None]:
    """zoo-train's trainer, in this process, with ``fault`` among its callbacks (none: unchanged). SIGINT's
    handler is put back afterwards (Lightning ignores it once it has seen a KeyboardInterrupt)."""
    import tasks.cli.train.training as training

    original: Callable[..., L.Trainer] = training.build_trainer
    handler = signal.getsignal(signal.SIGINT)

    def build_trainer(cfg: Any, plan: Any) -> L.Trainer:
        trainer = original(cfg, plan)
        if fault is not None:
            trainer.callbacks.insert(0, fault)
        return trainer

    training.build_trainer = build_trainer
    try:
        yield
    finally:
        training.build_trainer = original
        signal.signal(signal.SIGINT, handler)


def main() -> None:
    """zoo-train with the fault ZOO_TEST_FAULT names (``python -m fault_injection <zoo-train arguments>``
    with tests/ on PYTHONPATH): a subprocess that a real signal (SIGKILL too) ends."""
    from tasks.cli.verbs import train as zoo_train

    fault = from_env(os.environ["ZOO_TEST_FAULT"]) if os.environ.get("ZOO_TEST_FAULT") else None
    with injected(fault):
        zoo_train()


if __name__ == "__main__":
    main()
