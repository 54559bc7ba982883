"""Exact resume: a run stopped at step k and resumed from its checkpoint repeats, bit for bit, the
steps an uninterrupted run takes after k.

Three things must come back: the weights and optimizer (Lightning), the place in the data
(``tasks.data.loading.ResumableLoader``, whose state Lightning keeps in the checkpoint), and the
global random states that dropout draws from (``ResumeState`` here).
"""

from __future__ import annotations

import random
import signal
import threading
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.trainer.states import TrainerStatus

RngStates = dict[str, Any]  # plain data and tensors: checkpoints stay loadable with weights_only=True


def rng_states() -> RngStates:
    """This process's global random states: torch (CPU, and the current CUDA device once CUDA is
    in use), Python's ``random`` and NumPy's legacy global generator."""
    version, state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states: RngStates = {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "state": list(state), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "keys": keys.tolist(),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def set_rng_states(states: RngStates) -> None:
    torch.set_rng_state(states["torch"])
    python = states["python"]
    random.setstate((python["version"], tuple(python["state"]), python["gauss"]))
    numpy = states["numpy"]
    np.random.set_state(
        (numpy["kind"], np.array(numpy["keys"], dtype=np.uint32), numpy["pos"], numpy["has_gauss"], numpy["cached"])
    )
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])


