"""Optuna sweeps (hydra/sweeper=zoo_optuna): the params syntax, a real sweep killed and resumed,
pruning from validation metrics, the hparams_search configs, and zoo-sweep-report."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import get_class
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from hydra_plugins.zoo_optuna_sweeper import report as sweep_report
from hydra_plugins.zoo_optuna_sweeper._names import ERROR, INTERRUPTED, JOB_DIR, RETRY_OF
from hydra_plugins.zoo_optuna_sweeper._space import SearchSpace
from tasks.cli.schemas import conf_dir

# the gpt_generator experiment at seconds a trial (as in test_tasks.py), without progress bars
TINY = [
    "experiment=gpt_generator",
    "data.source_args.max_files=40",
    "data.vocab_size=300",
    "data.seq_len=32",
    "model.d_model=32",
    "model.n_heads=2",
    "model.n_layers=1",
    "trainer.max_steps=6",
    "trainer.val_check_interval=3",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1",
    "trainer.num_sanity_val_steps=0",
    "test=false",
    "task.sample_tokens=4",
    "callbacks.rich_progress_bar=null",
    "callbacks.rich_model_summary=null",
    "callbacks.throughput=null",
]
SEARCH = [
    "hydra/sweeper=zoo_optuna",
    "optimizer.lr=tag(log, interval(1e-4, 1e-2))",
    "scheduler.warmup_steps=choice(0, 2)",
    "hydra.sweeper.sampler=random",
    "hydra.sweeper.seed=0",
]


def test_params_syntax_becomes_optuna_distributions():
    params = {
        "optimizer.lr": "tag(log, interval(1e-4, 1e-2))",
        "model.n_layers": "range(1, 4)",
        "model/position": "choice(rope, alibi)",
        "model.d_model": [32, 64],
        "model.dropout": "interval(0, 0.2)",
        "+extra": "tag(int, interval(1, 8))",
        "data.fraction": "range(0.1, 0.5, 0.1)",
        "trainer.max_steps": 5,
        "seed": "choice(1, 2)",
    }
    space = SearchSpace.parse(
        params, ["model.n_heads=2", "trainer.max_steps=7", "seed=3", "task.name='a b'", "scheduler.warmup_steps=0,10"]
    )
    dists = space.distributions()
    assert dists["optimizer.lr"] == FloatDistribution(1e-4, 1e-2, log=True)
    assert dists["model.n_layers"] == IntDistribution(1, 3)  # range's stop is exclusive, Optuna's high is not
    assert dists["model/position"] == CategoricalDistribution(["rope", "alibi"])
    assert dists["model.d_model"] == CategoricalDistribution([32, 64])  # a YAML list is a choice
    assert dists["model.dropout"] == FloatDistribution(0.0, 0.2)
    assert dists["extra"] == IntDistribution(1, 8)  # named by its key, overridden as +extra
    assert dists["data.fraction"].step == pytest.approx(0.1) and dists["data.fraction"].high == pytest.approx(0.4)
    assert dists["scheduler.warmup_steps"] == CategoricalDistribution([0, 10])  # a command-line sweep joins
    assert "seed" not in dists  # a fixed command-line value wins over a searched param
    assert space.fixed == ["model.n_heads=2", "trainer.max_steps=7", "seed=3", "task.name='a b'"]

    values = {
        "optimizer.lr": 3.1e-4,
        "model.n_layers": 2,
        "model/position": "alibi",
        "model.d_model": 64,
        "model.dropout": 0.1,
        "extra": 5,
        "data.fraction": 0.2,
        "scheduler.warmup_steps": 10,
    }
    overrides = OverridesParser.create().parse_overrides(space.overrides(values))
    parsed = {o.key_or_group: o.value() for o in overrides}
    assert values.items() <= parsed.items()  # every value survives the trip
    assert [o.get_key_element() for o in overrides if o.key_or_group == "extra"] == ["+extra"]

    grid = SearchSpace.parse({"a": "range(1, 4)", "b": "choice(x, y)"}, []).grid()
    assert grid == {"a": [1, 2, 3], "b": ["x", "y"]}
    with pytest.raises(ValueError, match="continuous interval"):
        SearchSpace.parse({"a": "interval(0, 1)"}, []).grid()
    with pytest.raises(ValueError, match="unknown tag"):
        SearchSpace.parse({"a": "tag(loge, interval(0, 1))"}, [])
    same, other = SearchSpace.parse(params, []), SearchSpace.parse({**params, "model.d_model": [32, 128]}, [])
    assert same.digest() == SearchSpace.parse(params, []).digest() != other.digest()  # names the study


@pytest.mark.parametrize("experiment", ["gpt_generator", "bert_classifier", "bert_mlm", "t5_translator"])
def test_each_experiment_has_a_search_that_composes(experiment):
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[f"experiment={experiment}", f"hparams_search={experiment}_optuna"],
            return_hydra_config=True,
        )
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("zoo_optuna_sweeper.sweeper.ZooOptunaSweeper")
    assert sweeper.seed == cfg.seed and sweeper.direction is None  # direction follows monitor.mode
    space = SearchSpace.parse(sweeper.params, [])
    assert "optimizer.lr" in space.params and space.params["optimizer.lr"].distribution.log
    assert len(space.params) >= 5


def test_hydra_plugin_scan_imports_the_package_and_nothing_heavy():
    """At every start of every Hydra app, Hydra's plugin scan runs each module of the package whose
    name has no leading underscore (the sweeper, the report), outside sys.modules, as a regular
    install lists it (here: the checkout on PYTHONPATH). It must work and stay light."""
    probe = (
        "import sys; from hydra.core.plugins import Plugins; from hydra.plugins.sweeper import Sweeper; "
        "print([p.__name__ for p in Plugins.instance().discover(Sweeper)]); "
        "print(sorted(Plugins.instance().stats.modules_import_time)); "
        "print(sorted(m for m in ('optuna', 'lightning', 'torch', 'matplotlib') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd="/", env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    sweepers, scanned, heavy = out.stdout.strip().splitlines()
    assert "ZooOptunaSweeper" in sweepers
    assert "hydra_plugins.zoo_optuna_sweeper.report" in scanned and "_study" not in scanned
    assert heavy == "[]"


def test_the_pruning_callback_is_named_by_the_callbacks_config():
    """tasks/ does not import the sweeper: the callback lives with it and conf/ names it there."""
    from hydra_plugins.zoo_optuna_sweeper._pruning import OptunaPruning

    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=gpt_generator"])
    node = cfg.callbacks.optuna_pruning
    assert node._target_ == "hydra_plugins.zoo_optuna_sweeper.OptunaPruning"  # the package's name, no private module
    assert get_class(node._target_) is OptunaPruning
    assert node.monitor == cfg.monitor.metric


def test_the_report_refuses_a_directory_that_is_not_a_sweep(tmp_path, capsys):
    (tmp_path / "run" / ".hydra").mkdir(parents=True)
    for path in (tmp_path / "run", tmp_path / "missing"):
        with pytest.raises(SystemExit) as exit_:
            sweep_report.main([str(path)])
        assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "is not a multirun directory" in err and "single run" in err and "is not a directory" in err


def _zoo_train(args: list[str], cwd: Path, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "HYDRA_FULL_ERROR": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(
        [sys.executable, "-m", "tasks.cli.train", "-m", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kwargs,
    )


def _in_process(args: list[str], monkeypatch) -> None:
    """zoo-train -m in this process (saves the start-up of a new one)."""
    from tasks.cli import train

    monkeypatch.setattr(sys, "argv", ["zoo-train", "-m", *args])
    train.main()


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> tuple[Path, optuna.Study, int]:
    """A 3-trial sweep killed during its second trial, then the same command run again."""
    root = tmp_path_factory.mktemp("optuna")
    storage = f"sqlite:///{root / 'optuna.db'}"
    args = [
        *TINY,
        *SEARCH,
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.pruner=none",
        f"hydra.sweeper.storage={storage}",
        "hydra.sweeper.study_name=resume",
    ]
    first = _zoo_train([*args, f"hydra.sweep.dir={root / 'first'}"], root, start_new_session=True)
    killed = None
    try:
        deadline = time.time() + 300
        while killed is None and time.time() < deadline and first.poll() is None:
            time.sleep(0.5)
            try:
                trials = optuna.load_study(study_name="resume", storage=storage).get_trials(deepcopy=False)
            except Exception:  # the study or its tables do not exist yet
                continue
            if any(t.state == TrialState.COMPLETE for t in trials):
                # a trial's params are written one by one: kill one that has them all (it is training),
                # not one caught between two suggestions
                running = [t.number for t in trials if t.state == TrialState.RUNNING and len(t.params) == 2]
                killed = running[0] if running else None
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        output = first.communicate()[0]
    assert killed is not None, f"no trial was running after a complete one:\n{output[-3000:]}"

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.chdir(root)
        _in_process([*args, f"hydra.sweep.dir={root / 'second'}"], monkeypatch)
    return root, optuna.load_study(study_name="resume", storage=storage), killed


@pytest.mark.slow
def test_a_killed_sweep_resumes_where_it_stopped(resumed):
    root, study, killed = resumed
    trials = study.get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 3  # n_trials, counted across both runs
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert trials[killed].state == TrialState.FAIL and study.user_attrs[INTERRUPTED] == [killed]
    retry = [t for t in trials if t.user_attrs.get(RETRY_OF) == killed]
    assert len(retry) == 1 and retry[0].params == trials[killed].params and retry[0].state == TrialState.COMPLETE
    assert len({tuple(sorted(t.params.items())) for t in complete}) == 3  # no trial ran twice
    assert all(isinstance(t.value, float) for t in complete)
    # each job's directory is named by its trial number, in the sweep directory of the run that ran it
    for t in complete:
        assert Path(t.user_attrs[JOB_DIR]).name == str(t.number)
        assert (Path(t.user_attrs[JOB_DIR]) / "logs" / "metrics.csv").is_file()
    assert {Path(t.user_attrs[JOB_DIR]).parent.name for t in complete} == {"first", "second"}


@pytest.mark.slow
def test_report_on_an_optuna_sweep(resumed, capsys):
    root, study, killed = resumed
    sweep_report.main([str(root / "second")])
    table = (root / "second" / "sweep_report.md").read_text()
    assert table in capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| trial")]
    assert len(rows) == len(study.trials)  # the whole study, the killed run's trials included
    assert f"| {killed} | FAIL |" in table and "★" in table and "optimizer.lr" in table
    retry = next(t.number for t in study.trials if t.user_attrs.get(RETRY_OF) == killed)
    assert f"interrupted, retried as trial {retry} |" in table
    best = study.best_trial
    assert f"| {best.number} ★ | COMPLETE | {best.value:.4g} |" in table
    for name in ("optimizer.lr", "scheduler.warmup_steps"):
        png = root / "second" / f"sweep_{name}.png"
        assert png.stat().st_size > 5000 and png.read_bytes()[:4] == b"\x89PNG"


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
