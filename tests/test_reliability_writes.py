"""Nothing lost: run directories claimed exclusively, checkpoints written atomically (a full disk
or a kill leaves the previous file), NaN weights never saved and a diverging run stopped, and a
folder that cannot be written reported in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_tasks import compose_train

import zoo
from tasks.cli.train.training import train
from tasks.errors import DivergedError, UserError
from tasks.run.checkpoints import ZooCheckpointIO
from tasks.run.run_dirs import RUN_MARKER, claim_fresh, claim_run_dir


# ---- run directories and checkpoint files: never lost -----------------------------------------------
def test_claims_are_exclusive_and_default_names_get_a_fresh_sibling(tmp_path):
    folder = tmp_path / "2026-01-01_00-00-00"
    assert claim_fresh(folder) == folder
    assert claim_fresh(folder) == tmp_path / "2026-01-01_00-00-00_2"  # a second launch in the same second
    claim_run_dir(folder)
    assert (folder / RUN_MARKER).is_file()
    with pytest.raises(UserError, match="holds another run"):
        claim_run_dir(folder)


def test_checkpoint_writes_are_atomic(tmp_path, monkeypatch):
    io = ZooCheckpointIO(own_dir=tmp_path)
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}}, path)
    before = path.read_bytes()

    def full_disk(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"PK\x03\x04 half")
        raise OSError(28, "No space left on device", str(f))

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError):
        io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}}, path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_file(tmp_path):
    path = tmp_path / "last.ckpt"
    zoo.atomic_save({"step": 1}, path)
    code = (
        "import os, torch, zoo\n"
        "real = torch.save\n"
        "def slow(obj, f, *a, **k):\n"
        "    real(obj, f, *a, **k)\n"
        "    os.kill(os.getpid(), 9)\n"  # killed after writing the temp file, before the rename
        "torch.save = slow\n"
        f"zoo.atomic_save({{'step': 2, 'w': torch.ones(1000)}}, {str(path)!r})\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == -9
    assert torch.load(path, weights_only=True) == {"step": 1}


def test_the_checkpoint_writer_refuses_nan_weights_and_removes_only_its_own_files(tmp_path):
    io = ZooCheckpointIO(own_dir=tmp_path / "mine")
    with pytest.raises(DivergedError, match="w is not"):
        io.save_checkpoint({"state_dict": {"w": torch.tensor([1.0, float("nan")])}}, tmp_path / "mine" / "a.ckpt")
    assert not (tmp_path / "mine" / "a.ckpt").exists()
    other = tmp_path / "other.ckpt"
    other.write_bytes(b"x")
    io.remove_checkpoint(other)
    assert other.exists()


# ---- divergence ------------------------------------------------------------------------------------
def test_a_diverging_run_stops_naming_the_step_and_keeps_no_nan_checkpoint(tmp_path):
    cfg = compose_train(
        "gpt_generator",
        tmp_path,
        "optimizer.lr=1e4",
        "scheduler.warmup_steps=1",
        "trainer.gradient_clip_val=0",
        "trainer.max_steps=40",
        "test=false",
    )
    with pytest.raises(DivergedError, match=r"training diverged at step \d+") as error:
        train(cfg)
    assert "optimizer.lr" in str(error.value)
    saved = list((tmp_path / "checkpoints").glob("*.ckpt"))
    assert not (tmp_path / "checkpoints" / "on_exception.ckpt").exists()
    for path in saved:
        state = torch.load(path, weights_only=True)["state_dict"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point()), path


# ---- one line for a write that fails ----------------------------------------------------------------
def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_folder_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys):
    import errno

    import tasks.cli.train.training as train_module
    from tasks.cli.boundary import user_errors

    def read_only(folder, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(folder))

    monkeypatch.setattr(train_module, "claim_run_dir", read_only)
    with pytest.raises(SystemExit) as exit_:
        user_errors(train)(compose_train("gpt_generator", tmp_path / "ro"))
    assert exit_.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"zoo: UserError: cannot write {tmp_path / 'ro'}: Read-only file system; choose a folder you "
        f"can write (paths.output_dir / hydra.run.dir, or out=)"
    ]


def test_a_failed_checkpoint_write_is_one_line_and_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    zoo.atomic_save({"step": 1}, path)

    def full(obj, f, *args, **kwargs):  # how torch reports a write that failed (a full disk, ulimit -f)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 512 vs 448")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError) as error:
        zoo.atomic_save({"step": 2}, path)
    assert error.value.filename == str(path) and "the write failed" in error.value.strerror
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"step": 1} and [p.name for p in tmp_path.iterdir()] == [path.name]
