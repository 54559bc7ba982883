"""How the trials of a real Optuna sweep end: pruned from their validation metric (also as DDP
trials, every process ending cleanly), failed with their error recorded while the sweep goes on,
and the line a sweep or a grid multirun ends on, naming its best trial."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from sweep_runs import SEARCH, TINY, _in_process

from hydra_plugins.zoo_optuna_sweeper import report as sweep_report
from hydra_plugins.zoo_optuna_sweeper._names import ERROR, JOB_DIR


@pytest.mark.slow
def test_pruning_stops_trials_from_their_validation_metric(tmp_path, monkeypatch):
    """A threshold pruner that no loss passes: every trial stops at its first validation, PRUNED."""
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    _in_process(
        [
            *TINY,
            *SEARCH,
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.pruner=threshold",
            "+hydra.sweeper.pruner_args.upper=0.0",
            f"hydra.sweeper.storage={storage}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        monkeypatch,
    )
    study = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)
    assert [t.state for t in study.trials] == [TrialState.PRUNED, TrialState.PRUNED]
    for trial in study.trials:
        assert list(trial.intermediate_values) == [3]  # reported at the first validation (step 3 of 6), not later
        job = Path(trial.user_attrs[JOB_DIR])
        steps = [line.split(",")[1] for line in (job / "logs" / "metrics.csv").read_text().splitlines()[1:]]
        assert max(int(s) for s in steps if s) < 5  # stopped before the last step
        assert not (job / "checkpoints" / "on_exception.ckpt").exists()  # a pruned trial is no crash
    results = (tmp_path / "sweep" / "optimization_results.yaml").read_text()
    assert "PRUNED: 2" in results and "best_value" not in results


@pytest.mark.slow
def test_failed_trials_are_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch, capsys):
    """A sampled value the typed config refuses, and one the model refuses (zoo.ConfigError in the job):
    both trials FAIL with their error, neither stops the sweep; grid caps n_trials at the grid's size.
    As every trial failed, the sweep ends with exit status 1 and the first error in one line."""
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    with pytest.raises(SystemExit) as ended:
        _in_process(
            [
                *TINY,
                "hydra/sweeper=zoo_optuna",
                "hydra.sweeper.sampler=grid",
                "hydra.sweeper.n_trials=10",
                "model.n_heads=choice(5)",
                "model.n_layers=choice(1, four)",
                f"hydra.sweeper.storage={storage}",
                f"hydra.sweep.dir={tmp_path / 'sweep'}",
            ],
            monkeypatch,
        )
    assert ended.value.code == 1
    assert "zoo: SweepError: all 2 trials of study" in capsys.readouterr().err
    study = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)
    errors = {t.params["model.n_layers"]: t.user_attrs[ERROR] for t in study.trials}
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.FAIL]
    assert "ConfigError" in errors[1] and "n_heads=5 does not divide" in errors[1]
    assert "four" in errors["four"]
    assert "FAIL: 2" in (tmp_path / "sweep" / "optimization_results.yaml").read_text()


@pytest.mark.slow
def test_a_pruned_ddp_trial_ends_every_process_cleanly(tmp_path):
    """DDP trials (2 processes) pruned at their first validation: rank 0 tells the sweeper, the process
    Lightning started for rank 1 exits quietly (were it to fail, Lightning would kill the sweep's
    process, during the next trial) and the sweep goes on."""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "sweep.log", "w") as log:  # a file, not a pipe that a stray rank-1 process holds open
        sweep = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tasks.cli.train",
                "-m",
                *TINY,
                *SEARCH,
                "trainer=ddp",
                "trainer.devices=2",
                "hydra.sweeper.n_trials=2",
                "hydra.sweeper.pruner=threshold",
                "+hydra.sweeper.pruner_args.upper=0.0",
                f"hydra.sweeper.storage={storage}",
                f"hydra.sweep.dir={tmp_path / 'sweep'}",
            ],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = sweep.wait(timeout=300)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sweep.pid, signal.SIGKILL)  # any process of the sweep still there
    output = (tmp_path / "sweep.log").read_text()
    assert code == 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]  # no process failed
    study = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)
    assert [t.state for t in study.trials] == [TrialState.PRUNED, TrialState.PRUNED]
    for trial in study.trials:
        assert list(trial.intermediate_values) == [3]
        steps = [
            line.split(",")[1]
            for line in (Path(trial.user_attrs[JOB_DIR]) / "logs" / "metrics.csv").read_text().splitlines()[1:]
        ]
        assert max(int(s) for s in steps if s) < 5  # stopped before the last step
    assert sorted(p.name for p in tmp_path.iterdir()) == ["optuna.db", "sweep", "sweep.log"]  # rank 1 made no run


def _launch_lines(output: str) -> list[str]:
    """The line Hydra's launcher prints for each job (``#<n> : <overrides>``)."""
    return [line for line in output.splitlines() if "[HYDRA] \t#" in line]


