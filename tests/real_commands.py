"""The real commands in a subprocess, and how a test checks that one ended in a single line.

Shared by tests/test_reliability*.py; other test files import these names from tests/test_reliability.py.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from test_tasks import STEPS, TINY

GPT = ["experiment=gpt_generator", *TINY["gpt_generator"], *STEPS]


def run(
    module: str, *args: str, cwd: Path, timeout: int = 300, extra: list[str] | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", f"tasks.cli.{module}", *args, *(extra or [])],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line_error(result: subprocess.CompletedProcess, *needles: str, code: int = 2) -> str:
    """The process ended with ``code`` and one ``zoo: `` line on stderr (no traceback) holding ``needles``."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == code, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in lines if line.startswith("zoo: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
