"""What zoo-train runs once Hydra has composed its config (tasks.cli.verbs.train): plan, build, fit,
test, summarise. Returns the monitored metric, so sweepers (``-m``) can optimise it."""

from __future__ import annotations

import os
import sys
import time
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

import zoo
from tasks import TASKS
from tasks.cli.boundary import one_line, user_errors
from tasks.cli.console import quiet_libraries
from tasks.cli.export.card import describe_model
from tasks.cli.loading import run_info
from tasks.cli.resuming import resumed_config
from tasks.cli.train.checks import check_export, check_same_model, data_sizes, task_class
from tasks.cli.train.plan import RunPlan, plan_run
from tasks.errors import RAISE_ERRORS_ENV, EndedOnPurpose, RunFailed
from tasks.optim import check_same_optimizer, optimizer_name
from tasks.run.callbacks import CrashCheckpoint, ValidateAtTheEnd
from tasks.run.checkpoints import ZooCheckpointIO
from tasks.run.loggers import CSVLogger
from tasks.run.resume import validation_again
from tasks.run.run_dirs import claim_run_dir, release_runs
from tasks.run.trackers import refusals_tracked
from tasks.strategy import strategy_of


def train(cfg: DictConfig) -> float | None:
    """Train the run ``cfg`` describes (a resume when it has ``ckpt_path``); the monitored metric.
    The process holds the run directory (one writer: ``claim_run_dir``) from its claim until then."""
    try:
        return train_run(cfg)
    finally:
        release_runs()


def train_run(cfg: DictConfig) -> float | None:
    """The run as a straight line: plan (everything read and checked), build, fit, test, summarise."""
    with refusals_tracked(cfg):  # a sweep's job refused here is still a FAILED run in its trackers
        plan = plan_run(cfg)  # bad combinations, values and files stop here, before any data is read
    if plan.writes:  # in a distributed run the other processes start this script too
        claim_run_dir(plan.run_dir, resume_from=plan.ckpt_path, dry_run=True)  # refuse another run's directory now
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    with refusals_tracked(cfg):
        datamodule, task = build(cfg, plan)
    trainer = build_trainer(cfg, plan)
    if plan.writes:  # the first writes: everything above has loaded and been checked
        claim_and_write(plan, datamodule, task, trainer.loggers)
    relaunch_as_this_job()
    pace, steps = None, None
    if cfg.train:
        started, first = time.perf_counter(), plan.resume["global_step"] if plan.resume else 0
        with failures_kept(plan):
            fit(trainer, task, datamodule, plan)
        pace, steps = (trainer.global_step - first, time.perf_counter() - started), (first, trainer.global_step)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    if cfg.test:
        with failures_kept(plan):
            metrics.update(tested(trainer, task, datamodule, best, plan))
    # a model split over the ranks (trainer=tp, pp) is counted whole by its strategy, on every rank
    params = strategy_of(trainer).whole_parameter_count(task.model)
    if trainer.is_global_zero:
        score = trainer.checkpoint_callback.best_model_score if trainer.checkpoint_callback else None
        summarize(
            plan.run_dir,
            best,
            metrics,
            task.model.config,
            params,
            (cfg.monitor.metric, float(score)) if score is not None else None,
            pace,
            setup=setup_rows(task),
            steps=steps,
        )
    value = metrics.get(cfg.monitor.metric)
    return None if value is None else float(value)


def build(cfg: DictConfig, plan: RunPlan) -> tuple[Any, Any]:
    """The data module (read, on the plan's tokenizer) and the task on its sizes, checked against
    the checkpoint it resumes and the export it must fit."""
    datamodule = instantiate(cfg.data, _convert_="all", _recursive_=False)  # its settings are data, nothing built
    if plan.tokenizer:
        datamodule.use_tokenizer(*plan.tokenizer)
    datamodule.setup("fit")
    model_cfg = plan.model.replace(**data_sizes(cfg, plan.model, datamodule.model_sizes(), pretrained=plan.pretrained))
    if plan.resume:
        check_same_model(model_cfg, plan.resume, plan.ckpt_path)
        check_same_optimizer(plan.resume["hyper_parameters"].get("optimizer", {}), dict(cfg.optimizer))
    task = build_task(cfg, model_cfg, datamodule, plan.start)
    task.reference_base(plan.resume)  # adapter.save=only: checkpoints name the base instead of holding it
    check_export(cfg, model_cfg, task)
    return datamodule, task


