"""Experiment trackers as loggers: MLflow (``logger=mlflow``) and Weights & Biases (``logger=wandb``),
each beside the run's ``metrics.csv`` (conf/logger/ composes them with ``csv``).

What both log: the run's resolved ``config.yaml`` (zoo's, not the task's hyperparameters, which hold a
tokenizer), flattened as parameters; every logged row, numbered as ``metrics.csv`` numbers it (the
optimizer steps taken, ``tasks.run.loggers.zoo_step``); the run directory and the command's overrides.
A grid or an Optuna sweep groups its jobs (one MLflow experiment, or one W&B group, per sweep folder).

A resumed run continues the same tracked run: its id is kept in the run directory
(``mlflow.json``, ``wandb.json``), written when the run is first tracked and read on resume (an id
only: nothing in it is a path or code). Steps the interrupted attempt logged after its checkpoint are
logged again by the resume, as ``metrics.csv``'s are; a tracker keeps both values of such a step in
its history (``metrics.csv`` keeps the resumed one).
"""

from __future__ import annotations

import importlib.util
import json
import re
import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, ClassVar

from hydra.utils import get_class, instantiate
from lightning.pytorch.loggers import MLFlowLogger as LightningMLFlowLogger
from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from tasks.errors import EndedOnPurpose, UserError
from tasks.run.loggers import zoo_step
from tasks.run.run_dirs import sweep_folder
from zoo.io import atomic_write_text

RUN_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")
PARAM_CHARS = 6000  # MLflow's longest parameter value (and plenty for W&B's config)


def run_config(run_dir: Path) -> dict[str, Any]:
    """The run's resolved config (``<run dir>/config.yaml``, written before training starts), flattened
    to ``{"model.n_layers": 2, …}``; empty when the run has none (yet)."""
    path = run_dir / "config.yaml"
    return flattened(OmegaConf.to_container(OmegaConf.load(path), resolve=False)) if path.is_file() else {}


def flattened(config: Any) -> dict[str, Any]:
    """A nested config as ``{"model.n_layers": 2, …}``."""
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
        else:
            flat[prefix] = node

    walk(config, "")
    return flat


def overrides(run_dir: Path) -> str:
    """The command line's overrides of the run (Hydra's record of it), as one string."""
    path = run_dir / ".hydra" / "overrides.yaml"
    return " ".join(str(o) for o in OmegaConf.load(path)) if path.is_file() else ""


def known_run(record: Path, where: str) -> str | None:
    """The tracked run's id this run directory recorded for the store ``where``; None when it has none
    (a new run, or a run first tracked elsewhere)."""
    if not record.is_file():
        return None
    try:
        kept = json.loads(record.read_text(encoding="utf-8"))
        run_id = kept["run_id"] if kept.get("where") == where else None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise UserError(f"{record}: not a run record zoo wrote; move it away to start a new tracked run") from None
    if run_id is not None and not (isinstance(run_id, str) and RUN_ID.fullmatch(run_id)):
        raise UserError(f"{record}: its run_id is not an id; move it away to start a new tracked run")
    return run_id


def how_it_ended(status: str) -> tuple[str, str]:
    """The tracker's word for how a run ended, and why: Lightning says only success or failed, so the
    exception being handled (it calls ``finalize`` inside its ``except``) tells a Ctrl-C or a run
    stopped on purpose (a pruned trial, a diverged loss) from a failure."""
    error = sys.exc_info()[1]
    if status != "failed" or error is None:
        return "FINISHED", "finished"
    if isinstance(error, KeyboardInterrupt):
        return "KILLED", "interrupted"
    if isinstance(error, EndedOnPurpose):
        return "KILLED", type(error).__name__
    return "FAILED", type(error).__name__


class Tracker:
    """A logger that keeps runs in a store of its own (MLflow, W&B), from the package ``package`` (the
    ``tracking`` extra). ``log_config`` logs a flattened config as the run's parameters; ``finalize`` says
    how the run ended (``how_it_ended``)."""

    package: ClassVar[str]

    @classmethod
    def check_installed(cls, key: str) -> None:
        """Refuse ``logger.<key>`` in one line, before any data is read, where its package is missing."""
        if importlib.util.find_spec(cls.package) is None:
            raise UserError(
                f"logger.{key} needs the package {cls.package}, which is not installed: "
                f'pip install "zoo[tracking]" (or pip install {cls.package}), or choose another logger'
            )

    def log_config(self, config: dict[str, Any]) -> None:
        raise NotImplementedError


def track_refusal(cfg: DictConfig) -> None:
    """Called where a sweep's job is refused before its trainer exists (a sampled combination the model
    cannot take), inside the ``except``: the job is still a run in each tracker it asked for, FAILED with
    the error's name and the job's composed config, so the sweep's experiment shows every trial. A single
    run refused at its checks is not tracked: it never started."""
    if sweep_folder() is None:
        return
    for node in (cfg.get("logger") or {}).values():
        with suppress(Exception):  # best effort: the job's own error is what the sweep records
            if node and "_target_" in node and issubclass(get_class(node._target_), Tracker):
                tracker = instantiate(node)
                tracker.log_config(flattened(OmegaConf.to_container(cfg, resolve=False)))
                tracker.finalize("failed")  # inside the caller's except: FAILED with the error's name


@contextmanager
def refusals_tracked(cfg: DictConfig) -> Iterator[None]:
    """``track_refusal`` for an error raised inside."""
    try:
        yield
    except Exception:
        track_refusal(cfg)
        raise