def _all_processes(states: RngStates) -> list[RngStates]:
    """Every process's states, in rank order (a collective: all processes save checkpoints together)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [states]
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, states)
    return gathered


class ResumeState(L.Callback):
    """Keeps the global random states in checkpoints and, in a run resumed from one, sets them back
    when training starts (after the sanity-check validation, before the first batch), so that
    dropout draws what it drew in the run that never stopped.

    A checkpoint holds the state at a step boundary, wherever an interrupt lands. Saved between steps
    (at a validation, at the end of fit) that is the state as it is. Saved on an exception or Ctrl-C in
    the middle of step k (``crash_layout``), it is one of two:

    - before step k, when its optimizer update has not been applied (in the loader's fetch, the
      forward or backward of any of its micro-batches): the random states from the step's start, the
      train loader's position and Lightning's batch counts without the step's batches (whose gradients
      are not kept);
    - after step k, when the update has been applied: what the step had left to do that the resumed
      run cannot redo is done first (``end_the_update``: its counts, the scheduler's step, its metrics
      row), and a validation that was due after it and had not ended is left for the resumed run to
      run whole (with the random states it started from).

    A checkpoint saved by a validation that comes inside a gradient accumulation window (last.ckpt, the best)
    is of the step boundary before the window too: no checkpoint keeps the window's first gradients, so the
    run resumed from it reads those micro-batches again and validates after them again, as the run that
    never stopped did.

    The optimizer's update itself is not interrupted by Ctrl-C: a SIGINT that comes while the weights
    are being written is held until the step's update is done (``on_train_batch_end``).

    In a distributed run each process gets its own states back (all are gathered when saving; a
    resume with another number of processes takes rank 0's).
    """

    def __init__(self) -> None:
        self._trainer: L.Trainer | None = None
        self._step_start: tuple[int, RngStates] | None = None  # (step, states at its first micro-batch)
        self._before_validation: tuple[int, RngStates] | None = None  # (step, states as its validation began)
        self._to_restore: list[RngStates] | None = None
        self._applied = -1  # the last step whose optimizer update is done (global steps count from 1)
        self._boundary = 0  # the batches read (all epochs) when the last update was done: the step boundary
        self._boundary_epoch: int | None = None  # the epoch (index) of the boundary's last batch
        self._validating: int | None = None  # the step whose validation is under way
        self._validated = -1  # the last step whose validation ended
        self._updating = False  # the weights are being written: a SIGINT waits
        self._held: int | None = None  # the signal that waits
        self._sigint: Any = None  # the SIGINT handler before training
        self._hooks: list[Any] = []

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer

    # ---- where the step is --------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._to_restore:
            states = self._to_restore
            set_rng_states(states[trainer.global_rank] if len(states) == trainer.world_size else states[0])
        self._to_restore = None
        self._applied = trainer.global_step
        self._boundary = trainer.fit_loop.epoch_loop.batch_progress.total.processed
        self._boundary_epoch = None  # known at this run's first update (a crash checkpoint comes after one)
        self._hooks = []
        for optimizer in trainer.optimizers:  # first of the optimizer's hooks: the update is known done before any
            self._hooks.append(optimizer.register_step_post_hook(self._update_done))  # other hook could fail
            optimizer._optimizer_step_post_hooks.move_to_end(self._hooks[-1].id, last=False)
        if threading.current_thread() is threading.main_thread():
            self._sigint = signal.signal(signal.SIGINT, self._on_sigint)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._release()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._release()

    def _release(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._sigint is not None and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGINT) == self._on_sigint:
                signal.signal(signal.SIGINT, self._sigint)
            self._sigint = None

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self._updating:
            self._held = signum
            return
        previous = self._sigint
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step + 1
        if self._step_start is None or self._step_start[0] != step:  # the step's first micro-batch
            self._step_start = (step, rng_states())

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        self._updating = True  # from here to the update's end a SIGINT waits

    def _update_done(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._trainer is not None:  # Lightning counts the step once this returns
            self._applied = self._trainer.global_step + 1
            self._boundary = self._trainer.fit_loop.epoch_loop.batch_progress.total.ready
            self._boundary_epoch = self._trainer.current_epoch

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._updating = False
        if self._held is not None:
            self._held = None
            raise KeyboardInterrupt  # the Ctrl-C that came during the update, now that the step is counted

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validating = trainer.global_step
            self._before_validation = (trainer.global_step, rng_states())

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validating, self._validated = None, trainer.global_step

    # ---- what a checkpoint holds --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"rng": _all_processes(self._states_to_save())}

    def _states_to_save(self) -> RngStates:
        trainer = self._trainer
        if trainer is None or not (crashing(trainer) or self._inside_window(trainer)):
            return rng_states()
        if self._rolled_back(trainer):
            if self._step_start and self._step_start[0] == trainer.global_step + 1:
                return self._step_start[1]  # before the step: its draws are made again
            return rng_states()  # nothing of the step has drawn yet
        if self._validating == trainer.global_step and self._before_validation:
            return self._before_validation[1]  # the validation is run again, whole
        return rng_states()

    def _rolled_back(self, trainer: L.Trainer) -> bool:
        """Whether a crash checkpoint now holds the state before the step under way (its update not done)."""
        return trainer.fit_loop.epoch_loop.batch_progress.total.ready > self._boundary

    def _inside_window(self, trainer: L.Trainer) -> bool:
        """Whether a checkpoint is saved by a validation that came inside a gradient accumulation window (a
        ``trainer.val_check_interval`` that the window does not divide): batches read that no update used."""
        return trainer.validating and not trainer.sanity_checking and self._rolled_back(trainer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._to_restore = list(state_dict["rng"])

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """A crash checkpoint, and one of a validation inside an accumulation window (whose first micro-batches'
        gradients no checkpoint keeps), hold the state at the step boundary before them: the resumed run reads
        those micro-batches again, and runs that validation again after the same one (Lightning's interval)."""
        if (crashing(trainer) or self._inside_window(trainer)) and "loops" in checkpoint:
            progress = trainer.fit_loop.epoch_loop.batch_progress
            unread = progress.total.ready - self._boundary if self._rolled_back(trainer) else 0
            at_boundary(checkpoint["loops"]["fit_loop"], trainer, unread, self._validated, self._boundary_epoch)
        elif trainer.validating and not trainer.sanity_checking and "loops" in checkpoint:
            validation_ended(checkpoint["loops"]["fit_loop"])

    def end_the_update(self, trainer: L.Trainer) -> None:
        """Before a crash checkpoint of a step whose update is done: what Lightning does after the update
        and before the step's validation (count the update and the batch, step the scheduler, log the
        step's metrics row), so that the checkpoint is the state after that step."""
        loop = trainer.fit_loop.epoch_loop
        progress = loop.batch_progress
        if self._boundary != progress.total.ready:
            return  # the step under way has not been updated: the checkpoint is of the state before it
        if self._applied > trainer.global_step:  # the update ran and Lightning has not counted it: count it
            loop.automatic_optimization.optim_progress.optimizer.step.increment_completed()  # (trainer.global_step)
        if progress.current.processed < progress.current.ready:
            progress.increment_processed()
            loop.update_lr_schedulers("step", update_plateau_schedulers=False)
        if progress.current.completed < progress.current.processed:
            progress.increment_completed()
            trainer._logger_connector.update_train_step_metrics()  # the step's row (its loss, its rate)


def crashing(trainer: L.Trainer) -> bool:
    """Whether the checkpoint being written is one of an exception or interrupt (CrashCheckpoint's)."""
    return trainer.state.status == TrainerStatus.INTERRUPTED


def at_boundary(
    fit_loop: dict[str, Any], trainer: L.Trainer, unread: int, validated: int, epoch: int | None = None
) -> None:
    """Rewrite a crash checkpoint's fit loop state (``fit_loop``) to the step boundary it resumes from, in the
    form Lightning writes at a validation's end (every batch read is completed), which it resumes right:

    - ``unread``: the batches of the step under way, whose update was not done, are taken back (the train
      loaders' position, Lightning's batch counts);
    - the loaders' position is the batches completed (a batch a fetch had counted and not handed out is read
      again);
    - a boundary at an epoch's last batch is the next epoch's start, with ``epoch`` + 1 epochs done (``epoch``:
      the index of the boundary's epoch; None: the one under way), however far Lightning had gone in ending that
      epoch or starting the next (a SIGTERM stops it only once the epoch is counted done), unless the validation
      after that batch is run again first (below): that validation belongs to the epoch, which Lightning ends
      after it;
    - when Lightning validates after the boundary's batch (by its own rule, as a restart applies it) and the
      validation after step ``trainer.global_step`` had not ended (``validated``), the checkpoint asks for
      it: the resumed run runs it whole before the next step; a restart there counts the step for the
      loggers once the validation is done (Lightning's ``_batches_that_stepped``).
    """
    progress = fit_loop["epoch_loop.batch_progress"]
    done = progress["current"]["ready"] - unread
    for counts, shift in ((progress["total"], unread), (progress["current"], unread)):
        read = counts["ready"] - shift
        counts["ready"] = counts["started"] = counts["processed"] = counts["completed"] = read
    if unread:
        progress["is_last_batch"] = False
    step = trainer.global_step
    due = _validates_after(trainer, progress)
    again = due and validated < step  # the validation after the step is run again, first
    # the epoch's last step: the checkpoint is at the next epoch's start, unless the validation after that step
    # is run again first: it belongs to the epoch (its rows carry it), which Lightning ends after it
    next_epoch = done >= trainer.num_training_batches and not again
    if next_epoch:  # as Lightning has it at a new epoch's first batch (which it resumes right), none read
        epochs = fit_loop["epoch_progress"]
        if epoch is None:
            epoch = epochs["current"]["processed"]
        ended = epoch + 1 - epochs["current"]["processed"]  # the epoch's end, unless Lightning had counted it
        for counts in (epochs["total"], epochs["current"]):
            finished = counts["processed"] + ended
            counts.update(ready=finished + 1, started=finished + 1, processed=finished, completed=finished)
        progress["current"].update(ready=0, started=0, processed=0, completed=0)
        progress["is_last_batch"] = False
        for name in ("epoch_loop.scheduler_progress", "epoch_loop.automatic_optimization.optim_progress"):
            _zero_current(fit_loop.get(name, {}))
    steps = fit_loop.get("epoch_loop.automatic_optimization.optim_progress", {}).get("optimizer", {}).get("step", {})
    for counts in steps.values():  # an update begun and not done (a crash in its closure) is not one to count
        counts["ready"] = counts["completed"]  # later: a restart keeps Lightning's count of updates begun
    for state in fit_loop.get("state_dict", {}).get("combined_loader", []):
        if isinstance(state, dict) and set(state) == {"epoch", "batches"}:  # a ResumableLoader's
            state.update(epoch=state["epoch"] + 1, batches=0) if next_epoch else state.update(batches=done)
    fit_loop["epoch_loop.state_dict"]["_batches_that_stepped"] = step - 1 if due else step
    if again:  # Lightning's "restarted mid-evaluation", with no batch of it done
        val = fit_loop["epoch_loop.val_loop.batch_progress"]
        before = val["total"]["completed"] - (val["current"]["completed"] if trainer.validating else 0)
        val["total"].update(ready=before + 1, started=before + 1, processed=before, completed=before)
        val["current"].update(ready=1, started=1, processed=0, completed=0)
        val["is_last_batch"] = False


def validation_ended(fit_loop: dict[str, Any]) -> None:
    """A validation's checkpoint (last.ckpt, the best) counts every validation batch read as done, as Lightning
    writes it after a validation it ran from the start. The validation that a resumed run runs again first
    (``at_boundary``'s "restarted mid-evaluation") would otherwise leave its one batch started and never
    processed in them, and a run resumed from them would run that validation once more, from its middle."""
    for counts in fit_loop["epoch_loop.val_loop.batch_progress"].values():
        if isinstance(counts, dict):
            counts.update(ready=counts["completed"], started=counts["completed"], processed=counts["completed"])


def validation_again(checkpoint: dict[str, Any]) -> bool:
    """Whether a run resumed from ``checkpoint`` starts with the validation after its step, run again whole:
    the validation progress ``at_boundary`` writes for a validation an interrupt stopped (Lightning's
    "restarted mid-evaluation": one batch started, none processed)."""
    fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
    total = fit_loop.get("epoch_loop.val_loop.batch_progress", {}).get("total")
    if not total:
        return False
    started = total["started"]
    return total["ready"] == started and total["processed"] == started - 1 == total["completed"]


def _zero_current(progress: dict[str, Any]) -> None:
    """The ``current`` counts (this epoch's) of a saved progress, nested or not, set to 0."""
    for key, value in progress.items():
        if key == "current" and isinstance(value, dict):
            value.update(dict.fromkeys(value, 0))
        elif isinstance(value, dict):
            _zero_current(value)


def _validates_after(trainer: L.Trainer, progress: dict[str, Any]) -> bool:
    """Whether Lightning validates after the last batch that ``progress`` (a saved batch progress) counts:
    its own rule (``validates_by_interval``) on those counts, as a restart from them applies it."""
    live = trainer.fit_loop.epoch_loop.batch_progress
    saved = live.state_dict()
    live.load_state_dict(progress)
    try:
        return validates_by_interval(trainer)
    finally:
        live.load_state_dict(saved)


def validates_by_interval(trainer: L.Trainer) -> bool:
    """Whether Lightning would validate after the current batch if no stop were asked: its own rule, the one
    a restart from a checkpoint saved there applies."""
    loop, asked = trainer.fit_loop.epoch_loop, trainer.should_stop
    trainer.should_stop = False
    try:
        return bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher))
    finally:
        trainer.should_stop = asked


def unfinished_batches(trainer: L.Trainer) -> int:
    """Batches of this epoch read but whose step has not run (1 while a step is under way)."""
    progress = trainer.fit_loop.epoch_loop.batch_progress.current
    return progress.ready - progress.processed
