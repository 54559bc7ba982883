"""Each of Lightning's lines is printed once (issue 43, the walk's frictions): importing ``lightning``
gives its logger a handler of its own, and zoo-train's logging (Hydra's ``job_logging: stdout``) a
handler on the root logger, which printed every line a second time ("INFO: Restored all states ..."
beside "Restored all states ...", the Ctrl-C line twice)."""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from lightning.pytorch.utilities import rank_zero_info
from test_corpus_lines import TINY
from test_prepared import corpus

from tasks.cli.console import lightning_lines_once

RESTORED = "Restored all states from the checkpoint at"
INTERRUPTED = "Detected KeyboardInterrupt, attempting graceful shutdown"


@pytest.fixture
def loggers():
    """The loggers as zoo-train leaves them before its run: the root logger with a handler (its
    logging), ``lightning`` with one of its own and ``lightning.pytorch`` with none (imported after
    the root logger had one); all as they were afterwards."""
    root, package, pytorch = (logging.getLogger(name) for name in ("", "lightning", "lightning.pytorch"))
    kept = root.handlers[:], package.handlers[:], root.level, pytorch.handlers[:], pytorch.propagate
    pytorch.handlers, pytorch.propagate = [], True
    # as a fresh process has them: a verb run earlier in this process may have disabled, raised or
    # filtered them (Hydra's disabled job logging, zoo's quiet_libraries)
    chain = [logging.getLogger(n) for n in ("lightning", "lightning.pytorch", "lightning.pytorch.utilities")]
    chain.append(logging.getLogger("lightning.pytorch.utilities.rank_zero"))
    states = [(lg.disabled, lg.level, lg.filters[:]) for lg in chain], logging.root.manager.disable
    for lg in chain:
        lg.disabled, lg.filters = False, []
        lg.setLevel(logging.NOTSET)
    logging.disable(logging.NOTSET)
    root_out, package_out = io.StringIO(), io.StringIO()
    package.handlers = [logging.StreamHandler(package_out)]
    package.handlers[0].setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    root.handlers = [logging.StreamHandler(root_out)]
    root.setLevel(logging.INFO)
    yield root_out, package_out
    root.handlers, package.handlers, pytorch.handlers, pytorch.propagate = kept[0], kept[1], kept[3], kept[4]
    root.setLevel(kept[2])
    for lg, (disabled, level, filters) in zip(chain, states[0], strict=True):
        lg.disabled, lg.filters = disabled, filters
        lg.setLevel(level)
    logging.disable(states[1])


def test_a_lightning_line_reaches_one_handler(loggers):
    root_out, package_out = loggers
    rank_zero_info("a line of Lightning's")
    assert (root_out.getvalue() + package_out.getvalue()).count("a line of Lightning's") == 2  # the friction
    lightning_lines_once()
    rank_zero_info("another line")
    assert root_out.getvalue().count("another line") == 1 and "another line" not in package_out.getvalue()


def train_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "tasks.cli.train", *args]


@pytest.mark.slow
def test_ctrl_c_and_resume_say_lightnings_lines_once(tmp_path):
    run_dir = tmp_path / "run"
    text = corpus(tmp_path / "text")
    given = [*TINY, f"data.source_args.path={text}", "trainer.max_steps=100000", "trainer.val_check_interval=2"]
    process = subprocess.Popen(
        train_command(*given, f"hydra.run.dir={run_dir}"),
        cwd=tmp_path,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not (run_dir / "checkpoints" / "last.ckpt").exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)  # training has stepped and validated
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-3000:]
    assert (out + err).count(INTERRUPTED) == 1 and "INFO:" not in out + err
    assert f"zoo: interrupted; resume with: zoo-train resume={run_dir}" in err

    saved = [torch.load(p, weights_only=True)["global_step"] for p in (run_dir / "checkpoints").glob("*.ckpt")]
    resumed = subprocess.run(
        train_command(f"resume={run_dir}", f"trainer.max_steps={max(saved) + 1}"),
        cwd=tmp_path,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    printed = resumed.stdout + resumed.stderr
    assert f"resuming {run_dir} from" in resumed.stdout
    assert printed.count(RESTORED) == 1 and "INFO:" not in printed