@pytest.mark.slow
def test_an_optuna_sweep_ends_on_its_best_trial_and_launch_lines_show_only_the_users_overrides(
    tmp_path, monkeypatch, capfd
):
    """Three trials asked at once (n_jobs=3), the middle one not composing (n_layers=four): the jobs launch as
    #0 and #2, each learns its own trial from its job number (it reports its validation to that trial), none
    shows the sweeper's environment overrides, and the sweep ends on its best trial."""
    monkeypatch.chdir(tmp_path)
    storage, sweep = f"sqlite:///{tmp_path / 'optuna.db'}", tmp_path / "sweep"
    _in_process(
        [
            *TINY,
            "trainer.max_steps=3",
            "hydra/sweeper=zoo_optuna",
            "hydra.sweeper.sampler=grid",
            "hydra.sweeper.seed=0",
            "hydra.sweeper.n_jobs=3",
            "model.n_layers=choice(1, four, 2)",
            f"hydra.sweeper.storage={storage}",
            f"hydra.sweep.dir={sweep}",
        ],
        monkeypatch,
    )
    output = capfd.readouterr().out
    study = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)
    assert [t.params["model.n_layers"] for t in study.trials] == [2, "four", 1]  # the seed puts it in the middle
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    lines = _launch_lines(output)
    assert [line.split("#")[1].split(" :")[0] for line in lines] == ["0", "2"]
    assert all("env_set" not in line and "ZOO_" not in line for line in lines), lines
    assert all(
        line.endswith(f"model.n_layers={t.params['model.n_layers']}")
        for line, t in zip(lines, [study.trials[0], study.trials[2]], strict=True)
    )
    for trial in (study.trials[0], study.trials[2]):
        assert Path(trial.user_attrs[JOB_DIR]) == sweep / str(trial.number)  # its job folder, by its number
        assert list(trial.intermediate_values) == [3]  # the job reported to its own trial
    best = study.best_trial
    tail = output.rstrip().splitlines()[-4:]
    assert tail[0] == f"sweep finished: 3 trials (2 COMPLETE, 1 FAIL) in {sweep}"
    assert tail[1] == (
        f"best trial: {best.number}, val/loss = {best.value:.6g} (lowest), with "
        f"model.n_layers={best.params['model.n_layers']}"
    )
    assert tail[2] == f"its run directory: {sweep / str(best.number)}"
    assert tail[3] == f"every trial, and plots: zoo-sweep-report {sweep}"


@pytest.mark.slow
def test_a_grid_multirun_ends_on_its_best_trial(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "sweep"
    _in_process([*TINY, "trainer.max_steps=3", "model.n_layers=1,2", f"hydra.sweep.dir={sweep}"], monkeypatch)
    output = capfd.readouterr().out
    losses = {job: sweep_report.logged(sweep / job, "val/loss")[0][-1] for job in ("0", "1")}
    best = min(losses, key=losses.get)
    tail = output.rstrip().splitlines()[-4:]
    assert tail[0] == f"sweep finished: 2 trials (2 COMPLETE) in {sweep}"
    assert tail[1] == f"best trial: {best}, val/loss = {losses[best]:.6g} (lowest), with model.n_layers={int(best) + 1}"
    assert tail[2] == f"its run directory: {sweep / best}"
