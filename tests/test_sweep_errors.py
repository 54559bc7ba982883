"""What the sweeper and zoo-sweep-report are handed, damaged: a storage that is no database, malformed or
mistyped YAML in a sweep folder, a metrics table that is not one, a sweep folder that belongs to another
sweep. Each ends in one ``zoo: SweepError: ...`` line naming the file or setting and the fix, and nothing
is written; none needs a trained model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from hydra import compose, initialize_config_dir
from test_sweep import SEARCH, TINY, _in_process

from hydra_plugins.zoo_optuna_sweeper import report as sweep_report
from hydra_plugins.zoo_optuna_sweeper._files import SweepError
from hydra_plugins.zoo_optuna_sweeper._space import SearchSpace
from tasks.cli.schemas import conf_dir


def _grid(root: Path) -> Path:
    """A grid multirun's folder as zoo-train -m leaves it: two jobs, each with its overrides, config and metrics."""
    for job, layers, loss in (("0", 1, 5.7), ("1", 2, 5.6)):
        (root / job / ".hydra").mkdir(parents=True)
        (root / job / "logs").mkdir()
        (root / job / ".hydra" / "overrides.yaml").write_text(
            yaml.safe_dump(["model.d_model=32", f"model.n_layers={layers}"])
        )
        (root / job / "config.yaml").write_text(
            yaml.safe_dump({"monitor": {"metric": "val/loss", "mode": "min"}, "trainer": {"max_steps": 2}})
        )
        (root / job / "logs" / "metrics.csv").write_text(f"epoch,step,train/loss,val/loss\n0,2,{loss},\n0,2,,{loss}\n")
    return root


def _optuna_sweep(root: Path) -> tuple[Path, Path]:
    """An Optuna sweep's folder naming a real sqlite storage with one complete trial."""
    db = root / "optuna.db"
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{db}")
    study.add_trial(
        optuna.trial.create_trial(
            params={"x": 1.0}, distributions={"x": optuna.distributions.FloatDistribution(0, 2)}, value=0.5
        )
    )
    sweep = _grid(root / "sweep")
    (sweep / "optimization_results.yaml").write_text(
        yaml.safe_dump({"study_name": "s", "storage": f"sqlite:///{db}", "metric": "val/loss"})
    )
    return sweep, db


def _report_fails(sweep: Path, capsys) -> str:
    """zoo-sweep-report on ``sweep``: it must end with exit status 2 and one line, and write nothing."""
    before = sorted(sweep.rglob("*"))
    with pytest.raises(SystemExit) as ended:
        sweep_report.main([str(sweep), "--no-plots"])
    out = capsys.readouterr()
    assert ended.value.code == 2 and out.out == ""
    assert len(out.err.splitlines()) == 1 and out.err.startswith("zoo: "), out.err
    assert sorted(sweep.rglob("*")) == before  # no report written beside a damaged file
    return out.err


DAMAGE = {  # file in the sweep folder -> what it holds instead
    "optimization_results.yaml": "study_name: [unclosed\n",
    "0/.hydra/overrides.yaml": "model.n_layers: 1\n",  # a mapping, not Hydra's list of lines
    "1/.hydra/overrides.yaml": "- model.n_layers=(\n",  # no override
    "0/config.yaml": "trainer: {max_steps: [\n",
    "1/config.yaml": "trainer: {max_steps: two}\n",
    "0/logs/metrics.csv": "epoch,step,val/loss\n0,1,abc\n",
}


@pytest.mark.parametrize("name", list(DAMAGE))
def test_the_report_names_a_damaged_file_and_the_fix(tmp_path, capsys, name):
    sweep = _grid(tmp_path)
    (sweep / name).write_text(DAMAGE[name])
    err = _report_fails(sweep, capsys)
    assert err.startswith("zoo: SweepError: ") and str(sweep / name) in err
    assert "repair it, or move" in err and "Traceback" not in err


def test_the_report_reads_no_text_as_code_or_interpolation(tmp_path, capsys, monkeypatch):
    """A config or results file is plain data: ``${oc.env:...}`` is not resolved, bytes that are not UTF-8
    are a damaged file."""
    monkeypatch.setenv("ZOO_TEST_SECRET", "s3cr3t")
    sweep = _grid(tmp_path)
    (sweep / "optimization_results.yaml").write_text("study_name: x\nstorage: ${oc.env:ZOO_TEST_SECRET}\n")
    err = _report_fails(sweep, capsys)
    assert "s3cr3t" not in err and "${oc.env:ZOO_TEST_SECRET}" in err
    (sweep / "optimization_results.yaml").unlink()
    (sweep / "1" / "logs" / "metrics.csv").write_bytes(b"step,val/loss\n1,\xff\xfe\n")
    assert str(sweep / "1" / "logs" / "metrics.csv") in _report_fails(sweep, capsys)


