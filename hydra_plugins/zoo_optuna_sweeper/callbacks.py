"""zoo-train's Hydra callbacks for sweeps (named in conf/hydra/default.yaml):

- ``TrialOfTheJob``: a job of a ``hydra/sweeper=zoo_optuna`` sweep learns its trial from what
  the sweeper wrote before launching it (the sweep directory's optimization_results.yaml: the
  study and its storage) and its job number (the trial's number). So the sweeper passes nothing
  through the job's overrides, and the launch lines show only what the user swept.
- ``SweepSummary``: a multirun (Optuna's or Hydra's grid) ends on its best trial.

Hydra imports this module at every start of every Hydra app (its plugin scan), so it imports only
Hydra; the report and Optuna are imported when a sweep is under way.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.zoo_optuna_sweeper._names import RESULTS, STORAGE_ENV, STUDY_ENV, TRIAL_ENV

SWEEPER = "hydra_plugins.zoo_optuna_sweeper.sweeper.ZooOptunaSweeper"


class TrialOfTheJob(Callback):
    """In a job of a zoo_optuna sweep, set the variables by which zoo-train finds its trial (and
    which the DDP processes Lightning starts from the job inherit): the study's storage and name,
    the trial's number, and that a job's error is the trial's failure (told by the sweeper)."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        hydra = config.hydra
        if hydra.mode != RunMode.MULTIRUN or OmegaConf.select(hydra, "sweeper._target_") != SWEEPER:
            return
        from hydra_plugins.zoo_optuna_sweeper._files import read_yaml
        from tasks.errors import RAISE_ERRORS_ENV  # zoo-train's side of the contract (not on the plugin scan)

        results = read_yaml(Path(str(hydra.sweep.dir)) / RESULTS, "start the sweep again")
        os.environ.update(
            {
                STORAGE_ENV: str(results["storage"]),
                STUDY_ENV: str(results["study_name"]),
                TRIAL_ENV: str(hydra.job.num),
                RAISE_ERRORS_ENV: "1",
            }
        )

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from tasks.errors import RAISE_ERRORS_ENV

        for key in (STORAGE_ENV, STUDY_ENV, TRIAL_ENV, RAISE_ERRORS_ENV):  # the next job in this process is its own
            os.environ.pop(key, None)


class SweepSummary(Callback):
    """After the last job of a ``zoo-train -m`` sweep, which trial won: its metric, its parameters and
    its run directory, read from the sweep directory as zoo-sweep-report reads it."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra_plugins.zoo_optuna_sweeper._files import SweepError
        from hydra_plugins.zoo_optuna_sweeper.report import read_sweep, summary

        folder = Path(str(config.hydra.sweep.dir)).absolute()
        try:
            lines = summary(read_sweep(folder))
        except (SweepError, OSError) as error:  # the sweep ran; only its summary is missing
            print(f"zoo: the sweep's best trial cannot be told ({error})", file=sys.stderr)
            return
        print("\n" + "\n".join(lines), flush=True)
