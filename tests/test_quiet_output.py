"""What a run prints is what a user can act on (issue 37, item 7): none of Lightning's lines about
accelerators it did not use, the reason fitting stopped, or the checkpoint its test reloads."""

from __future__ import annotations

import pytest
from real_commands import GPT, run

from tasks.cli.console import NOISE


@pytest.mark.slow
def test_a_run_prints_none_of_lightnings_noise(tmp_path):
    done = run("train", *GPT, "trainer.limit_val_batches=1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout + done.stderr
    assert "zoo-train finished" in printed  # the closing table says how it went
    assert [line for line in printed.splitlines() if any(text in line for text in NOISE)] == []