class MLflowLogger(Tracker, LightningMLFlowLogger):
    """Lightning's MLflow logger, tracking a zoo run: an experiment per task (per sweep folder for a
    ``-m`` job), a run per run directory (the same run on resume), the resolved config as parameters
    and ``config.yaml`` as an artifact, tags ``zoo.run_dir``, ``zoo.overrides`` (and ``zoo.sweep_dir``,
    ``zoo.ended``). Checkpoints are logged as artifacts only with ``log_checkpoints=true``."""

    RECORD, package = "mlflow.json", "mlflow"

    def __init__(
        self, *, run_dir: str, tracking_uri: str, experiment: str, artifacts: str, log_checkpoints: bool = False
    ) -> None:
        self.run_dir = Path(run_dir)
        self.resumed_id = known_run(self.run_dir / self.RECORD, tracking_uri)
        sweep = sweep_folder()
        tags = {"zoo.run_dir": str(self.run_dir), "zoo.overrides": overrides(self.run_dir)}
        if sweep is not None:
            tags["zoo.sweep_dir"] = str(sweep)
        super().__init__(
            experiment_name=experiment if sweep is None else f"{experiment} {sweep.name}",
            run_name=self.run_dir.name if sweep is None else f"{sweep.name}/{self.run_dir.name}",
            tracking_uri=tracking_uri,
            tags=tags,
            artifact_location=artifacts,
            log_model=log_checkpoints,
            run_id=self.resumed_id,
        )

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        """The run's resolved config (not Lightning's ``params``); on resume, only keys the run lacks (an
        MLflow parameter cannot change: a changed value is kept as a ``zoo.resumed.<key>`` tag)."""
        self.log_config(run_config(self.run_dir))

    def log_config(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param, RunTag

        client, run_id = self.experiment, self.run_id
        config = {k: str(v)[:PARAM_CHARS] for k, v in config.items()}
        have: dict[str, str] = {}
        if self.resumed_id:
            client.update_run(run_id, status="RUNNING")
            have = client.get_run(run_id).data.params
            changed = [RunTag(f"zoo.resumed.{k}", v) for k, v in config.items() if k in have and have[k] != v]
            client.log_batch(run_id, tags=[RunTag("zoo.resumed_with", overrides_of_resume(self.run_dir)), *changed])
        new = [Param(k, v) for k, v in config.items() if k not in have]
        for start in range(0, len(new), 100):  # MLflow takes 100 parameters a call
            client.log_batch(run_id, params=new[start : start + 100])
        if (self.run_dir / "config.yaml").is_file():
            client.log_artifact(run_id, str(self.run_dir / "config.yaml"))
        atomic_write_text(self.run_dir / self.RECORD, json.dumps({"where": self._tracking_uri, "run_id": run_id}))

    @rank_zero_only
    def log_metrics(self, metrics: Any, step: int | None = None) -> None:
        super().log_metrics(metrics, zoo_step(metrics, step))

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        ended, why = how_it_ended(status)
        if self._initialized:
            self.experiment.set_tag(self.run_id, "zoo.ended", why)
        super().finalize(ended)


class WandbLogger(Tracker, LightningWandbLogger):
    """Lightning's W&B logger, tracking a zoo run: offline unless ``mode=online``, its files in the run
    directory, a project per task, a group per sweep folder, the same W&B run on resume (its id kept in
    ``wandb.json``), the resolved config as the run's config."""

    RECORD, package = "wandb.json", "wandb"

    def __init__(self, *, run_dir: str, project: str, mode: str = "offline", **kwargs: Any) -> None:
        if mode not in ("offline", "online"):
            raise UserError(f"logger.wandb.mode={mode!r} must be offline or online")
        self.run_dir = Path(run_dir)
        run_id = known_run(self.run_dir / self.RECORD, mode) or _new_wandb_id()
        sweep = sweep_folder()
        super().__init__(
            project=project,
            save_dir=str(self.run_dir),
            offline=mode == "offline",
            id=run_id,
            resume="allow",
            name=self.run_dir.name,
            group=None if sweep is None else sweep.name,
            notes=overrides(self.run_dir),
            **kwargs,
        )
        self._wandb_init.pop("anonymous", None)  # Lightning passes it always; W&B warns that it is gone
        self.mode, self.run_id = mode, run_id

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        """The run's resolved config (not Lightning's ``params``), and where the run lives."""
        self.log_config(run_config(self.run_dir))

    def log_config(self, config: dict[str, Any]) -> None:
        plain = (int, float, bool, type(None))
        config = {k: v if isinstance(v, plain) else str(v)[:PARAM_CHARS] for k, v in config.items()}
        config["zoo.run_dir"] = str(self.run_dir)
        self.experiment.config.update(config, allow_val_change=True)
        atomic_write_text(self.run_dir / self.RECORD, json.dumps({"where": self.mode, "run_id": self.run_id}))

    @rank_zero_only
    def log_metrics(self, metrics: Any, step: int | None = None) -> None:
        super().log_metrics(metrics, zoo_step(metrics, step))

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        """How the run ended, in its summary (``zoo.ended``); W&B closes the run when the process ends."""
        if self._experiment is not None:
            self.experiment.summary["zoo.ended"] = how_it_ended(status)[1]
        super().finalize(status)


def overrides_of_resume(run_dir: Path) -> str:
    """The overrides of the latest command that resumed the run (Hydra's record in ``.hydra/resume*``)."""
    records = sorted((run_dir / ".hydra").glob("resume*/overrides.yaml"), key=lambda p: p.stat().st_mtime)
    return " ".join(str(o) for o in OmegaConf.load(records[-1])) if records else ""


def _new_wandb_id() -> str:
    """A new W&B run id (8 lowercase characters, as W&B makes its own)."""
    return secrets.token_hex(4)
