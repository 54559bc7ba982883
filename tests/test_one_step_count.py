"""One step count everywhere (issue 43, friction 4): after N optimizer steps metrics.csv's last training
row, the validation after it, the console's ``[step N]``, the checkpoint ``step_00000N.ckpt`` and the
closing table all say N; a resumed run goes on from the checkpoint's step without a gap or a repeat."""

from __future__ import annotations

import csv
import re
from pathlib import Path

from test_tasks import compose_train

from tasks.cli.train.training import train

RUN = ["test=true", "callbacks.model_checkpoint.save_top_k=-1"]  # every validation's checkpoint kept, by step


def _steps(run_dir: Path, metric: str) -> list[int]:
    """The step of each row that logs ``metric`` (a column, or the first of those it begins: lr-AdamW/pg1)."""
    with (run_dir / "logs" / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    column = next(k for k in rows[0] if k.startswith(metric))
    return [int(row["step"]) for row in rows if row[column]]


def _checkpoint_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.stem.removeprefix("step_")) for p in (run_dir / "checkpoints").glob("step_*.ckpt"))


def test_metrics_console_checkpoints_and_the_closing_table_count_the_same_steps(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")  # the closing table's rows on one line each
    train(compose_train("gpt_generator", tmp_path, *RUN))  # 6 steps, validated every 3, a row per step
    out = capsys.readouterr().out
    assert _steps(tmp_path, "train/loss") == [1, 2, 3, 4, 5, 6]  # the row of the k-th step says k
    assert _steps(tmp_path, "lr-AdamW") == [1, 2, 3, 4, 5, 6]  # the rate that step used, on the same step
    assert _steps(tmp_path, "val/loss") == [3, 6]  # the validation after step 3 says 3
    assert _steps(tmp_path, "test/loss") == [6]
    assert re.findall(r"\[step (\d+)\]", out) == ["3", "6"]  # the validation samples on the console
    assert _checkpoint_steps(tmp_path) == [3, 6]
    assert re.search(r"fit\s+│ 6 steps, ", out), out

    last = tmp_path / "checkpoints" / "last.ckpt"
    train(compose_train("gpt_generator", tmp_path, *RUN, f"ckpt_path={last}", "trainer.max_steps=9"))
    out = capsys.readouterr().out
    assert _steps(tmp_path, "train/loss") == list(range(1, 10))  # steps 7 to 9 appended: no gap, no repeat
    assert _steps(tmp_path, "val/loss") == [3, 6, 9]
    assert _steps(tmp_path, "test/loss") == [6, 9]  # each run's test, at the step it tested
    assert re.findall(r"\[step (\d+)\]", out) == ["9"]
    assert _checkpoint_steps(tmp_path) == [3, 6, 9]
    assert re.search(r"steps\s+│ 9 \(resumed at step 6\)", out) and re.search(r"fit\s+│ 3 steps, ", out), out
