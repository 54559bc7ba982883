"""``zoo-train resume=<run dir>`` of a run directory that someone shared: its checkpoint's config
builds nothing that zoo's conf/ does not name and reads nothing from this machine's environment;
one run has one writer; the checkpoint resumed is the one of the highest step; a resumed run's
metrics hold every step once and its console reads plainly."""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import tiny_config
from omegaconf import OmegaConf
from test_reliability import GPT, digest, one_line_error, run

import zoo
from tasks.cli.resuming import run_of, stored_config
from tasks.errors import UserError
from tasks.run.callbacks import ProgressBar
from tasks.run.checkpoints import ZooCheckpointIO
from tasks.run.loggers import sample_block
from tasks.run.run_dirs import RUN_MARKER


@pytest.fixture
def shared_run(gpt_base, tmp_path) -> Path:
    """A copy of a finished tiny run (last.ckpt at step 6), as a run directory someone handed over."""
    run_dir = tmp_path / "shared" / "run"
    shutil.copytree(gpt_base.parent.parent, run_dir)
    return run_dir


def plant(run_dir: Path, **values: Any) -> None:
    """Rewrite last.ckpt's stored config (zoo_run.config_yaml) with ``values`` (dotted keys) set."""
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(ckpt, weights_only=True)
    config = OmegaConf.create(checkpoint["zoo_run"]["config_yaml"])
    for key, value in values.items():
        OmegaConf.update(config, key, value, force_add=True, merge=False)
    checkpoint["zoo_run"]["config_yaml"] = OmegaConf.to_yaml(config)
    torch.save(checkpoint, ckpt)


def without_records(files: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in files.items() if not k.startswith(".hydra/resume")}