def build_task(cfg: DictConfig, model_cfg: zoo.ModelConfig, datamodule: Any, start: dict | None) -> Any:
    """The task ``cfg.task`` names, on the data's tokenizer and sizes; its weights from ``init_from``
    when given; compiled when asked."""
    scheduler = OmegaConf.to_container(cfg.scheduler) if "scheduler" in cfg else None  # None: a run of 0.x resumed
    adapter = OmegaConf.to_container(cfg.adapter) if "adapter" in cfg else None
    if adapter and adapter.get("save") == "auto":  # adapters only when a base is named to read back, else all
        adapter["save"] = "only" if cfg.get("init_from") else "full"
    settings = {k: v for k, v in OmegaConf.to_container(cfg.task, resolve=True).items() if not k.startswith("_")}
    from_data = {
        "model": model_cfg.to_dict(),
        "optimizer": OmegaConf.to_container(cfg.optimizer),
        "scheduler": scheduler,
        "adapter": adapter,
        "tokenizer_json": datamodule.tokenizer_json(),
        **datamodule.task_info(),
    }  # never through OmegaConf: a tokenizer or label learnt from the data may hold "${" (Python source does)
    task = task_class(str(cfg.task._target_))(**{**settings, **from_data})  # task.* are data
    task.run_info = run_info(cfg, task_name=next(n for n in TASKS.names() if TASKS.get(n) is type(task)))
    task.specials = datamodule.specials_record()
    if start:
        task.init_from(start, source=str(cfg.init_from), partial=bool(cfg.init_partial))
    if cfg.compile:
        task.compile_steps()  # in place: parameter names (and checkpoints) stay those of the plain model
    return task


def build_trainer(cfg: DictConfig, plan: RunPlan) -> L.Trainer:
    """The trainer ``cfg.trainer`` describes, with the run's callbacks and loggers; its checkpoints
    are read through zoo's loader (the resumed one is already read) and written into the run."""
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c and "_target_" in c]
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values() if c and "_target_" in c]
    checkpoint_io = ZooCheckpointIO(
        own_dir=plan.run_dir / "checkpoints",
        preloaded={str(plan.ckpt_path): plan.resume} if plan.resume else None,
        superseded=[c.path for c in callbacks if isinstance(c, CrashCheckpoint)],
    )
    return instantiate(
        cfg.trainer, callbacks=[*callbacks, ValidateAtTheEnd()], logger=loggers or False, plugins=[checkpoint_io]
    )


def claim_and_write(plan: RunPlan, datamodule: Any, task: Any, loggers: list[Any]) -> None:
    """Claim the run directory (held until training ends) and write what a run keeps beside its
    checkpoints; a resumed run's metrics file loses the rows that the resume logs again."""
    claim_run_dir(plan.run_dir, resume_from=plan.ckpt_path)
    zoo.io.atomic_write_text(plan.run_dir / "tokenizer.json", datamodule.tokenizer.to_str(pretty=True))
    zoo.io.atomic_write_text(plan.run_dir / "config.yaml", task.run_info["config_yaml"])
    if plan.resume:
        for logger in loggers:  # one metrics file per run: rows the interrupted attempt logged from the
            if isinstance(logger, CSVLogger):  # checkpoint's step on are logged again
                logger.resume_at(plan.resume["global_step"], validation_again(plan.resume))


