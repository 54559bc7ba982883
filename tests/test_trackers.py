"""logger=mlflow and logger=wandb (tasks/run/trackers.py): a run, its resume and a two-job grid read back
through the trackers' own readers — MLflow's client on the SQLite store, W&B's offline files."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("wandb")

TINY = [
    "data.source_args.max_files=40",
    "data.vocab_size=300",
    "data.seq_len=32",
    "model.d_model=32",
    "model.n_heads=2",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1",
    "trainer.num_sanity_val_steps=0",
    "trainer.log_every_n_steps=1",
    "callbacks.rich_progress_bar=null",
    "callbacks.rich_model_summary=null",
    "task.sample_tokens=2",
]


def zoo_train(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "WANDB_SILENT": "true"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tasks.cli.train",
            *[a for a in args if a == "-m"],
            *TINY,
            *[a for a in args if a != "-m"],
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def steps(client, run_id: str, metric: str) -> list[int]:
    return [m.step for m in client.get_metric_history(run_id, metric)]


@pytest.mark.slow
def test_mlflow_tracks_a_run_its_resume_and_a_grid(tmp_path):
    from mlflow.tracking import MlflowClient

    zoo_train(tmp_path, "logger=mlflow", "trainer.max_steps=4", "test=false", "hydra.run.dir=run")
    first = json.loads((tmp_path / "run" / "mlflow.json").read_text())["run_id"]
    zoo_train(tmp_path, "resume=run", "trainer.max_steps=6")
    assert json.loads((tmp_path / "run" / "mlflow.json").read_text())["run_id"] == first  # the same run

    client = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    run = client.get_run(first)
    assert client.get_experiment(run.info.experiment_id).name == "gpt_generator"
    assert run.info.status == "FINISHED" and run.data.tags["zoo.ended"] == "finished"
    assert run.data.params["model.d_model"] == "32" and run.data.params["trainer.max_steps"] == "4"
    assert run.data.tags["zoo.resumed.trainer.max_steps"] == "6"  # a parameter cannot change: kept as a tag
    assert "trainer.max_steps=6" in run.data.tags["zoo.resumed_with"]
    assert run.data.tags["zoo.run_dir"] == str(tmp_path / "run")
    assert steps(client, first, "train/loss") == [1, 2, 3, 4, 5, 6]  # metrics.csv's numbering, one run
    assert steps(client, first, "val/loss") == [2, 4, 6]  # (the resume keeps the run's test=false)
    assert [a.path for a in client.list_artifacts(first)] == ["config.yaml"]

    zoo_train(
        tmp_path,
        "-m",
        "logger=mlflow",
        "trainer.max_steps=2",
        "test=false",
        "model.n_layers=1,2",
        "hydra.sweep.dir=grid",
    )
    (grid,) = [e for e in client.search_experiments() if e.name == "gpt_generator grid"]
    jobs = client.search_runs([grid.experiment_id])
    assert sorted(r.data.params["model.n_layers"] for r in jobs) == ["1", "2"]  # one run per job
    for job in jobs:
        assert job.info.status == "FINISHED" and steps(client, job.info.run_id, "train/loss") == [1, 2]
        assert job.data.tags["zoo.sweep_dir"] == str(tmp_path / "grid")
        assert f"model.n_layers={job.data.params['model.n_layers']}" in job.data.tags["zoo.overrides"]


def records(path: Path):
    """The records of a W&B transaction log (``run-<id>.wandb``): a LevelDB log of protobuf records
    after a 7-byte header (W&B's own reader is no longer in its Python package)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, pending = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:  # zero padding at the end of the file
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


@pytest.mark.slow
def test_wandb_offline_tracks_a_run_and_its_resume_in_the_same_run(tmp_path):
    zoo_train(tmp_path, "logger=wandb", "trainer.max_steps=4", "test=false", "hydra.run.dir=run")
    run_id = json.loads((tmp_path / "run" / "wandb.json").read_text())["run_id"]
    zoo_train(tmp_path, "resume=run", "trainer.max_steps=6")
    assert json.loads((tmp_path / "run" / "wandb.json").read_text())["run_id"] == run_id
    logs = sorted((tmp_path / "run" / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(logs) == 2  # both attempts logged into the W&B run of that id, offline

    logged, config = [], {}
    for log in logs:
        for record in records(log):
            if record.HasField("history"):
                row = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item
                }
                if "train/loss" in row:
                    logged.append(row["trainer/global_step"])
            if record.HasField("config"):
                config.update({item.key: json.loads(item.value_json) for item in record.config.update})
    assert logged == [1, 2, 3, 4, 5, 6]  # metrics.csv's numbering, across the resume
    assert config["model.d_model"] == 32 and config["zoo.run_dir"] == str(tmp_path / "run")


def test_how_a_run_ended_is_told_from_the_exception_being_handled():
    from hydra_plugins.zoo_optuna_sweeper._study import Pruned
    from tasks.errors import DivergedError
    from tasks.run.trackers import how_it_ended

    assert how_it_ended("success") == ("FINISHED", "finished")
    ended = {
        KeyboardInterrupt: ("KILLED", "interrupted"),
        Pruned: ("KILLED", "Pruned"),  # a pruned trial shows as stopped on purpose, not as failed
        DivergedError: ("KILLED", "DivergedError"),
        RuntimeError: ("FAILED", "RuntimeError"),
    }
    for error, expected in ended.items():
        try:
            raise error("x")
        except BaseException:
            assert how_it_ended("failed") == expected


@pytest.mark.parametrize("text", ['{"where": "w", "run_id": "../../etc"}', "not json", '["w"]', '{"where": "w"}'])
def test_a_run_record_that_zoo_did_not_write_is_refused_in_one_line(text, tmp_path):
    from tasks.errors import UserError
    from tasks.run.trackers import known_run

    (tmp_path / "mlflow.json").write_text(text)
    with pytest.raises(UserError, match="mlflow.json: .*; move it away to start a new tracked run"):
        known_run(tmp_path / "mlflow.json", "w")
    assert known_run(tmp_path / "absent.json", "w") is None
    (tmp_path / "mlflow.json").write_text('{"where": "elsewhere", "run_id": "abc"}')
    assert known_run(tmp_path / "mlflow.json", "w") is None  # tracked in another store: a new run here


@pytest.mark.slow
def test_an_optuna_sweep_with_mlflow_groups_its_trials_and_shows_pruned_and_failed_ones(tmp_path):
    """zoo_optuna with logger=mlflow: one experiment for the sweep, one run per trial with its sampled
    values among the overrides; a trial the pruner stops is KILLED (zoo.ended Pruned), one the model
    refuses is FAILED with the error's name, and the sweep goes on past both."""
    from mlflow.tracking import MlflowClient

    search = [  # a grid of 4 trials, all run: two pruned, two failed
        "hydra/sweeper=zoo_optuna",
        "optimizer.lr=choice(1e-3, 3e-3)",
        "model.n_heads=choice(2, 3)",  # 3 does not divide d_model=32: that trial fails in the model's check
        "hydra.sweeper.sampler=grid",
        "hydra.sweeper.pruner=threshold",
        "+hydra.sweeper.pruner_args.upper=0.0",  # no loss passes: a trial that runs is pruned
        "hydra.sweeper.n_trials=4",
    ]
    storage = f"hydra.sweeper.storage=sqlite:///{tmp_path / 'optuna.db'}"
    zoo_train(
        tmp_path, "-m", *search, "logger=mlflow", "test=false", "trainer.max_steps=4", storage, "hydra.sweep.dir=sweep"
    )
    client = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    (sweep,) = [e for e in client.search_experiments() if e.name == "gpt_generator sweep"]
    runs = client.search_runs([sweep.experiment_id])
    trials = sorted((r.data.params["model.n_heads"], r.data.params["optimizer.lr"]) for r in runs)
    assert trials == [("2", "0.001"), ("2", "0.003"), ("3", "0.001"), ("3", "0.003")]  # one run per trial
    for run in runs:
        if run.data.params["model.n_heads"] == "2":
            assert run.info.status == "KILLED" and run.data.tags["zoo.ended"] == "Pruned"
            assert steps(client, run.info.run_id, "val/loss") == [2]  # stopped at its first validation
        else:
            assert run.info.status == "FAILED" and run.data.tags["zoo.ended"] == "ConfigError"
        assert run.data.tags["zoo.sweep_dir"] == str(tmp_path / "sweep")
        overrides = run.data.tags["zoo.overrides"]
        assert f"model.n_heads={run.data.params['model.n_heads']}" in overrides and "optimizer.lr=" in overrides


@pytest.mark.slow
def test_a_grid_job_refused_at_its_checks_is_a_failed_wandb_run(tmp_path):
    """A job whose composed model the checks refuse, in a grid multirun with logger=wandb: the line says
    why, and W&B still has the job's run, its config and zoo.ended = the error's name."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "WANDB_SILENT": "true"}
    done = subprocess.run(
        [sys.executable, "-m", "tasks.cli.train", "-m", *TINY, "logger=wandb", "model.n_heads=3", "hydra.sweep.dir=g"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 2 and "ConfigError: n_heads=3 does not divide d_model=32" in done.stderr  # a user error
    (log,) = (tmp_path / "g" / "0" / "wandb").glob("offline-run-*/run-*.wandb")
    config, summary = {}, {}
    for record in records(log):
        if record.HasField("config"):
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        if record.HasField("summary"):
            summary.update({item.key: json.loads(item.value_json) for item in record.summary.update})
    assert config["model.n_heads"] == 3 and summary["zoo.ended"] == "ConfigError"


@pytest.mark.parametrize(("logger", "package"), [("mlflow", "mlflow"), ("wandb", "wandb")])
def test_a_tracker_whose_package_is_missing_is_refused_in_one_line_before_data_is_read(
    logger, package, tmp_path, monkeypatch
):
    from test_tasks import compose_train

    from tasks.cli.train.checks import check_composition
    from tasks.errors import UserError
    from tasks.run import trackers

    real = trackers.importlib.util.find_spec
    monkeypatch.setattr(
        trackers.importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a)
    )
    cfg = compose_train("gpt_generator", tmp_path, f"logger={logger}")
    with pytest.raises(
        UserError, match=rf"^logger.{logger} needs the package {package}, which is not installed: "
    ) as e:
        check_composition(cfg)
    assert 'pip install "zoo[tracking]"' in str(e.value) and "\n" not in str(e.value)
    check_composition(compose_train("gpt_generator", tmp_path, "logger=csv"))  # the csv logger needs nothing


def test_a_logger_of_lightnings_whose_package_is_missing_ends_in_one_line(tmp_path, monkeypatch, capsys):
    """logger=tensorboard where neither tensorboard nor tensorboardX is installed: Lightning's
    ModuleNotFoundError as zoo's one line, naming the logger's key, not a traceback."""
    import lightning.fabric.loggers.tensorboard as fabric_tensorboard
    from test_tasks import STEPS
    from test_tasks import TINY as TASK_TINY

    from tasks.cli import verbs

    monkeypatch.setattr(fabric_tensorboard, "_TENSORBOARD_AVAILABLE", False)
    monkeypatch.setattr(fabric_tensorboard, "_TENSORBOARDX_AVAILABLE", False)
    monkeypatch.chdir(tmp_path)
    args = [*TASK_TINY["gpt_generator"], *STEPS, "logger=tensorboard", f"hydra.run.dir={tmp_path / 'run'}"]
    monkeypatch.setattr(sys, "argv", ["zoo-train", *args])
    with pytest.raises(SystemExit) as ended:
        verbs.train()
    err = capsys.readouterr().err.strip()
    assert ended.value.code == 2 and "\n" not in err, err
    assert err.startswith("zoo: UserError: logger.tensorboard: Neither `tensorboard` nor `tensorboardX` is available")
    assert err.endswith("; install it, or choose another logger")
