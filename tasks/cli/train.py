"""zoo-train: train a model on a task, e.g. ``zoo-train experiment=t5_translator model.n_layers=4``.

Returns the monitored metric, so sweepers (``-m``) can optimise it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

import zoo
from hydra_plugins.zoo_optuna_sweeper import sweeper as optuna_sweeper
from tasks import TASKS
from tasks.cli.common import check_composition, conf_dir, fail, load_task, register_model_schema, run_info

register_model_schema()
optuna_sweeper.register()  # hydra/sweeper=zoo_optuna, also from an editable install


def train(cfg: DictConfig) -> float | None:
    model_cfg = check_composition(cfg)  # bad combinations stop here, before any data is read
    L.seed_everything(cfg.seed, workers=True)
    output_dir = Path(cfg.paths.output_dir)
    first = rank_zero_only.rank == 0  # in a distributed run the other processes start this script too

    datamodule = instantiate(cfg.data, _convert_="all")
    if cfg.init_from:  # the tokenizer must be the one the weights were trained with
        datamodule.tokenizer = load_task(cfg.init_from)[0].tokenizer
    datamodule.setup("fit")
    output_dir.mkdir(parents=True, exist_ok=True)
    if first:
        datamodule.tokenizer.save(str(output_dir / "tokenizer.json"))

    model_cfg = model_cfg.replace(**datamodule.model_sizes())
    task = instantiate(cfg.task, model=model_cfg.to_dict(), optimizer=OmegaConf.to_container(cfg.optimizer),
                       tokenizer_json=datamodule.tokenizer_json(), **datamodule.task_info(), _convert_="all")
    task.run_info = run_info(cfg, task_name=next(k for k, v in TASKS.items() if type(task) is v))
    if cfg.init_from:
        task.init_from(cfg.init_from)
    if cfg.model.get("compile"):
        task.model.compile()  # in place: parameter names (and checkpoints) stay those of the plain model

    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c and "_target_" in c]
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values() if c and "_target_" in c]
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    if first:
        (output_dir / "config.yaml").write_text(task.run_info["config_yaml"])
    relaunch_as_this_job()

    if cfg.train:
        trainer.fit(task, datamodule=datamodule, ckpt_path=cfg.ckpt_path)
        if not trainer.fast_dev_run:  # the final state, even when the last step was not a validation step
            trainer.save_checkpoint(output_dir / "checkpoints" / "last.ckpt")
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    if cfg.test:
        results = trainer.test(task, datamodule=datamodule, ckpt_path=best or None, verbose=False)
        metrics.update({k: float(v) for k, v in (results[0] if results else {}).items()})
    if trainer.is_global_zero:
        summarize(output_dir, best, metrics, model_cfg)
    value = metrics.get(cfg.monitor.metric)
    return None if value is None else float(value)


def relaunch_as_this_job() -> None:
    """Make Lightning's DDP relaunch of this script (for ranks > 0) run this job alone.

    Lightning starts the other processes with this process's command line plus
    ``hydra.run.dir=<hydra.run.dir>``. In a multirun that command is the whole sweep (each child
    would start every job, in new directories): give it this job's overrides and directory instead.
    """
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    hydra_cfg = HydraConfig.get()
    sys.argv = [sys.argv[0], *hydra_cfg.overrides.task]
    OmegaConf.set_readonly(hydra_cfg, False)
    hydra_cfg.run.dir = hydra_cfg.runtime.output_dir
    OmegaConf.set_readonly(hydra_cfg, True)


def summarize(output_dir: Path, best: str, metrics: dict[str, float], model_cfg: zoo.ModelConfig) -> None:
    table = Table(title="zoo-train finished", show_header=False)
    table.add_row("run directory", str(output_dir))
    table.add_row("best checkpoint", best or "(none saved)")
    table.add_row("model", f"{model_cfg.arch}: {model_cfg.n_layers} layers, d_model {model_cfg.d_model}, "
                           f"{model_cfg.position} positions, {model_cfg.norm_placement}-{model_cfg.norm}, "
                           f"{model_cfg.ffn} FFN")
    for name in sorted(metrics):
        if name.startswith(("val/", "test/")):
            table.add_row(name, f"{metrics[name]:.4f}")
    Console().print(table)


DDP_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


@contextmanager
def one_job_of_a_sweep() -> Iterator[None]:
    """Undo what a DDP run leaves in this process (its process group, the variables Lightning sets
    to launch the other ranks), so that the next job of a multirun starts its own processes."""
    before = {k: os.environ.get(k) for k in DDP_ENV}
    try:
        yield
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="train")
def main(cfg: DictConfig) -> float | None:
    torch.set_float32_matmul_precision("high")  # TF32 matmuls on GPUs that have them; no effect on CPUs
    try:
        with one_job_of_a_sweep():
            return train(cfg)
    except zoo.ConfigError as error:
        if os.environ.get(optuna_sweeper.TRIAL_ENV):  # one trial's sampled choice: the sweeper records it failed
            raise
        fail(error)
    except Exception as error:
        if pruned_on_a_rank_above_0(error):
            return None
        raise


def pruned_on_a_rank_above_0(error: Exception) -> bool:
    """Whether this is a DDP process that Lightning started for a pruned Optuna trial (rank 0, in
    the sweep's process, tells the sweeper). It must exit cleanly: Lightning kills the sweep's
    process when one of the processes it started fails."""
    import optuna

    in_sweep_process = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    return isinstance(error, optuna.TrialPruned) and not in_sweep_process


if __name__ == "__main__":
    main()