def fit(trainer: L.Trainer, task: Any, datamodule: Any, plan: RunPlan) -> None:
    """Train (from the resumed checkpoint's step); with checkpointing off, save the final state."""
    with interrupts_said(trainer, plan.run_dir), own_checkpoints(resumed=plan.resume is not None):
        trainer.fit(task, datamodule=datamodule, ckpt_path=plan.ckpt_path, weights_only=True)
    if not trainer.checkpoint_callbacks and not trainer.fast_dev_run:  # checkpointing off: the final state
        trainer.save_checkpoint(plan.run_dir / "checkpoints" / "last.ckpt", weights_only=False)  # all the same


def tested(trainer: L.Trainer, task: Any, datamodule: Any, best: str, plan: RunPlan) -> dict[str, float]:
    """The test metrics of the best checkpoint (of the trained weights when none was saved)."""
    with interrupts_said(trainer, plan.run_dir):
        results = trainer.test(task, datamodule=datamodule, ckpt_path=best or None, verbose=False, weights_only=True)
    return {k: float(v) for k, v in (results[0] if results else {}).items()}


@contextmanager
def failures_kept(plan: RunPlan) -> Iterator[None]:
    """What ends fitting or testing that is no user mistake (a library's refusal, a CUDA error, a bug)
    ends the verb in one line, a RunFailed naming the error and the file in the run directory that
    keeps its whole traceback; user mistakes, interrupts and what a callback raised to stop the run on
    purpose (``EndedOnPurpose``: a diverged run, a pruned trial) pass as they are."""
    try:
        yield
    except Exception as error:
        if one_line(error) is not None or isinstance(error, EndedOnPurpose):
            raise
        raise RunFailed(error, keep_traceback(plan.run_dir, error) if plan.writes else None) from error


def keep_traceback(run_dir: Path, error: BaseException) -> str | None:
    """Write the traceback of ``error`` to ``run_dir``/error.log (error_2.log … when an earlier
    attempt of the run left one: nothing is overwritten); its path, or None if it cannot be written."""
    text = "".join(traceback.format_exception(error))
    for n in range(1, 1000):
        path = run_dir / ("error.log" if n == 1 else f"error_{n}.log")
        try:
            with open(path, "x", encoding="utf-8") as f:
                f.write(text)
            return str(path)
        except FileExistsError:
            continue
        except OSError:
            return None
    return None


@contextmanager
def own_checkpoints(*, resumed: bool) -> Iterator[None]:
    """Training, without Lightning's warning that a checkpoint folder "exists and is not empty" when
    the run is resumed: the files there are its own (a new run's folder is always new)."""
    with warnings.catch_warnings():
        if resumed:
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        yield


def train_or_resume(cfg: DictConfig) -> float | None:
    """``train``, or with ``resume=<run dir>`` the run saved there, continued (see tasks.cli.resuming)."""
    if cfg.get("resume"):
        cfg = resumed_config(cfg, list(HydraConfig.get().overrides.task))
    return train(cfg)


@contextmanager
def interrupts_said(trainer: L.Trainer, output_dir: Path) -> Iterator[None]:
    """Lightning ends a run on Ctrl-C with ``sys.exit(1)`` after its graceful shutdown; turn that
    back into a KeyboardInterrupt that gives the command that resumes (the verb exits 130)."""
    try:
        yield
    except SystemExit:
        if not trainer.interrupted:
            raise
        saved = any(isinstance(c, CrashCheckpoint) and c.saved for c in trainer.callbacks)
        resumable = saved or (output_dir / "checkpoints" / "last.ckpt").is_file()
        raise KeyboardInterrupt(f"resume with: zoo-train resume={output_dir}" if resumable else "") from None


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


