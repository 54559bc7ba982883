"""No row and no byte is lost when a write fails: a metrics row that cannot be written stops the run,
its crash checkpoint keeps what metrics.csv lacks and the resumed run writes it, so every step's row
is there once and equal to an unbroken run's; the temporary files of a save killed mid-way are removed
by the next run in that directory, and nothing else is."""

from __future__ import annotations

import csv
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn

import tasks.run.loggers
from tasks.cli.boundary import one_line
from tasks.data.loading import ListDataset, ResumableLoader, ShuffledBatchSampler
from tasks.run.callbacks import UNWRITTEN_ROWS, CrashCheckpoint
from tasks.run.checkpoints import ZooCheckpointIO
from tasks.run.loggers import CSVLogger
from tasks.run.run_dirs import RUN_MARKER, claim_run_dir, release_runs, remove_killed_writes

STEPS = 8


class Line(L.LightningModule):
    """A linear model on a fixed shuffle of 16 examples: the same rows in every run, resumed or not."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = (self.layer(batch[:, :4]) - batch[:, 4:]).pow(2).mean()
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> ResumableLoader:
        """Epochs of 4 batches, continued where a checkpoint left them."""
        data = ListDataset(torch.randn(16, 5, generator=torch.Generator().manual_seed(1)))
        return ResumableLoader(data, ShuffledBatchSampler(16, 4, seed=7), collate_fn=torch.stack, seed=7)


def _fit(run_dir: Path, ckpt_path: Path | None = None) -> L.Trainer:
    logger = CSVLogger(save_dir=run_dir, name="", version="logs")
    if ckpt_path is not None:
        logger.resume_at(torch.load(ckpt_path, weights_only=True)["global_step"])
    trainer = L.Trainer(
        max_steps=STEPS,
        logger=logger,
        callbacks=[CrashCheckpoint(run_dir / "checkpoints")],
        plugins=[ZooCheckpointIO(own_dir=run_dir / "checkpoints")],
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(Line(), ckpt_path=ckpt_path, weights_only=True)
    return trainer


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "logs" / "metrics.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def _fail_at(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """metrics.csv cannot be written (a full disk) from the row of ``step`` on: half of that row reaches
    the file, then the write fails. Rows after the first are appended one write each, in step order."""

    class FullDisk:
        writes = 0

        def __getattr__(self, name: str):
            return getattr(os, name)

        def write(self, fd: int, data: bytes) -> int:
            FullDisk.writes += 1
            if FullDisk.writes >= step:
                os.write(fd, bytes(data[: len(data) // 2]))  # a torn line, which the writer must cut off
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return os.write(fd, data)

    monkeypatch.setattr(tasks.run.loggers, "os", FullDisk())


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")


@pytest.mark.parametrize("k", [1, 3, 4, 6, 7])
def test_a_failed_metrics_write_stops_the_run_and_the_resume_logs_every_step_once(k, tmp_path, monkeypatch):
    _fit(tmp_path / "whole")
    whole = _rows(tmp_path / "whole")
    assert [int(r["step"]) for r in whole] == list(range(1, STEPS + 1))  # the steps taken, as checkpoints count

    run_dir = tmp_path / "broken"
    with monkeypatch.context() as patch:
        _fail_at(patch, k)
        with pytest.raises(OSError) as error:
            _fit(run_dir)
    said, code = one_line(error.value)
    assert code == 1 and "\n" not in str(said) and "No space left" in str(said), said
    crash = torch.load(run_dir / "checkpoints" / "on_exception.ckpt", weights_only=True)
    on_disk = _rows(run_dir)
    assert on_disk == whole[:k]  # whole rows only: the torn one was cut off
    assert crash["global_step"] == k + 1  # the step whose row could not be written: its crash checkpoint
    assert [int(float(r["step"])) for r in crash[UNWRITTEN_ROWS]] == [k + 1]  # what the file lacks, kept

    _fit(run_dir, run_dir / "checkpoints" / "on_exception.ckpt")
    assert _rows(run_dir) == whole  # every step once, each row the unbroken run's


def test_a_row_written_after_the_checkpoint_is_not_written_twice(tmp_path):
    logger = CSVLogger(save_dir=tmp_path, name="", version="logs")
    logger.log_metrics({"train/loss": 1.5}, step=0)  # Lightning's numbering: the steps before the step
    logger.log_metrics({"train/loss": 0.25}, step=1)
    kept = [{"train/loss": 0.25, "step": 2}, {"train/loss": 0.125, "step": 3}]  # rows as written: zoo's
    assert logger.write_back(kept) == 1
    assert [(r["step"], r["train/loss"]) for r in _rows(tmp_path)] == [("1", "1.5"), ("2", "0.25"), ("3", "0.125")]


def test_a_failed_write_keeps_the_file_and_the_row(tmp_path, monkeypatch):
    logger = CSVLogger(save_dir=tmp_path, name="", version="logs")
    logger.log_metrics({"train/loss": 1.0}, step=0)
    before = (tmp_path / "logs" / "metrics.csv").read_bytes()
    (tmp_path / "logs" / "metrics.csv").chmod(0o444)
    try:
        if os.access(tmp_path / "logs" / "metrics.csv", os.W_OK):
            pytest.skip("running as a user whom file modes do not stop")
        with pytest.raises(PermissionError):
            logger.log_metrics({"train/loss": 0.5}, step=1)
        assert (tmp_path / "logs" / "metrics.csv").read_bytes() == before
        assert logger.unwritten_rows() == [{"train/loss": 0.5, "step": 2}]
        logger.finalize("failed")  # no second error over the first
    finally:
        (tmp_path / "logs" / "metrics.csv").chmod(0o644)
    logger.finalize("success")
    assert [r["step"] for r in _rows(tmp_path)] == ["1", "2"] and logger.unwritten_rows() == []


# ---- a save killed mid-way ----------------------------------------------------------------------------
KILLED_SAVE = """
import sys, time, torch, zoo
real = torch.save
def slow(obj, f, *a, **k):
    real(obj, f, *a, **k)
    print("written", flush=True)
    time.sleep(60)  # killed here: the temporary file is whole, not yet renamed
