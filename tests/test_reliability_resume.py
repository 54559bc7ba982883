"""Interrupted and resumed runs: Ctrl-C is one line and exit status 130 (with how to resume once
training has started), and a resume continues the run in its own directory, appending to its
metrics and keeping the first command's record — with the real commands."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest
import torch
from real_commands import GPT, digest, one_line_error, run
from test_tasks import compose_train

from tasks.cli.train.training import train
from tasks.run.run_dirs import RUN_MARKER


# ---- resume and Ctrl-C ------------------------------------------------------------------------------
def test_resuming_in_the_runs_own_directory_appends_to_its_metrics(tmp_path):
    train(compose_train("gpt_generator", tmp_path, "test=false"))
    with (tmp_path / "logs" / "metrics.csv").open() as f:
        first = list(csv.DictReader(f))
    last = tmp_path / "checkpoints" / "last.ckpt"
    train(compose_train("gpt_generator", tmp_path, f"ckpt_path={last}", "trainer.max_steps=9", "test=false"))
    with (tmp_path / "logs" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows[: len(first)] == [
        {**r, **{k: v for k, v in rows[i].items() if k not in r}} for i, r in enumerate(first)
    ]  # the earlier rows are still there, unchanged
    steps = [int(r["step"]) for r in rows if r.get("train/loss")]
    assert max(steps) > max(int(r["step"]) for r in first) and steps == sorted(steps)


@pytest.mark.slow
def test_ctrl_c_during_data_preparation_is_one_line_and_exit_130(tmp_path):
    import signal
    import time

    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "tasks.cli.train", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not (run_dir / ".hydra" / "overrides.yaml").exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)  # Hydra has started the job, which checks the config and reads all of the stdlib
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    # 130, or killed by SIGINT, which a shell reports as 130 too: the interpreter ends so, after the line, now
    # and then when the Ctrl-C lands while Lightning's dependencies are imported (seen on a loaded machine)
    assert process.returncode in (130, -signal.SIGINT), err[-3000:]
    assert "zoo: interrupted" in err and "Traceback" not in err
    assert not (run_dir / "tokenizer.json").exists() and not (run_dir / RUN_MARKER).exists()


@pytest.mark.slow
def test_a_resume_into_its_own_directory_keeps_the_first_commands_record(tmp_path):
    run_dir = tmp_path / "run"
    first = run(
        "train",
        *GPT,
        "test=false",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
        extra=[
            "++callbacks.rich_progress_bar={_target_:tasks.run.callbacks.ProgressBar}",
            "++callbacks.rich_model_summary={_target_:tasks.run.callbacks.ModelSummary}",
        ],
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert "DecoderModel" in first.stdout  # the model summary is printed, without the rows below
    for noise in ("litlogger", "`weights_only` was not set", "Epoch 0/-2", "v_num", "FLOPs", "MetricCollection"):
        assert noise not in first.stdout + first.stderr, noise  # nothing to act on
    assert not (run_dir / "train.log").exists()  # Hydra's job log stayed empty: there is none
    before = digest(run_dir)
    last = run_dir / "checkpoints" / "last.ckpt"
    failed = run("train", *GPT, "model.n_layers=3", f"ckpt_path={last}", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    one_line_error(failed, "was trained with another model")
    assert {k: v for k, v in digest(run_dir).items() if not k.startswith(".hydra/resume")} == before
    resumed = run(
        "train",
        *GPT,
        "trainer.max_steps=8",
        "test=false",
        f"ckpt_path={last}",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert digest(run_dir)[".hydra/overrides.yaml"] == before[".hydra/overrides.yaml"]
    records = sorted(p.name for p in (run_dir / ".hydra").glob("resume*"))
    assert records == ["resume", "resume_2"]  # the failed attempt's record and this one's, beside the first
    assert "trainer.max_steps=8" in (run_dir / ".hydra" / "resume_2" / "overrides.yaml").read_text()


@pytest.mark.slow
def test_ctrl_c_during_training_says_interrupted_and_how_to_resume(tmp_path):
    import signal
    import time

    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    run_dir = tmp_path / "run"
    args = [*GPT, "trainer.max_steps=100000", "trainer.val_check_interval=3", f"hydra.run.dir={run_dir}"]
    process = subprocess.Popen(
        [sys.executable, "-m", "tasks.cli.train", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not (run_dir / "checkpoints" / "last.ckpt").exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)  # training has stepped and validated
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-3000:]
    crash = run_dir / "checkpoints" / "on_exception.ckpt"
    assert f"zoo: interrupted; resume with: zoo-train resume={run_dir}" in err and "Traceback" not in err
    assert torch.load(crash, weights_only=True)["global_step"] >= 3


@pytest.mark.slow
def test_resume_continues_the_run_with_its_own_config_in_its_directory(tmp_path):
    run_dir = tmp_path / "run"
    first = run("train", *GPT, "model.n_layers=1", "test=false", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run("train", f"resume={run_dir}", "trainer.max_steps=9", cwd=tmp_path)  # no other override repeated
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {run_dir} from last.ckpt (step 6) with trainer.max_steps=9" in resumed.stdout
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 9 and last["hyper_parameters"]["model"]["n_layers"] == 1
    with (run_dir / "logs" / "metrics.csv").open() as f:
        steps = [int(r["step"]) for r in csv.DictReader(f) if r.get("train/loss")]
    assert steps == list(range(1, 10))  # one metrics file, every step once, as the checkpoints count them
    assert (run_dir / ".hydra" / "resume" / "overrides.yaml").is_file()
    assert not (tmp_path / "outputs").exists()  # no stray new run directory
    other = run("train", f"resume={run_dir}", "model=llama-tiny", cwd=tmp_path)
    one_line_error(other, "model=llama-tiny would make another run")
    missing = run("train", f"resume={tmp_path / 'nope'}", cwd=tmp_path)
    one_line_error(missing, "resume=", "no such folder")
