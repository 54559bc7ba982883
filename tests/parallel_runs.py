"""zoo-train runs of a tiny experiment (the GPT generator unless told) under a parallel trainer and in
one process, for the tests that compare them (test_tensor_parallel.py, test_pipeline_parallel.py):
each run's stdout is kept in <run>/stdout.txt and its logged metrics read back by step."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_tasks import STEPS, TINY

# GQA (4 heads, 2 KV heads) and a GLU, whose fused rows a plain contiguous cut would mix up
MODEL = ["model.n_heads=4", "model.n_kv_heads=2", "model/ffn=swiglu", "model.d_ff=64", "model.dropout=0"]
SETTINGS = {  # one validation (and a short sample); no dropout, which draws differently on other devices
    "gpt_generator": [*MODEL, "trainer.val_check_interval=6", "task.sample_tokens=4"],
    "bert_classifier": ["model.dropout=0", "task.head_dropout=0", "trainer.val_check_interval=6"],
    "bert_mlm": ["model.dropout=0", "trainer.val_check_interval=6"],
}


def train(trainer: str, run: Path, *extra: str, experiment: str = "gpt_generator") -> subprocess.CompletedProcess:
    """``zoo-train trainer=<trainer>`` of a tiny ``experiment`` into ``run``; asserts it succeeded."""
    ours = SETTINGS[experiment]
    tiny = [a for a in TINY[experiment] if a.split("=")[0] not in {b.split("=")[0] for b in ours}]
    args = [f"experiment={experiment}", *tiny, *STEPS, *ours, f"hydra.run.dir={run}"]
    done = subprocess.run(
        [sys.executable, "-m", "tasks.cli.train", *args, f"trainer={trainer}", *extra],
        cwd=run.parent,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    (run / "stdout.txt").write_text(done.stdout)
    return done


def losses(run: Path, metric: str = "train/loss") -> dict[int, float]:
    """``metric`` by step, from the run's metrics.csv."""
    rows = csv.DictReader((run / "logs" / "metrics.csv").open())
    return {int(r["step"]): float(r[metric]) for r in rows if r.get(metric)}


def resume_both_ways(trainer: str, runs: dict[str, Path], tmp: Path, experiment: str = "gpt_generator") -> None:
    """Two more steps: under ``trainer`` from the one-process run's checkpoint (``runs["one"]``), and in one
    process from ``runs[trainer]``'s; the two give the same losses (into ``tmp/<trainer>``, ``tmp/one``)."""
    more = ["trainer.max_steps=8", "test=false"]
    train(
        trainer, tmp / trainer, f"ckpt_path={runs['one'] / 'checkpoints' / 'last.ckpt'}", *more, experiment=experiment
    )
    train("cpu", tmp / "one", f"ckpt_path={runs[trainer] / 'checkpoints' / 'last.ckpt'}", *more, experiment=experiment)
    theirs, one = losses(tmp / trainer), losses(tmp / "one")
    assert sorted(theirs) == sorted(one) == [7, 8]  # the rows of steps 7 and 8
    assert theirs == pytest.approx(one, rel=1e-5)
