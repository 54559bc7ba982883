"""Every console verb's entry point (``[project.scripts]`` in pyproject.toml). Hydra composes the
verb's config here and refuses what it cannot compose (a typo in a group or a key, a value of the
wrong type; for zoo-train also a value out of range and a model its own rules refuse,
``tasks.cli.values``) in one line before the verb's own module is imported, and with it Lightning
and the tasks: seconds a typo does not wait for. Each verb's work is ``run(cfg)`` in its package,
which never imports this module: ``train/training.py``, ``evaluate/``, ``generate/``,
``export/exporting.py``, ``attention/maps.py``; each package's ``__main__.py`` is its
``python -m tasks.cli.<verb>``."""

from __future__ import annotations

import os
import sys
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from tasks.cli.boundary import hydra_errors, user_errors
from tasks.cli.console import quote_free_text
from tasks.cli.schemas import conf_dir, register_configs, register_data_schemas
from tasks.cli.values import check_model, check_values
from tasks.errors import RAISE_ERRORS_ENV
from tasks.run.run_dirs import evals_dir, sweep_folder


def train() -> float | None:
    """zoo-train: register what its config needs (not on import), then let Hydra compose and run."""
    register_configs()
    return _train()


@hydra_errors
@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="train")
def _train(cfg: DictConfig) -> float | None:
    # a sweeper's job raises what ends it (the sweeper records the trial's failure); else one line
    return (_train_job if os.environ.get(RAISE_ERRORS_ENV) else user_errors(_train_job))(cfg)


def _train_job(cfg: DictConfig) -> float | None:
    try:
        check_values(cfg)  # the values a run would trip on later (tasks.cli.values): before Lightning too
        if not (cfg.get("init_from") or cfg.get("resume")):  # else the model is the source's or the run's
            check_model(cfg)  # the model's own rules (ModelConfig.validate): as fast as a typo
    except Exception:
        if sweep_folder() is not None:  # a sweep's job refused here is still a FAILED run in its trackers
            from tasks.run.trackers import track_refusal  # (Lightning's loggers: not loaded for a typo)

            track_refusal(cfg)
        raise
    from tasks.cli.train.training import run  # a Ctrl-C while it loads is "zoo: interrupted" too

    return run(cfg)


def evaluate() -> dict[str, float]:
    """zoo-eval: the data schemas that ``+data=<name>`` composes and the resolver that puts its
    directory beside the checkpoint (``evals_dir``), then Hydra."""
    register_data_schemas()
    if not OmegaConf.has_resolver("eval_dir"):
        OmegaConf.register_new_resolver("eval_dir", evals_dir)
    return _evaluate()


@hydra_errors
@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="eval")
@user_errors  # a Ctrl-C while the verb's module loads: one line, exit 130
def _evaluate(cfg: DictConfig) -> dict[str, float]:
    from tasks.cli.evaluate import run

    return run(cfg)


def generate() -> str:
    """zoo-generate: ``prompt=`` passes through the shell and Hydra's grammar unchanged."""
    sys.argv = [sys.argv[0], *quote_free_text(sys.argv[1:])]
    return _generate()


@hydra_errors
@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="generate")
@user_errors  # a Ctrl-C while the verb's module loads: one line, exit 130
def _generate(cfg: DictConfig) -> str:
    from tasks.cli.generate import run

    return run(cfg)


@hydra_errors
@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="export")
@user_errors  # a Ctrl-C while the verb's module loads: one line, exit 130
def export(cfg: DictConfig) -> float:
    """zoo-export."""
    from tasks.cli.export.exporting import run

    return run(cfg)


def attention() -> dict[str, Any]:
    """zoo-attention: ``prompt=``, ``text=`` and ``target=`` pass through unchanged."""
    sys.argv = [sys.argv[0], *quote_free_text(sys.argv[1:], keys=("prompt", "text", "target"))]
    return _attention()


@hydra_errors
@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="attention")
@user_errors  # a Ctrl-C while the verb's module loads: one line, exit 130
def _attention(cfg: DictConfig) -> dict[str, Any]:
    from tasks.cli.attention.maps import run

    return run(cfg)