# ---- 1. a stored config builds only what conf/ names ---------------------------------------------
PAYLOADS = {  # each writes or truncates ``victim`` when built
    "logger": lambda victim, run_dir: {
        "logger.evil": {
            "_target_": "pathlib.Path.write_text",
            "self": {"_target_": "pathlib.Path", "_args_": [str(victim)]},
            "data": "written by a shared checkpoint",
        }
    },
    "callback": lambda victim, run_dir: {
        "callbacks.evil": {"_target_": "shutil.copyfile", "src": str(run_dir / "tokenizer.json"), "dst": str(victim)}
    },
    "data.source_args": lambda victim, run_dir: {
        "data.source_args.evil": {"_target_": "builtins.open", "file": str(victim), "mode": "w"}
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_resume_of_a_checkpoint_naming_code_is_one_line_and_runs_nothing(payload, shared_run, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("my file")
    plant(shared_run, **PAYLOADS[payload](victim, shared_run))
    before = digest(shared_run)
    result = run("train", f"resume={shared_run}", cwd=tmp_path)
    where = {
        "logger": "logger.evil._target_",
        "callback": "callbacks.evil._target_",
        "data.source_args": "data.source_args.evil._target_",
    }[payload]
    assert victim.read_text() == "my file"
    one_line_error(result, "CheckpointError", where, "nothing was run")
    assert without_records(digest(shared_run)) == before  # the run is unchanged (its lock marker too)


@pytest.mark.slow
def test_stored_interpolations_stay_text_and_read_nothing_from_the_environment(shared_run, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plant(
        shared_run,
        **{"task.sample_prompt": "${oc.env:ZOO_TEST_SECRET}", "logger.csv.save_dir": "${oc.env:ZOO_TEST_DIR}"},
    )
    env = {
        **os.environ,
        "HYDRA_FULL_ERROR": "0",
        "PYTHONWARNINGS": "ignore",
        "ZOO_TEST_SECRET": "hunter2",
        "ZOO_TEST_DIR": str(elsewhere),
    }
    result = subprocess.run(
        [sys.executable, "-m", "tasks.cli.train", f"resume={shared_run}", "train=false", "test=false"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "hunter2" not in result.stdout + result.stderr
    assert not any(b"hunter2" in p.read_bytes() for p in shared_run.rglob("*") if p.is_file())
    assert "sample_prompt: ${oc.env:ZOO_TEST_SECRET}" in (shared_run / "config.yaml").read_text()  # literal text
    assert not any(elsewhere.iterdir())


def _stored(**values: Any) -> str:
    from test_tasks import compose_train

    config = compose_train("gpt_generator", Path("/saved/run"))
    for key, value in values.items():
        OmegaConf.update(config, key, value, force_add=True, merge=False)
    return OmegaConf.to_yaml(config, resolve=False)


@pytest.mark.parametrize(
    "values,problem",
    [
        ({"callbacks.model_checkpoint.filename": "../../../outside/x"}, "callbacks.model_checkpoint.filename"),
        ({"logger.csv.version": ".."}, "logger.csv.version"),
        (
            {"callbacks.last_checkpoint._target_": "lightning.pytorch.callbacks.EarlyStopping"},
            "callbacks.last_checkpoint._target_",
        ),
        ({"task.sample_prompt": {"_target_": "builtins.open", "file": "x"}}, "task.sample_prompt._target_"),
        (
            {
                "trainer.strategy": {
                    "_target_": "lightning.pytorch.strategies.FSDPStrategy",
                    "auto_wrap_policy": {
                        "_target_": "torch.distributed.fsdp.wrap.ModuleWrapPolicy",
                        "module_classes": [{"_target_": "hydra.utils.get_class", "path": "antigravity.Fly"}],
                    },
                }
            },
            "trainer.strategy.auto_wrap_policy.module_classes.0",
        ),
        ({"trainer.profiler": "/elsewhere/profile"}, "trainer.profiler"),
    ],
)
def test_a_stored_config_is_refused_where_it_names_code_or_a_path_conf_does_not(values, problem):
    with pytest.raises(zoo.CheckpointError, match=problem.replace(".", r"\.")):
        stored_config(_stored(**values), Path("run/checkpoints/last.ckpt"), Path("/here/run"))


def test_a_stored_config_writes_only_in_the_run_directory_and_keeps_its_text():
    config = stored_config(
        _stored(
            **{
                "callbacks.last_checkpoint.dirpath": "/elsewhere",
                "task.sample_prompt": "a \\${x} ${oc.env:HOME}",
                "data.tokenizer_path": "/saved/run/tokenizer.json",
            }
        ),
        Path("run/checkpoints/last.ckpt"),
        Path("/here/run"),
    )
    assert config.callbacks.last_checkpoint.dirpath == "/here/run/checkpoints"  # conf/'s place, not the stored one
    assert config.logger.csv.save_dir == config.trainer.default_root_dir == config.paths.output_dir == "/here/run"
    assert config.task.sample_prompt == "a \\${x} ${oc.env:HOME}"  # exactly the stored text, nothing resolved
    assert config.data.tokenizer_path == "/here/run/tokenizer.json"  # the moved run's own file follows it
    assert OmegaConf.to_container(config, resolve=True)["task"]["sample_prompt"] == "a \\${x} ${oc.env:HOME}"


# ---- 2. one writer per run ------------------------------------------------------------------------
def _start(cwd: Path, *args: str, log: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    out = log.open("w") if log else subprocess.PIPE
    return subprocess.Popen(
        [sys.executable, "-m", "tasks.cli.train", *args], cwd=cwd, env=env, stdout=out, stderr=out, text=True
    )


@pytest.mark.slow
def test_a_second_writer_of_a_run_is_refused_naming_the_first_and_a_dead_ones_lock_does_not_block(shared_run, tmp_path):
    log = tmp_path / "first.log"
    first = _start(tmp_path, f"resume={shared_run}", "trainer.max_steps=100000", log=log)
    try:
        deadline = time.time() + 240
        while (shared_run / RUN_MARKER).read_text() != f"pid {first.pid}\n" and time.time() < deadline:
            assert first.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)  # until the first resume has claimed the run
        last = shared_run / "checkpoints" / "last.ckpt"
        attempts = [
            _start(tmp_path, f"resume={shared_run}"),  # both at once, while the first one trains
            _start(tmp_path, *GPT, f"ckpt_path={last}", f"hydra.run.dir={shared_run}"),
        ]
        for attempt in attempts:
            out, err = attempt.communicate(timeout=300)
            one_line_error(
                subprocess.CompletedProcess(attempt.args, attempt.returncode, out, err),
                f"is being written by another zoo-train (pid {first.pid})",
            )
    finally:
        first.send_signal(signal.SIGKILL)  # kill -9: its lock goes with it
        first.wait(timeout=60)
    after = run("train", f"resume={shared_run}", "train=false", "test=false", cwd=tmp_path)
    assert after.returncode == 0, after.stderr[-3000:]


# ---- 3. the checkpoint of the highest step --------------------------------------------------------
def _ckpt(path: Path, step: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"global_step": step}, path)
    return path


def test_resume_picks_the_checkpoint_of_the_highest_step_not_the_newest_file(tmp_path):
    last = _ckpt(tmp_path / "run" / "checkpoints" / "last.ckpt", 4)
    stale = _ckpt(tmp_path / "run" / "checkpoints" / "on_exception.ckpt", 2)
    os.utime(stale, (time.time() + 60, time.time() + 60))  # restored from a backup: newer on disk
    assert run_of(tmp_path / "run") == (tmp_path / "run", last)
    _ckpt(stale, 7)
    os.utime(stale, (time.time() - 60, time.time() - 60))
    assert run_of(tmp_path / "run")[1] == stale  # a crash after last.ckpt: the crash's is further
    _ckpt(stale, 4)
    assert run_of(tmp_path / "run")[1] == last  # a tie: the validated one
    stale.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="on_exception.ckpt cannot be read.*resume=.*last.ckpt"):
        run_of(tmp_path / "run")


def test_a_crash_checkpoint_is_removed_once_a_checkpoint_as_far_along_is_saved(tmp_path):
    own = tmp_path / "run" / "checkpoints"
    crash = _ckpt(own / "on_exception.ckpt", 7)
    elsewhere = _ckpt(tmp_path / "other" / "on_exception.ckpt", 2)
    io = ZooCheckpointIO(own_dir=own, superseded=[crash, elsewhere])
    io.save_checkpoint({"global_step": 6, "state_dict": {}}, own / "last.ckpt")
    assert crash.is_file()  # it is further than the checkpoint saved: kept
    io.save_checkpoint({"global_step": 9, "state_dict": {}}, own / "last.ckpt")
    assert not crash.exists()
    assert elsewhere.is_file()  # not this run's: never removed


# ---- 4 and 11. a resumed run's metrics, progress bar, warnings and closing lines ---------------------
def _pairs(metrics: Path) -> Counter:
    with metrics.open() as f:
        return Counter(
            (row["step"], key)
            for row in csv.DictReader(f)
            for key, value in row.items()
            if value and key not in ("step", "epoch")
        )


def _losses(metrics: Path) -> dict[str, str]:
    with metrics.open() as f:
        return {row["step"]: row["train/loss"] for row in csv.DictReader(f) if row["train/loss"]}


@pytest.mark.slow
def test_a_killed_run_resumed_in_its_directory_logs_every_step_once_with_the_same_losses(tmp_path):
    from test_resume import RUNS, _crash
    from test_resume import _losses as run_losses

    steps = ["model.dropout=0.1", "trainer.max_steps=10", *RUNS["gpt_generator"]]
    run_losses("gpt_generator", tmp_path / "whole", *steps)
    killed = tmp_path / "killed"
    _crash("gpt_generator", killed, 8, tmp_path / "whole", *steps)  # in step 8: last.ckpt at 6, rows of 7 and 8
    assert _pairs(killed / "logs" / "metrics.csv")[("7", "train/loss")] == 1
    run_losses(
        "gpt_generator",
        killed,
        *steps,
        f"ckpt_path={killed / 'checkpoints' / 'last.ckpt'}",
        f"data.tokenizer_path={tmp_path / 'whole' / 'tokenizer.json'}",
    )
    pairs = _pairs(killed / "logs" / "metrics.csv")
    assert [pair for pair, n in pairs.items() if n > 1] == []
    assert {step for step, key in pairs if key == "train/loss"} == {str(s) for s in range(1, 11)}
    assert _losses(killed / "logs" / "metrics.csv") == _losses(tmp_path / "whole" / "logs" / "metrics.csv")
    assert not (killed / "checkpoints" / "on_exception.ckpt").exists()  # step 7's, superseded at step 9


@pytest.mark.slow
def test_a_resumed_copy_reads_plainly_from_its_own_checkpoint(gpt_base, tmp_path):
    run_dir = tmp_path / ("a-folder-name-long-enough-to-pass-eighty-columns-" * 2) / "run"
    shutil.copytree(gpt_base.parent.parent, run_dir)
    stale = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    stale["global_step"] = 2
    torch.save(stale, run_dir / "checkpoints" / "on_exception.ckpt")  # a copy from a backup: newer, behind
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "default", "COLUMNS": "80"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tasks.cli.train",
            f"resume={run_dir}",
            "trainer.max_steps=9",
            "++callbacks.rich_progress_bar={_target_:tasks.run.callbacks.ProgressBar}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    assert f"resuming {run_dir} from last.ckpt (step 6)" in out
    assert "exists and is not empty" not in out
    assert " 9/9 " in out  # the bar counts the epoch's batches to the last step
    lines = out.splitlines()
    assert f"run directory:   {run_dir}" in lines
    assert f"best checkpoint: {run_dir / 'checkpoints' / 'step_000009.ckpt'}" in lines
    assert not (run_dir / "checkpoints" / "on_exception.ckpt").exists()
    assert [pair for pair, n in _pairs(run_dir / "logs" / "metrics.csv").items() if n > 1] == []


def test_the_progress_bar_of_a_resumed_run_counts_to_its_last_step():
    bar = ProgressBar()
    progress = SimpleNamespace(current=SimpleNamespace(processed=620))
    bar._trainer = SimpleNamespace(
        num_training_batches=1000,
        max_epochs=-1,
        max_steps=639,
        global_step=620,
        accumulate_grad_batches=1,
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)),
    )
    assert bar.total_train_batches == 639  # 620/639, not 620/19
    bar._trainer.max_steps = 5000
    assert bar.total_train_batches == 1000  # the epoch ends first


def test_the_closing_lines_hold_the_paths_whole_at_80_columns(capsys, monkeypatch):
    from tasks.cli.train.training import summarize

    monkeypatch.setenv("COLUMNS", "80")
    run_dir = Path("/outputs") / ("long-" * 20) / "runs" / "2026-01-01_00-00-00"
    best = run_dir / "checkpoints" / "step_000100.ckpt"
    summarize(run_dir, str(best), {"val/loss": 1.5}, tiny_config(), 1234, ("val/loss", 1.5))
    lines = capsys.readouterr().out.splitlines()
    assert f"run directory:   {run_dir}" in lines and f"best checkpoint: {best}" in lines
    assert all(len(line) <= 80 for line in lines if "│" in line)


def test_a_sample_reads_as_text_with_its_lines_and_no_control_characters():
    block = sample_block("[step 3] sample:", {"": "def f(a):\n    return 'a\\n'\x1b[2J\r"})
    assert block.splitlines() == ["[step 3] sample:", "   │ def f(a):", "   │     return 'a\\n'␛[2J␍"]
    pair = sample_block("[step 3] translation:", {"source": "one", "output": "un", "reference": "un"})
    assert pair.splitlines()[1:] == ["  source    │ one", "  output    │ un", "  reference │ un"]
