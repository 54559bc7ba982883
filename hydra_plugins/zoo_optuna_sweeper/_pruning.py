"""The Lightning callback through which a job of a ``zoo_optuna`` sweep reports to its trial (named
in conf/callbacks/default.yaml). It imports Lightning, so the leading underscore keeps Hydra's plugin
scan from importing it at every start of every Hydra app."""

from __future__ import annotations

import os
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from hydra_plugins.zoo_optuna_sweeper.sweeper import TRIAL_ENV, trial_of_this_job


class OptunaPruning(L.Callback):
    """In a job of a ``hydra/sweeper=zoo_optuna`` sweep: reports ``monitor`` to the job's Optuna
    trial after each validation (at ``trainer.global_step``, the step of its row in metrics.csv and
    of its checkpoint's name) and, when the study's pruner says so, stops the run with
    ``optuna.TrialPruned``, which the sweeper records as a PRUNED trial. Outside such a sweep it does
    nothing.

    In a distributed run the global rank 0 talks to Optuna and tells the other ranks its decision,
    so that all of them stop together. The processes Lightning starts for the other ranks raise
    ``PrunedOnARankAbove0`` instead, which zoo-train ends quietly: only the job's own process
    reports to the sweeper, and Lightning kills it when a process it started fails.

    Args:
        monitor: the logged metric the study optimizes (``monitor.metric``).
    """

    def __init__(self, monitor: str) -> None:
        self.monitor = monitor
        self.in_sweep = False
        self.trial: Any = None  # optuna.trial.Trial on rank 0 of a trial's job

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.in_sweep = stage == "fit" and TRIAL_ENV in os.environ  # the same on every rank (inherited)
        if self.in_sweep and trainer.is_global_zero:
            self.trial = trial_of_this_job()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or not self.in_sweep:
            return
        prune, value = False, trainer.callback_metrics.get(self.monitor)
        if self.trial is not None and value is not None:
            self.trial.report(float(value), step=trainer.global_step)
            prune = self.trial.should_prune()
        if trainer.strategy.broadcast(prune, src=0):
            from hydra_plugins.zoo_optuna_sweeper._study import Pruned, PrunedOnARankAbove0

            pruned = Pruned if in_the_jobs_process() else PrunedOnARankAbove0
            raise pruned(
                f"at step {trainer.global_step}: {self.monitor}={'?' if value is None else f'{float(value):.4f}'}"
            )


def in_the_jobs_process() -> bool:
    """Whether this process runs the sweep's job itself (Hydra's multirun mode), not one that
    Lightning started for another DDP rank of it (a single run: see relaunch_as_this_job in
    tasks/cli/train/training.py)."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