def summarize(
    output_dir: Path,
    best: str,
    metrics: dict[str, float],
    model_cfg: zoo.ModelConfig,
    params: int,
    best_score: tuple[str, float] | None,
    pace: tuple[int, float] | None = None,
    *,
    setup: list[tuple[str, str]] = (),
    steps: tuple[int, int] | None = None,
) -> None:
    """The closing table, then the run directory and the best checkpoint as plain lines: whole at any
    width (a table cell would cut them), to paste into the next command. ``pace``: the optimizer steps
    this fit took and its seconds, validation and checkpoints included (the speed a user waits at).
    ``steps``: the steps the run had taken when this fit started (0, or the resumed checkpoint's) and
    when it ended, as metrics.csv, the console and the checkpoint names count them."""
    table = Table(title="zoo-train finished", show_header=False)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")  # a long value folds onto the next line, never cut
    if best_score:
        table.add_row("best " + best_score[0], f"{best_score[1]:.4f}")
    table.add_row("model", describe_model(model_cfg, params))
    for row in setup:
        table.add_row(*row)
    for name in sorted(metrics):
        if name.startswith(("val/", "test/")):
            table.add_row(name, f"{metrics[name]:.4f}")
    if "perf/tokens_per_s" in metrics:  # to compare with the README's figures on another machine
        table.add_row("training speed", f"{metrics['perf/tokens_per_s']:,.0f} tokens/s (the last window)")
    if "perf/mfu" in metrics:  # where the device's peak is known (tasks.run.callbacks.Throughput)
        table.add_row(
            "MFU", f"{metrics['perf/mfu']:.1%} of the devices' peak FLOP/s (the last window), attention counted whole"
        )
    if "perf/mfu_causal" in metrics:  # the same FLOP/s, causal self-attention counted at half (zoo.stats)
        table.add_row("MFU, causal", f"{metrics['perf/mfu_causal']:.1%}, causal self-attention counted at half")
    if steps is not None and steps[0]:  # a new run's count is the fit's, below
        table.add_row("steps", f"{steps[1]:,} (resumed at step {steps[0]:,})")
    if pace and pace[0] > 0:
        table.add_row("fit", f"{pace[0]:,} steps, {pace[1]:.1f} s, {pace[0] / pace[1]:.2f} it/s (validation included)")
    Console().print(table)
    print(f"run directory:   {output_dir}\nbest checkpoint: {best or '(none saved)'}", flush=True)


def setup_rows(task: Any) -> list[tuple[str, str]]:
    """The closing table's rows for what the model trained with: the optimizer and its rate, and the
    adapter with its settings and what the checkpoints hold (``adapter.save`` resolved)."""

    def words(value: Any) -> str:
        return " ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)

    optimizer = dict(task.hparams.get("optimizer") or {})
    told = [f"{k} {optimizer[k]}" for k in TOLD if k in optimizer]
    rows = [("optimizer", ", ".join([optimizer_name(optimizer), *told]))]
    adapter = {k: v for k, v in dict(task.hparams.get("adapter") or {}).items() if v not in (None, [], {})}
    if zoo.adapters.adapted_layers(task.model):
        adapter["save"] = task.adapter_save
        rows.append(("adapter", ", ".join(f"{k} {words(v)}" if k != "name" else v for k, v in adapter.items())))
    else:
        rows.append(("adapter", "none: every parameter trains"))
    return rows


TOLD = ("lr", "weight_decay")  # the optimizer settings the closing table names


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


def run(cfg: DictConfig) -> float | None:
    """zoo-train's run of the config Hydra composed (tasks.cli.verbs.train): one line for a user's
    error; the job of a sweeper that records errors as failed trials raises them instead."""
    torch.set_float32_matmul_precision("high")  # TF32 matmuls on GPUs that have them; no effect on CPUs
    quiet_libraries()
    with one_job_of_a_sweep():
        if not os.environ.get(RAISE_ERRORS_ENV):
            return user_errors(train_or_resume)(cfg)
        try:  # a job of a sweeper that records the error as the job's failure
            return train(cfg)
        except Exception as error:
            if (
                isinstance(error, EndedOnPurpose) and error.exit_quietly
            ):  # e.g. a DDP process Lightning started, whose rank 0 reports
                return None
            raise
