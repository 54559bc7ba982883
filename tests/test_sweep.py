"""Optuna sweeps (hydra/sweeper=zoo_optuna): the params syntax, the hparams_search configs, the
Hydra plugin scan, a real sweep killed and resumed, and zoo-sweep-report on it. How trials end
(pruned, failed, DDP) and what a sweep prints at its end: tests/test_sweep_trial_outcomes.py."""

from __future__ import annotations

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
from sweep_runs import SEARCH, TINY, _in_process

from hydra_plugins.zoo_optuna_sweeper import report as sweep_report
from hydra_plugins.zoo_optuna_sweeper._names import INTERRUPTED, JOB_DIR, RETRY_OF
from hydra_plugins.zoo_optuna_sweeper._space import SearchSpace
from tasks.cli.schemas import conf_dir


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
