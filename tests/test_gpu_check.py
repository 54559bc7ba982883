"""scripts/gpu_check.sh wastes no GPU time: it creates its output folder, runs every step even after one
fails, and ends with each step's status and time (exit 1 if any failed). Its dry run on the CPU is its test."""

from __future__ import annotations

import json
import os
import re
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
    lines = calls.read_text().splitlines()
    summaries = [line for line in lines if "gpu_summary.py --quiet" in line]
    assert len(summaries) == len(STEPS)  # the JSON rewritten after every step
    lines = [line for line in lines if "gpu_summary.py --quiet" not in line]
    called = [line.split()[:3] for line in lines]
    assert called == [
        ["-m", "pytest", "-m"],
        *(["-m", "tasks.cli.train", f"experiment={name}"] for name in EXPERIMENTS),
        ["scripts/bench/device.py", "--preset", "gpt-tiny"],
        ["scripts/bench/decoding.py", *called[-3][1:]],
        ["scripts/bench/flex.py", "--device", "cpu"],
        ["scripts/gpu_summary.py", str(out)],  # every figure in one JSON, said after the summary table
    ]
    assert "tests/test_gpu.py tests/test_decode_graphs.py" in lines[0]  # named files, not the whole suite
    assert all("trainer=gpu trainer.accelerator=cpu optimizer.fused=true" in line for line in lines[1:5])
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


QUICK_STEPS = ["install", "gpu_tests", *EXPERIMENTS, "decode_bench", "train_bench", "translator_gpu", "translator_cpu"]
FAKE = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
case "$*" in
  *gpu_summary.py*) exec "$REAL" "$@";;
  *device.py*) echo boom; exit 3;;
  *translator_cpu*) cp "$OUT/gpu_check.json" "$OUT/seen.json";;
