"""DDP on the CPU: two processes (gloo), metric sync, checkpoint and resume; Hydra multirun + DDP
makes exactly one directory per job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_tasks import STEPS, TINY

from tasks.data.loading import BucketBatchSampler

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # minutes: python -m pytest -m heavy (CI runs them)


def _train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    flags = [a for a in args if a.startswith("-")]  # Hydra's flags (-m) before the overrides
    overrides = [a for a in args if not a.startswith("-")]
    return subprocess.run(
        [sys.executable, "-m", "tasks.cli.train", *flags, "trainer=ddp", "trainer.devices=2", *overrides],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_bucketing_shards_batches_across_processes():
    lengths = list(range(100))
    samplers = [BucketBatchSampler(lengths, 8, shuffle=True, seed=1, world=2, rank=r) for r in (0, 1)]
    shards = [list(s) for s in samplers]
    assert len(shards[0]) == len(shards[1]) == len(samplers[0]) == 7  # same step count on every process
    seen = [i for shard in shards for batch in shard for i in batch]
    assert len(seen) == len(set(seen))  # no example twice in one epoch
    evaluation = [list(BucketBatchSampler(lengths, 8, shuffle=False, world=2, rank=r)) for r in (0, 1)]
    assert sorted(i for shard in evaluation for b in shard for i in b) == lengths  # every example evaluated


def test_ddp_trains_syncs_metrics_and_resumes(tmp_path):
    run = tmp_path / "run"
    args = ["experiment=bert_classifier", *TINY["bert_classifier"], *STEPS, f"hydra.run.dir={run}"]
    done = _train(args, tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 6
    header = (run / "logs" / "metrics.csv").read_text().splitlines()[0]
    assert "val/acc" in header and "test/acc" in header
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # the second process made no directory of its own

    resumed = _train(
        [
            *args,
            f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}",
            "trainer.max_steps=8",
            "test=false",
            f"hydra.run.dir={tmp_path / 'resumed'}",
        ],
        tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 8


def test_multirun_with_ddp_makes_one_directory_per_job(tmp_path):
    sweep = tmp_path / "sweep"
    done = _train(
        [
            "-m",
            "experiment=gpt_generator",
            "model/position=rope,alibi",
            *TINY["gpt_generator"],
            *STEPS,
            "test=false",
            f"hydra.sweep.dir={sweep}",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert sorted(p.name for p in sweep.iterdir()) == ["0", "1", "multirun.yaml"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep"]  # no stray outputs/ from the child processes
    for job, position in (("0", "rope"), ("1", "alibi")):
        assert f"position: {position}" in (sweep / job / "config.yaml").read_text()
        assert torch.load(sweep / job / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6