torch.save = slow
zoo.atomic_save({"state_dict": {"w": torch.zeros(1 << 20)}}, sys.argv[1])
"""


def test_the_next_run_removes_what_a_killed_save_left_and_nothing_else(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / RUN_MARKER).write_text("")
    process = subprocess.Popen(
        [sys.executable, "-c", KILLED_SAVE, str(run_dir / "checkpoints" / "last.ckpt")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline().strip() == "written"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    left = [p for p in (run_dir / "checkpoints").iterdir() if p.name.endswith(".tmp")]
    assert len(left) == 1 and left[0].stat().st_size > 4 << 20  # several MB that nothing removed

    (run_dir / "logs").mkdir()
    stale_metrics = run_dir / "logs" / ".metrics.csv.k2j4h6g8.tmp"
    stale_metrics.write_text("step\n")
    users = [
        run_dir / "checkpoints" / "notes.tmp",
        run_dir / "checkpoints" / ".last.ckpt.tmp",
        run_dir / "checkpoints" / ".draft.txt.abcd1234.tmp",
        run_dir / "logs" / ".other.csv.abcd1234.tmp",
        run_dir / ".mine.json.abcd1234.tmp",
    ]
    for path in users:
        path.write_text("a user's file")
    outside = tmp_path / "elsewhere.bin"
    outside.write_text("kept")
    (run_dir / "checkpoints" / ".link.ckpt.abcd1234.tmp").symlink_to(outside)
    (run_dir / "checkpoints" / ".dir.ckpt.abcd1234.tmp").mkdir()

    started = time.perf_counter()
    try:
        claim_run_dir(run_dir, resume_from=str(run_dir / "checkpoints" / "last.ckpt"))  # the resume
    finally:
        release_runs()
    assert time.perf_counter() - started < 5
    assert not left[0].exists() and not stale_metrics.exists()
    assert all(path.read_text() == "a user's file" for path in users)
    assert (run_dir / "checkpoints" / ".link.ckpt.abcd1234.tmp").is_symlink() and outside.read_text() == "kept"
    assert (run_dir / "checkpoints" / ".dir.ckpt.abcd1234.tmp").is_dir()
    assert remove_killed_writes(run_dir) == []


# ---- a zoo-train run --------------------------------------------------------------------------------------
def _train_rows(run_dir: Path) -> list[tuple[str, ...]]:
    """(step, the training loss, the learning rate, the validation loss) of each row: what a resumed run repeats
    (its throughput is its own)."""
    keys = ("step", "epoch", "train/loss", "val/loss")
    return [tuple(row.get(k, "") for k in keys) for row in _rows(run_dir)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "write,row,crashed_at",  # the append that fails (a row with a new column rewrites the file, uncounted), its
    [(5, (4, "lr-"), 3), (7, (4, "train/loss"), 4), (8, (5, "lr-"), 4), (13, (6, "val/loss"), 6)],  # row, the
    ids=["before-the-update-epochs-last-step", "after-the-update", "before-the-update-epochs-first-step", "validation"],
)  # crash checkpoint's step
def test_zoo_train_resumed_after_a_failed_metrics_write_logs_every_step_once(
    write, row, crashed_at, tmp_path, monkeypatch
):
    """Epochs of 4 steps, validations after steps 3, 6, 9 and 10. The 5th and 8th appends are the learning
    rates of steps 4 and 5, logged as their batch starts: the crash checkpoint is of the state before that
    step, whose resumed run logs that row again (it is not written back). The 7th is step 4's training loss,
    after its update: the checkpoint is after step 4 and the row is written back. The 13th is the validation
    after step 6, which the resumed run runs again whole (its row once, from the rerun)."""
    from test_resume import RESUMABLE
    from test_tasks import compose_train

    from tasks.cli.train.training import train

    run = [*RESUMABLE, "trainer.max_steps=10", "++trainer.limit_train_batches=4"]
    train(compose_train("gpt_generator", tmp_path / "whole", *run))
    whole = _train_rows(tmp_path / "whole")
    assert sorted(int(s) for s, _, loss, _ in whole if loss) == list(range(1, 11))

    broken = tmp_path / "broken"
    tokenizer = f"data.tokenizer_path={tmp_path / 'whole' / 'tokenizer.json'}"
    with monkeypatch.context() as patch:
        _fail_at(patch, write)
        with pytest.raises(OSError) as error:
            train(compose_train("gpt_generator", broken, *run, tokenizer))
    assert one_line(error.value) is not None
    crash = broken / "checkpoints" / "on_exception.ckpt"
    kept = torch.load(crash, weights_only=True)
    assert kept["global_step"] == crashed_at
    assert [(r["step"], any(k.startswith(row[1]) for k in r)) for r in kept[UNWRITTEN_ROWS]] == [(row[0], True)]
    train(compose_train("gpt_generator", broken, *run, tokenizer, f"ckpt_path={crash}"))
    assert _train_rows(broken) == whole