@pytest.mark.parametrize("damage", ["text", "truncated"])
def test_the_report_names_a_corrupt_storage(tmp_path, capsys, damage):
    sweep, db = _optuna_sweep(tmp_path)
    data = db.read_bytes()
    db.write_bytes(b"not a database\n" * 100 if damage == "text" else data[: len(data) // 3])
    err = _report_fails(sweep, capsys)
    assert str(db) in err and "cannot be read as an Optuna study" in err


def test_the_real_report_verb_prints_one_line(tmp_path):
    sweep = _grid(tmp_path)
    (sweep / "0" / "config.yaml").write_text("monitor: {mode: sideways}\n")
    done = subprocess.run(
        [sys.executable, "-m", "hydra_plugins.zoo_optuna_sweeper.report", str(sweep)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"zoo: SweepError: {sweep / '0' / 'config.yaml'}: monitor.mode='sideways'")


def _sweep_fails(tmp_path: Path, monkeypatch, capsys, *args: str) -> str:
    """zoo-train -m with the Optuna sweeper: it must end before any job with exit status 2 and one line."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        _in_process([*TINY, *SEARCH, "hydra.sweeper.n_trials=1", *args], monkeypatch)
    err = capsys.readouterr().err
    assert ended.value.code == 2, err
    lines = [line for line in err.splitlines() if not line.startswith("[I ")]  # Optuna's own info lines
    assert len(lines) == 1 and lines[0].startswith("zoo: SweepError: "), err
    return lines[0]


@pytest.mark.parametrize("damage", ["text", "truncated", "folder"])
def test_the_sweeper_names_a_corrupt_storage(tmp_path, monkeypatch, capsys, damage):
    db = tmp_path / "optuna.db"
    if damage == "folder":
        db.mkdir()
    else:
        optuna.create_study(study_name="s", storage=f"sqlite:///{db}")
        data = db.read_bytes()
        db.write_bytes(b"not a database\n" * 100 if damage == "text" else data[: len(data) // 3])
    before = db.read_bytes() if db.is_file() else None
    line = _sweep_fails(
        tmp_path, monkeypatch, capsys, f"hydra.sweeper.storage=sqlite:///{db}", f"hydra.sweep.dir={tmp_path / 'sweep'}"
    )
    assert f"storage sqlite:///{db} cannot be used" in line and "hydra.sweeper.storage=" in line
    assert not (tmp_path / "sweep").exists() and (db.read_bytes() if db.is_file() else None) == before


def test_the_sweeper_keeps_out_of_another_sweeps_folder(tmp_path, monkeypatch, capsys):
    """Job folders are named by trial number, which a new study starts again from 0: a sweep folder that is
    not new, empty or this study's own is refused, malformed results included, before anything is written."""
    sweep, storage = tmp_path / "sweep", f"hydra.sweeper.storage=sqlite:///{tmp_path / 'optuna.db'}"
    (sweep / "0").mkdir(parents=True)
    line = _sweep_fails(tmp_path, monkeypatch, capsys, storage, f"hydra.sweep.dir={sweep}")
    assert f"hydra.sweep.dir={sweep} is not empty" in line and "choose a new hydra.sweep.dir" in line
    (sweep / "optimization_results.yaml").write_text("study_name: other\nstorage: sqlite:///elsewhere.db\n")
    line = _sweep_fails(tmp_path, monkeypatch, capsys, storage, f"hydra.sweep.dir={sweep}")
    assert "holds the jobs of another sweep" in line and "'other'" in line
    (sweep / "optimization_results.yaml").write_text("study_name: [\n")
    line = _sweep_fails(tmp_path, monkeypatch, capsys, storage, f"hydra.sweep.dir={sweep}")
    assert f"{sweep / 'optimization_results.yaml'} cannot be read as YAML (line 2" in line
    assert sorted(p.name for p in sweep.iterdir()) == ["0", "optimization_results.yaml"]
    assert not (tmp_path / "optuna.db").exists()  # refused before the storage was opened


@pytest.mark.parametrize(
    "option", ["hydra.sweeper.sampler=bogus", "hydra.sweeper.pruner=bogus", "hydra.sweeper.direction=up"]
)
def test_a_bad_sweeper_option_is_one_line_and_creates_no_study(tmp_path, monkeypatch, capsys, option):
    db = tmp_path / "optuna.db"
    optuna.create_study(study_name="existing", storage=f"sqlite:///{db}")
    line = _sweep_fails(
        tmp_path,
        monkeypatch,
        capsys,
        option,
        f"hydra.sweeper.storage=sqlite:///{db}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    )
    assert option.split("=")[0] in line and "choose" in line
    assert optuna.get_all_study_names(f"sqlite:///{db}") == ["existing"]


def test_a_params_entry_that_is_not_override_syntax_names_itself():
    with pytest.raises(SweepError, match=r"hydra.sweeper.params: 'optimizer.lr=interval\(1e-4' is not override"):
        SearchSpace.parse({"optimizer.lr": "interval(1e-4", "model.n_layers": "choice(1, 2)"}, [])


def test_params_on_the_command_line_compose():
    """``+hydra.sweeper.params.<key>=...`` adds to the (empty) params: OmegaConf merges nothing into a None."""
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=["hydra/sweeper=zoo_optuna", "+hydra.sweeper.params.seed='choice(1, 2)'"],
            return_hydra_config=True,
        )
    assert SearchSpace.parse(cfg.hydra.sweeper.params, []).grid() == {"seed": [1, 2]}