esac
"""


def test_the_quick_check_fits_8_minutes_in_order_of_value_and_writes_each_figure_at_once(tmp_path):
    """--quick --dry-run with a stand-in python: the steps in order (GPU tests, the experiments, decoding,
    training, the translator's pace), each limit said and their sum at most 480 s; the JSON holds every
    step done when the next starts; a failing step stops no other."""
    import sys

    calls, fake, out = tmp_path / "calls", tmp_path / "python", tmp_path / "out"
    fake.write_text(FAKE)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    done = _check(out, "--quick", "--dry-run", PYTHON=str(fake), CALLS=str(calls), REAL=sys.executable,
                  DRY_SCALE="1")  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr  # the training benchmark failed
    summary = _summary(out)
    assert list(summary) == QUICK_STEPS
    assert summary["install"][0] == "skipped (dry run)" and summary["train_bench"][0] == "FAILED (exit 3)"
    assert all(status == "ok" for name, (status, _) in summary.items() if name not in ("install", "train_bench"))
    limits = {m[1]: int(m[2]) for m in re.finditer(r"^=== (\w+) \(at most (\d+) s\)", done.stdout, re.M)}
    assert list(limits) == QUICK_STEPS[1:]
    header = SCRIPT.read_text().split("set -uo pipefail")[0]
    planned = {m[1]: int(m[2]) for m in re.finditer(r"^#\s{3,}(\w+)\s+(\d+)\s", header, re.M)}
    assert planned == {"install": 30, **limits}  # the header states the limits the script keeps
    assert sum(planned.values()) <= 480
    lines = [line for line in calls.read_text().splitlines() if "gpu_summary.py" not in line]
    assert "-m pytest -m gpu" in lines[0] and "tests/test_gpu.py tests/test_decode_graphs.py" in lines[0]
    assert all("trainer=gpu trainer.accelerator=cpu" in line and "trainer.max_steps=30" in line for line in lines[1:5])
    assert "--gpu --dry-run" in lines[5] and "device.py" in lines[6]
    assert "trainer=gpu" in lines[7] and "trainer.max_steps=20" in lines[7]  # 1,000 on a GPU
    assert "trainer=gpu" not in lines[8] and "trainer.accelerator=cpu" in lines[8]
    seen = json.loads((out / "seen.json").read_text())  # the JSON as the translator's CPU run started
    assert [row["step"] for row in seen["steps"]] == QUICK_STEPS[:-1]
    figures = json.loads((out / "gpu_check.json").read_text())
    assert [row["step"] for row in figures["steps"]] == QUICK_STEPS and "translator" in figures["paces"]


def test_the_steady_pace_leaves_out_the_first_window(tmp_path):
    """gpu_summary's steady pace: the median tokens/s of the logged windows after the first."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_summary", SCRIPT.parent / "gpu_summary.py")
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    for name, rates in (("translator_gpu", [5, 300, 310, 290]), ("translator_cpu", [50, 100, 100, 90])):
        (tmp_path / name / "logs").mkdir(parents=True)
        rows = ["step,perf/tokens_per_s,train/loss", *(f"{10 * i},{r}," for i, r in enumerate(rates)), "40,,1.0"]
        (tmp_path / name / "logs" / "metrics.csv").write_text("\n".join(rows) + "\n")
    pace = summary.paces(tmp_path)["translator"]
    assert pace["gpu_tokens_per_s"] == 300 and pace["cpu_tokens_per_s"] == 100
    assert pace["gpu_vs_cpu"] == 3 and pace["met"] is True
    assert summary.paces(tmp_path / "nothing")["translator"]["gpu_vs_cpu"] is None


def test_a_failed_transformers_twin_keeps_zoos_rows(monkeypatch):
    """scripts/bench/device.py with a transformers that refuses a keyword: the hf row says why, zoo's rows
    are measured; decoding.py's variants likewise."""
    import sys

    import torch

    sys.path.insert(0, str(SCRIPT.parent / "bench"))
    import device

    class Old(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(2, 2)

        def forward(self, **kw):
            raise TypeError("forward() got an unexpected keyword argument 'shift_labels'")

    monkeypatch.setattr(device, "hf_twin", lambda model, folder: Old())
    rows = device.bench_device("gpt-tiny", batch=1, length=8, steps=1, rounds=1, compiles=(False,), device="cpu",
                               variants=["zoo", "hf"], warmup=0)  # fmt: skip
    assert [(r["model"], r["tokens_per_s"] is not None) for r in rows] == [("zoo", True), ("hf", False)]
    assert "shift_labels" in rows[1]["error"] and rows[0]["vs_hf"] is None
    device.report(rows)  # the failed row is a line, the table has zoo's

    def fails():
        raise ImportError("cannot import name 'CompileConfig'")

    import decoding

    failed = {}
    calls = {"zoo": lambda: torch.zeros(1), "hf static compiled": fails}
    measured, outputs = decoding.rates(calls, 1, rounds=1, warmup=1, failed=failed)
    assert list(measured) == ["zoo"] and "CompileConfig" in failed["hf static compiled"]


@pytest.mark.slow
def test_the_quick_dry_run_runs_every_step_on_the_cpu(tmp_path):
    out = tmp_path / "gpu_check"
    done = _check(out, "--quick", "--dry-run", CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert {name: status for name, (status, _) in _summary(out).items()} == {
        "install": "skipped (dry run)",
        **dict.fromkeys(QUICK_STEPS[1:], "ok"),
    }
    figures = json.loads((out / "gpu_check.json").read_text())
    assert set(figures["benchmarks"]) == {"training", "decoding"}
    for name in EXPERIMENTS:  # 30 steps of each, as on a GPU
        assert figures["experiments"][name]["steps"] == 30, figures["experiments"][name]
    pace = figures["paces"]["translator"]
    assert pace["gpu_tokens_per_s"] > 0 and pace["cpu_tokens_per_s"] > 0 and pace["gpu_vs_cpu"] > 0
