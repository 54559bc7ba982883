"""zoo-train: train a model on a task, e.g. ``zoo-train experiment=t5_translator model.n_layers=4``.

Returns the monitored metric, so sweepers (``-m``) can optimise it.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
from tokenizers import Tokenizer

import zoo
from hydra_plugins.zoo_optuna_sweeper._names import RAISE_ERRORS_ENV
from tasks import TASKS
from tasks.callbacks import CrashCheckpoint, ValidateAtTheEnd
from tasks.checkpoints import ZooCheckpointIO, claim_run_dir, release_runs
from tasks.cli.boundary import hydra_errors, user_errors
from tasks.cli.card import describe_model
from tasks.cli.checks import check_composition
from tasks.cli.console import quiet_libraries
from tasks.cli.loading import read_checkpoint, run_info
from tasks.cli.pretrained import PretrainedSource, adopt_model, as_checkpoint, is_pretrained_source, pretrained_source
from tasks.cli.resuming import resumed_config
from tasks.cli.schemas import conf_dir, register_configs
from tasks.data.tokenizers import Specials, read_tokenizer
from tasks.loggers import CSVLogger


def train(cfg: DictConfig) -> float | None:
    """Train the run ``cfg`` describes (a resume when it has ``ckpt_path``); the monitored metric.
    The process holds the run directory (one writer: ``claim_run_dir``) from its claim until then."""
    try:
        return train_run(cfg)
    finally:
        release_runs()


def train_run(cfg: DictConfig) -> float | None:
    from_hf = is_pretrained_source(cfg.init_from)  # init_from=<HF folder, GGUF file>: model and tokenizer
    folder = pretrained_source(cfg.init_from) if from_hf and not cfg.ckpt_path else None  # (unless resuming)
    pretrained = adopt_model(cfg, folder) if folder else None  # the source's config becomes cfg.model
    model_cfg = check_composition(cfg)  # bad combinations and values stop here, before any data is read
    check_export(cfg, model_cfg)
    output_dir = Path(cfg.paths.output_dir)
    first = rank_zero_only.rank == 0  # in a distributed run the other processes start this script too
    resume = read_checkpoint(cfg.ckpt_path, "ckpt_path") if cfg.ckpt_path else None
    start = read_checkpoint(cfg.init_from, "init_from") if cfg.init_from and not from_hf else None
    if first:
        claim_run_dir(output_dir, resume_from=cfg.ckpt_path, dry_run=True)  # refuse another run's directory now
    L.seed_everything(cfg.seed, workers=True, verbose=False)

    datamodule = instantiate(cfg.data, _convert_="all", _recursive_=False)  # its settings are data, nothing built
    hand_tokenizer(datamodule, cfg, resume or start, folder, output_dir if not first else None)
    datamodule.setup("fit")
    model_cfg = model_cfg.replace(**data_sizes(cfg, model_cfg, datamodule.model_sizes(), pretrained=bool(folder)))
    if resume:
        check_same_model(model_cfg, resume, cfg.ckpt_path)
    task = build_task(cfg, model_cfg, datamodule, as_checkpoint(pretrained) if pretrained else start)
    task.reference_base(resume)  # adapter.save=only: checkpoints name the base instead of holding it
    check_export(cfg, model_cfg, task)

    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c and "_target_" in c]
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values() if c and "_target_" in c]
    checkpoint_io = ZooCheckpointIO(
        own_dir=output_dir / "checkpoints",
        preloaded={str(cfg.ckpt_path): resume} if resume else None,
        superseded=[c.path for c in callbacks if isinstance(c, CrashCheckpoint)],
    )
    trainer: L.Trainer = instantiate(
        cfg.trainer, callbacks=[*callbacks, ValidateAtTheEnd()], logger=loggers or False, plugins=[checkpoint_io]
    )
    if first:  # the first writes: everything above has loaded and been checked
        claim_and_write(cfg, output_dir, datamodule, task, loggers, resume)
    relaunch_as_this_job()

    if cfg.train:
        with interrupts_said(trainer, callbacks, output_dir), own_checkpoints(resumed=bool(resume)):
            trainer.fit(task, datamodule=datamodule, ckpt_path=cfg.ckpt_path, weights_only=True)
        if not trainer.checkpoint_callbacks and not trainer.fast_dev_run:  # checkpointing off: the final state
            trainer.save_checkpoint(output_dir / "checkpoints" / "last.ckpt", weights_only=False)  # all the same
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    if cfg.test:
        with interrupts_said(trainer, callbacks, output_dir):
            results = trainer.test(
                task, datamodule=datamodule, ckpt_path=best or None, verbose=False, weights_only=True
            )
        metrics.update({k: float(v) for k, v in (results[0] if results else {}).items()})
    if trainer.is_global_zero:
        score = trainer.checkpoint_callback.best_model_score if trainer.checkpoint_callback else None
        summarize(
            output_dir,
            best,
            metrics,
            model_cfg,
            zoo.count_parameters(task.model),
            (cfg.monitor.metric, float(score)) if score is not None else None,
        )
    value = metrics.get(cfg.monitor.metric)
    return None if value is None else float(value)


def build_task(cfg: DictConfig, model_cfg: zoo.ModelConfig, datamodule: Any, start: dict | None) -> Any:
    """The task ``cfg.task`` names, on the data's tokenizer and sizes; its weights from ``init_from``
    when given; compiled when asked."""
    scheduler = OmegaConf.to_container(cfg.scheduler) if "scheduler" in cfg else None  # None: a run of 0.x resumed
    adapter = OmegaConf.to_container(cfg.adapter) if "adapter" in cfg else None
    task = instantiate(
        cfg.task,
        model=model_cfg.to_dict(),
        optimizer=OmegaConf.to_container(cfg.optimizer),
        scheduler=scheduler,
        adapter=adapter,
        tokenizer_json=datamodule.tokenizer_json(),
        **datamodule.task_info(),
        _convert_="all",
        _recursive_=False,
    )  # task.* are data
    task.run_info = run_info(cfg, task_name=next(n for n in TASKS.names() if TASKS.get(n) is type(task)))
    task.specials = datamodule.specials_record()
    if start:
        task.init_from(start, source=str(cfg.init_from), partial=bool(cfg.init_partial))
    if cfg.compile:
        task.model.compile()  # in place: parameter names (and checkpoints) stay those of the plain model
    return task


def claim_and_write(
    cfg: DictConfig, output_dir: Path, datamodule: Any, task: Any, loggers: list[Any], resume: dict[str, Any] | None
) -> None:
    """Claim the run directory (held until training ends) and write what a run keeps beside its
    checkpoints; a resumed run's metrics file loses the rows that the resume logs again."""
    claim_run_dir(output_dir, resume_from=cfg.ckpt_path)
    zoo.io.atomic_write_text(output_dir / "tokenizer.json", datamodule.tokenizer.to_str(pretty=True))
    zoo.io.atomic_write_text(output_dir / "config.yaml", task.run_info["config_yaml"])
    if resume:
        for logger in loggers:  # one metrics file per run: rows the interrupted attempt logged from the
            if isinstance(logger, CSVLogger):  # checkpoint's step on are logged again
                logger.resume_at(resume["global_step"])


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
def interrupts_said(trainer: L.Trainer, callbacks: list[L.Callback], output_dir: Path) -> Iterator[None]:
    """Lightning ends a run on Ctrl-C with ``sys.exit(1)`` after its graceful shutdown; turn that
    back into a KeyboardInterrupt that gives the command that resumes (the verb exits 130)."""
    try:
        yield
    except SystemExit:
        if not trainer.interrupted:
            raise
        saved = any(isinstance(c, CrashCheckpoint) and c.saved for c in callbacks)
        resumable = saved or (output_dir / "checkpoints" / "last.ckpt").is_file()
        raise KeyboardInterrupt(f"resume with: zoo-train resume={output_dir}" if resumable else "") from None


