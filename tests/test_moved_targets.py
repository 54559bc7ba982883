"""Classes moved into rooms (tasks/run/, tasks/parallel/) leave no old module behind: a run directory
written before the move names them by their old ``_target_``s, which resume maps to their homes in
the one place that vets a stored config (tasks/cli/conf_rules.py ``MOVED``). The old run directories
are made here from tiny runs of today's code, their stored configs rewritten to the old names (every
``_target_`` that ``MOVED`` maps), then resumed."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra.utils import get_class
from omegaconf import OmegaConf
from parallel_runs import train
from test_tasks import compose_train

import tasks
from tasks.cli.conf_rules import MOVED, conf_rules, moved
from tasks.cli.schemas import conf_dir

OLD = {new: old for old, new in MOVED.items()}
GONE = ["tasks.pipeline", "tasks.parallel_checks", "tasks.parallel_fsdp", "tasks.parallel_layers"]
GONE += [f"tasks.{name}" for name in ("callbacks", "checkpoints", "resume", "run_dirs", "loggers", "trackers")]


def test_each_moved_class_lives_where_its_new_target_says_and_the_old_modules_are_gone():
    for new in MOVED.values():
        assert get_class(new).__module__ == new.rpartition(".")[0], new
    root = Path(tasks.__file__).parent.parent  # the checkout's, not an editable install's other tree
    assert [name for name in GONE if (root / name.replace(".", "/")).with_suffix(".py").exists()] == []


def _as_before(node):
    """A config with each ``_target_`` of today at its name before the move."""
    if isinstance(node, dict):
        return {k: OLD.get(v, v) if k == "_target_" else _as_before(v) for k, v in node.items()}
    return [_as_before(v) for v in node] if isinstance(node, list) else node


@pytest.mark.parametrize("trainer", ["default", "pp", "tp"])
def test_a_config_stored_before_the_move_is_vetted_as_todays(trainer, tmp_path):
    extra = (f"trainer={trainer}", "logger=[csv,mlflow]")
    today = OmegaConf.to_container(compose_train("gpt_generator", tmp_path, *extra))
    before = _as_before(today)
    rules = conf_rules(conf_dir())
    assert before != today and rules.problem(before) is not None  # conf/ no longer names the old homes
    assert moved(before) == today and rules.problem(moved(before)) is None


def _written_before_the_move(run_dir: Path) -> None:
    """Rewrite the run's checkpoints' stored configs to name every moved class by its old ``_target_``."""
    for ckpt in (run_dir / "checkpoints").glob("*.ckpt"):
        checkpoint = torch.load(ckpt, weights_only=True)
        text, count = re.subn(
            r"(_target_: )(\S+)$",
            lambda m: m.group(1) + OLD.get(m.group(2), m.group(2)),
            checkpoint["zoo_run"]["config_yaml"],
            flags=re.M,
        )
        assert text != checkpoint["zoo_run"]["config_yaml"]
        checkpoint["zoo_run"]["config_yaml"] = text
        torch.save(checkpoint, ckpt)


def _resume(run_dir: Path, cwd: Path) -> list[int]:
    """``zoo-train resume=<run_dir>`` for two more steps; the steps of the train/loss rows it logs."""
    done = subprocess.run(
        [sys.executable, "-m", "tasks.cli.train", f"resume={run_dir}", "trainer.max_steps=8", "test=false"],
        cwd=cwd,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = csv.DictReader((run_dir / "logs" / "metrics.csv").open())
    return sorted(int(r["step"]) for r in rows if r.get("train/loss"))


@pytest.mark.slow
def test_a_default_run_written_before_the_move_resumes(gpt_base, tmp_path):
    run_dir = tmp_path / "old" / "run"
    shutil.copytree(gpt_base.parent.parent, run_dir)
    _written_before_the_move(run_dir)
    assert _resume(run_dir, tmp_path)[-2:] == [7, 8]


@pytest.mark.slow
def test_a_pipeline_run_written_before_the_move_resumes(tmp_path):
    run_dir = tmp_path / "pp"
    train("pp", run_dir, "test=false")
    _written_before_the_move(run_dir)
    assert _resume(run_dir, tmp_path)[-2:] == [7, 8]
