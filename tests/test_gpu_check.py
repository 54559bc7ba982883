"""scripts/gpu_check.sh wastes no GPU time: it creates its output folder, runs every step even after one
fails, and ends with each step's status and time (exit 1 if any failed). Its dry run on the CPU is its test."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"
EXPERIMENTS = ["gpt_generator", "bert_mlm", "bert_classifier", "t5_translator"]
STEPS = ["gpu_tests", *EXPERIMENTS, "train_bench", "decode_bench", "flex_bench"]


def _check(out: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OUT": str(out), **env},
    )


def _summary(out: Path) -> dict[str, tuple[str, float]]:
    """step -> (status, seconds), from the summary file the script writes."""
    rows = [line.split("\t") for line in (out / "gpu_check.tsv").read_text().splitlines()[1:]]
    return {name: (status, float(seconds)) for name, status, seconds in rows}


def test_a_failing_step_stops_no_other_and_every_step_is_reported(tmp_path):
    """Steps run by a stand-in python: the device benchmark fails, the flex benchmark after it still runs."""
    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(
        '#!/usr/bin/env bash\necho "$*" >> "$CALLS"\n'
        'case "$*" in *device.py*) echo boom; exit 3;; *"-m pytest"*) exit 5;; esac\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "not" / "yet" / "there"
    done = _check(out, "--dry-run", PYTHON=str(fake), CALLS=str(calls))
    assert done.returncode == 1, done.stdout + done.stderr
    called = [line.split()[:3] for line in calls.read_text().splitlines()]
    assert called == [
        ["-m", "pytest", "-m"],
        *(["-m", "tasks.cli.train", f"experiment={name}"] for name in EXPERIMENTS),
        ["scripts/bench/device.py", "--preset", "gpt-tiny"],
        ["scripts/bench/decoding.py", *called[-3][1:]],
        ["scripts/bench/flex.py", "--device", "cpu"],
        ["scripts/gpu_summary.py", str(out)],  # every figure in one JSON, after the summary table
    ]
    assert all(
        "trainer=gpu trainer.accelerator=cpu optimizer.fused=true" in line
        for line in calls.read_text().splitlines()[1:5]
    )
    summary = _summary(out)
    assert list(summary) == STEPS
    assert summary["gpu_tests"][0] == "ok"  # pytest's 5 (every gpu test skipped) is no failure in a dry run
    assert summary["train_bench"][0] == "FAILED (exit 3)" and summary["flex_bench"][0] == "ok"
    assert all(seconds >= 0 for _, seconds in summary.values())
    tail = done.stdout[done.stdout.index("gpu_check summary") :]
    assert all(name in tail for name in STEPS) and "FAILED (exit 3)" in tail
    assert (out / "train_bench.log").read_text() == "boom\n"  # each step's output kept beside the summary

    again = _check(out, "--dry-run", PYTHON=str(fake), CALLS=str(calls))
    assert again.returncode == 2 and again.stderr.startswith("zoo: FileExistsError:")  # nothing overwritten
    assert str(out / "gpu_check.tsv") in again.stderr


def test_an_output_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    done = _check(tmp_path / "file" / "out", "--dry-run")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("zoo: OSError:") and len(done.stderr.splitlines()) == 1


@pytest.mark.slow
def test_the_dry_run_runs_every_step_on_the_cpu(tmp_path):
    out = tmp_path / "gpu_check"
    done = _check(out, "--dry-run", CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert {name: status for name, (status, _) in _summary(out).items()} == dict.fromkeys(STEPS, "ok")
    rows = json.loads((out / "gpu_bench.json").read_text())
    assert [(r["model"], r["compile"]) for r in rows] == [("zoo", False), ("hf", False)]  # side by side
    assert all(r["tokens_per_s"] > 0 for r in rows)
    assert all(r["tokens_per_s"] > 0 for r in json.loads((out / "flex_bench.json").read_text()))
    figures = json.loads((out / "gpu_check.json").read_text())  # the one JSON: every step and figure
    assert [row["step"] for row in figures["steps"]] == STEPS
    assert set(figures["benchmarks"]) == {"training", "decoding", "flex"}
    for name in EXPERIMENTS:  # each experiment trained its steps as a GPU user's run, on the CPU
        run = figures["experiments"][name]
        assert run["status"] == "ok" and run["steps"] == 4 and run["it_per_s"] > 0 and run["metrics"], run
