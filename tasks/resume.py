"""Exact resume: a run stopped at step k and resumed from its checkpoint repeats, bit for bit, the
steps an uninterrupted run takes after k.

Three things must come back: the weights and optimizer (Lightning), the place in the data
(``tasks.data.loading.ResumableLoader``, whose state Lightning keeps in the checkpoint), and the
global random states that dropout draws from (``ResumeState`` here).
"""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import numpy as np
import torch

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

    A checkpoint holds the state before the step that comes next. Saved between steps (at a
    validation, at the end of fit) that is the state as it is. Saved in the middle of a step (on an
    exception), the checkpoint is written as it stood before that step: the random states from the
    step's start, the train loader's position and Lightning's batch counts without its batch (which
    Lightning would otherwise count as read, so that validation and logged steps would come one
    batch early).

    In a distributed run each process gets its own states back (all are gathered when saving; a
    resume with another number of processes takes rank 0's).
    """

    def __init__(self) -> None:
        self._trainer: L.Trainer | None = None
        self._step_start: RngStates | None = None  # the states at the start of the step under way
        self._to_restore: list[RngStates] | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step_start = rng_states()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._step_start = None

    def state_dict(self) -> dict[str, Any]:
        mid_step = self._trainer is not None and unfinished_batches(self._trainer) > 0
        return {"rng": _all_processes(self._step_start if mid_step and self._step_start else rng_states())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._to_restore = list(state_dict["rng"])

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        unfinished = unfinished_batches(trainer)
        if unfinished > 0 and "loops" in checkpoint:
            before_the_step(checkpoint["loops"]["fit_loop"], unfinished)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._to_restore:
            states = self._to_restore
            set_rng_states(states[trainer.global_rank] if len(states) == trainer.world_size else states[0])
        self._to_restore = None


def unfinished_batches(trainer: L.Trainer) -> int:
    """Batches of this epoch read but whose step has not run (1 while a step is under way)."""
    progress = trainer.fit_loop.epoch_loop.batch_progress.current
    return progress.ready - progress.processed


def before_the_step(fit_loop: dict[str, Any], unfinished: int) -> None:
    """Rewrite a fit loop's saved state to the one before the unfinished step: as if its batch had
    not been read (the train loaders' position, Lightning's batch counts)."""
    for state in fit_loop.get("state_dict", {}).get("combined_loader", []):
        if isinstance(state, dict) and set(state) == {"epoch", "batches"}:  # a ResumableLoader's
            state["batches"] = max(0, state["batches"] - unfinished)
    progress = fit_loop["epoch_loop.batch_progress"]
    for counts in (progress["total"], progress["current"]):
        counts["ready"] = counts["started"] = counts["processed"]
    progress["is_last_batch"] = False
