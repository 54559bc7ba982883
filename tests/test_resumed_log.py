"""A resumed run's logs/metrics.csv lines up with the log of a run that never stopped (issue 37, item
5): every row of the unbroken run is in it with the same step and values, validation rows included,
no metric is logged twice for one step, and the test of a run that had finished is kept. The only
other rows are those of the step where the first run stopped (its last validation, its test)."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest
from test_resume import RESUMABLE, CrashAt
from test_tasks import compose_train

from tasks.cli.train.training import train

pytestmark = pytest.mark.slow
RUN = [
    *RESUMABLE,
    "test=true",
    "scheduler.warmup_steps=1000",  # a learning rate that does not depend on max_steps
    "trainer.val_check_interval=10",
    "trainer.log_every_n_steps=5",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
]


def _rows(run_dir: Path) -> list[tuple[tuple[str, str], ...]]:
    """Each row's logged values (throughput aside: the machine's, not the run's)."""
    with (run_dir / "logs" / "metrics.csv").open(newline="") as f:
        return [
            tuple(sorted((k, v) for k, v in row.items() if v and k != "perf/tokens_per_s")) for row in csv.DictReader(f)
        ]


def _logged_twice(rows: list[tuple[tuple[str, str], ...]]) -> list[tuple[str, str]]:
    counts = Counter((dict(row)["step"], key) for row in rows for key, _ in row if key not in ("step", "epoch"))
    return [key for key, n in counts.items() if n > 1]


@pytest.mark.parametrize("stop", ["finished", "finished_on_a_validation", "killed"])
def test_the_resumed_log_holds_every_row_of_the_unbroken_one_once(stop, tmp_path):
    whole = tmp_path / "whole"
    train(compose_train("gpt_generator", whole, *RUN, "trainer.max_steps=30"))
    broken, tokenizer = tmp_path / "broken", f"data.tokenizer_path={whole / 'tokenizer.json'}"
    if stop.startswith("finished"):  # a 15-step run (validated and tested at its end), then given 30; or 20,
        # whose end is a step Lightning validates at anyway (its interval: 10)
        first = 20 if stop == "finished_on_a_validation" else 15
        train(compose_train("gpt_generator", broken, *RUN, tokenizer, f"trainer.max_steps={first}"))
    else:  # killed in step 13; its last.ckpt is the validation of step 10
        crash = ["++callbacks.crash._target_=test_resume.CrashAt", "++callbacks.crash.step=13"]
        with pytest.raises(RuntimeError, match="killed in step 13"):
            train(compose_train("gpt_generator", broken, *RUN, *crash, tokenizer, "trainer.max_steps=30"))
    resume = f"ckpt_path={broken / 'checkpoints' / 'last.ckpt'}"
    train(compose_train("gpt_generator", broken, *RUN, tokenizer, "trainer.max_steps=30", resume))

    unbroken, resumed = _rows(whole), _rows(broken)
    assert [row for row in unbroken if row not in resumed] == []
    assert _logged_twice(resumed) == []
    extra = [dict(row) for row in resumed if row not in unbroken]
    if stop == "finished":  # the first run's end: its validation and its test, both at step 15
        assert {row["step"] for row in extra} == {"15"} and any("test/loss" in row for row in extra)
    elif stop == "finished_on_a_validation":  # its validation is the unbroken run's too: only its test
        assert [row["step"] for row in extra] == ["20"] and "test/loss" in extra[0]
    else:
        assert extra == []
    assert CrashAt  # the crash callback the config names lives in test_resume