def checkpoint_tokenizer(checkpoint: dict[str, Any], cfg: DictConfig) -> Tokenizer:
    """The tokenizer stored in a checkpoint; an explicit, different data.tokenizer_path is refused."""
    text = checkpoint.get("tokenizer_json")
    if not isinstance(text, str):
        raise zoo.CheckpointError("the checkpoint holds no tokenizer; pass a checkpoint written by zoo-train")
    tokenizer = Tokenizer.from_str(text)
    given = cfg.data.get("tokenizer_path")
    if given and read_tokenizer(given).to_str() != tokenizer.to_str() and not cfg.init_partial:
        raise zoo.ConfigError(
            f"data.tokenizer_path={given} differs from the tokenizer the checkpoint was trained "
            f"with; drop data.tokenizer_path (the checkpoint's is used) or set init_partial=true"
        )
    return tokenizer


EXPORT_CHECKS = ("hf",)


def check_export(cfg: DictConfig, model_cfg: zoo.ModelConfig, task: Any = None) -> None:
    """``export_check=hf``: the model (and, once built, the task's head) must be what zoo-export
    format=hf can write, or the run stops now instead of after training."""
    check = cfg.get("export_check")
    if check is None:
        return
    if check not in EXPORT_CHECKS:
        raise zoo.ConfigError(f"export_check={check}: not a check; choose export_check=hf or leave it null")
    zoo.hf_exportable(model_cfg)
    if task is not None:
        task.hf_classifier()


def hand_tokenizer(
    datamodule: Any, cfg: DictConfig, checkpoint: dict | None, folder: PretrainedSource | None, rank_dir: Path | None
) -> None:
    """Give the data module the tokenizer the weights were trained with (a checkpoint's, or an HF
    folder's); in a DDP process of rank > 0 (``rank_dir``: the run directory) the one rank 0 saved."""
    if checkpoint:
        datamodule.use_tokenizer(checkpoint_tokenizer(checkpoint, cfg), checkpoint_specials(checkpoint))
    elif folder:
        datamodule.use_tokenizer(*folder.tokenizer())
    elif rank_dir is not None and (rank_dir / "tokenizer.json").is_file():  # ranks > 0 start after rank 0 saved it
        datamodule.tokenizer = read_tokenizer(rank_dir / "tokenizer.json")  # one tokenizer for every rank


def checkpoint_specials(checkpoint: dict[str, Any]) -> Specials:
    """The special ids of the checkpoint's tokenizer: zoo's own unless it recorded others (an HF folder's)."""
    record = checkpoint.get("tokenizer_specials")
    return Specials.from_record(record) if record else Specials.zoo()


def data_sizes(
    cfg: DictConfig, model_cfg: zoo.ModelConfig, sizes: dict[str, int], *, pretrained: bool = False
) -> dict[str, int]:
    """The sizes the data decides; an explicit model.vocab_size that disagrees is a ConfigError. A
    pretrained model keeps its vocabulary (its embedding may have rows the tokenizer does not use)."""
    if pretrained:
        if sizes["vocab_size"] > model_cfg.vocab_size:
            raise zoo.ConfigError(
                f"init_from={cfg.init_from}: the tokenizer has {sizes['vocab_size']} tokens but the "
                f"model only {model_cfg.vocab_size} embeddings; use the folder's own tokenizer.json"
            )
        return {k: v for k, v in sizes.items() if k != "vocab_size"}
    explicit = cfg.model.get("vocab_size")
    if explicit is not None and explicit != sizes["vocab_size"]:
        raise zoo.ConfigError(
            f"model.vocab_size={explicit} but the tokenizer has {sizes['vocab_size']} tokens; "
            f"drop model.vocab_size (the data decides it) or set data.vocab_size={explicit}"
        )
    return sizes


HOW_IT_RUNS = ("activation_checkpointing",)  # model fields a resumed run may change: same weights, same outputs


def check_same_model(model_cfg: zoo.ModelConfig, checkpoint: dict[str, Any], path: str) -> None:
    """A resumed run trains the model it checkpointed: the composed model must be that one."""
    theirs = zoo.ModelConfig.from_dict(dict(checkpoint["hyper_parameters"]["model"])).to_dict()
    mine = model_cfg.to_dict()
    diff = [
        f"model.{k}={theirs[k]!r} there, {mine[k]!r} here"
        for k in mine
        if mine[k] != theirs.get(k) and k not in HOW_IT_RUNS
    ]
    if diff:
        run_dir = Path(path).resolve().parent.parent
        raise zoo.ConfigError(
            f"ckpt_path={path} was trained with another model ({'; '.join(diff[:3])}"
            f"{'; …' if len(diff) > 3 else ''}); continue that run with its own config: "
            f"zoo-train resume={run_dir} (key=value overrides apply on top)"
        )


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
) -> None:
    """The closing table, then the run directory and the best checkpoint as plain lines: whole at any
    width (a table cell would cut them), to paste into the next command."""
    table = Table(title="zoo-train finished", show_header=False)
    if best_score:
        table.add_row("best " + best_score[0], f"{best_score[1]:.4f}")
    table.add_row("model", describe_model(model_cfg, params))
    for name in sorted(metrics):
        if name.startswith(("val/", "test/")):
            table.add_row(name, f"{metrics[name]:.4f}")
    if "perf/tokens_per_s" in metrics:  # to compare with the README's figures on another machine
        table.add_row("training speed", f"{metrics['perf/tokens_per_s']:,.0f} tokens/s (the last window)")
    Console().print(table)
    print(f"run directory:   {output_dir}\nbest checkpoint: {best or '(none saved)'}", flush=True)


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


def main() -> float | None:
    """zoo-train: register what its config needs (not on import), then let Hydra compose and run."""
    register_configs()
    return run()


@hydra_errors
@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="train")
def run(cfg: DictConfig) -> float | None:
    torch.set_float32_matmul_precision("high")  # TF32 matmuls on GPUs that have them; no effect on CPUs
    quiet_libraries()
    with one_job_of_a_sweep():
        if not os.environ.get(RAISE_ERRORS_ENV):
            return user_errors(train_or_resume)(cfg)
        try:  # a job of a sweeper that records the error as the job's failure
            return train(cfg)
        except Exception as error:
            if getattr(error, "exit_quietly", False):  # e.g. a DDP process Lightning started, whose rank 0 reports
                return None
            raise


if __name__ == "__main__":
    main()
