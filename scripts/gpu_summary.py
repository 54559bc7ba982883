"""The figures of one scripts/gpu_check.sh in one JSON: the machine, each step's status and seconds,
each experiment's pace (it/s, validation included), tokens/s and final metrics, the translator's steady
pace on the GPU against the CPU's, and the rows of the training, decoding and flex benchmarks. The check
runs it after every step, so that the JSON holds each figure as soon as it is measured (a lease that ends
mid-check keeps what was done); it reads only what the check wrote, imports neither torch nor zoo (it
runs in a second), and rewrites the JSON whole each time (written atomically).

    python scripts/gpu_summary.py outputs/gpu_check/<time>      # writes <that folder>/gpu_check.json

An experiment's run is the folder ``<out>/<step>`` whose step log (``<out>/<step>.log``) ends on
zoo-train's closing table: its ``fit`` row gives the pace, its ``logs/metrics.csv`` the last value of
each logged metric. A step that failed or left no run is reported with what it has. The steady pace of
a run is the median of its logged ``perf/tokens_per_s`` windows after the first (compilation, warm-up).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.metadata
import json
import os
import platform
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCHES = {"training": "gpu_bench.json", "decoding": "decode_bench.json", "flex": "flex_bench.json"}
PACES = {"translator": ("translator_gpu", "translator_cpu")}  # steady pace: (GPU step, CPU step) of one experiment
GOAL_PACE = 3.0  # the translator on a GPU >= 3x its 2-core CPU pace
PACE = re.compile(r"fit\s*│?\s*([\d,]+) steps, ([\d.]+) s, ([\d.]+) it/s")
OUT = "gpu_check.json"


def steps(out: Path) -> list[dict[str, Any]]:
    """The check's steps from its gpu_check.tsv: name, status and seconds."""
    path = out / "gpu_check.tsv"
    if not path.is_file():
        return []
    with path.open(encoding="utf-8") as f:
        return [
            {"step": row["step"], "status": row["status"], "seconds": float(row["seconds"])}
            for row in csv.DictReader(f, delimiter="\t")
        ]


def last_metrics(run: Path) -> dict[str, float]:
    """The last logged value of every metric in ``run``'s logs/metrics.csv (empty if there is none)."""
    path = run / "logs" / "metrics.csv"
    if not path.is_file():
        return {}
    found: dict[str, float] = {}
    with path.open(encoding="utf-8") as f:
        for row in csv.DictReader(f):
            for name, value in row.items():
                if name not in ("step", "epoch") and value not in ("", None):
                    found[name] = float(value)
    return found


def windows(run: Path, metric: str = "perf/tokens_per_s") -> list[float]:
    """Every logged value of ``metric`` in ``run``'s logs/metrics.csv, in order."""
    path = run / "logs" / "metrics.csv"
    if not path.is_file():
        return []
    with path.open(encoding="utf-8") as f:
        return [float(row[metric]) for row in csv.DictReader(f) if row.get(metric) not in ("", None)]


def steady(run: Path) -> float | None:
    """The median tokens/s of ``run``'s windows after the first; None with fewer than two windows."""
    found = windows(run)
    return statistics.median(found[1:]) if len(found) > 1 else None


def paces(out: Path) -> dict[str, Any]:
    """Each experiment's steady pace on the GPU and on the CPU (tokens/s; the batches are alike, so their
    ratio is that of it/s) and the ratio, against GOAL_PACE; what is not measured yet is None."""
    found = {}
    for name, (gpu, cpu) in PACES.items():
        on_gpu, on_cpu = steady(out / gpu), steady(out / cpu)
        ratio = on_gpu / on_cpu if on_gpu and on_cpu else None
        found[name] = {
            "gpu_tokens_per_s": on_gpu,
            "cpu_tokens_per_s": on_cpu,
            "gpu_vs_cpu": ratio,
            "goal": GOAL_PACE,
            "met": None if ratio is None else ratio >= GOAL_PACE,
        }
    return found


def experiment(out: Path, name: str) -> dict[str, Any] | None:
    """An experiment step's figures, or None when ``name`` ran no zoo-train."""
    log, run = out / f"{name}.log", out / name
    if not run.is_dir():
        return None
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    figures: dict[str, Any] = {"run_dir": str(run)}
    pace = PACE.search(text)
    if pace:
        figures.update(steps=int(pace[1].replace(",", "")), fit_seconds=float(pace[2]), it_per_s=float(pace[3]))
    metrics = last_metrics(run)
    figures["metrics"] = {k: v for k, v in metrics.items() if k.startswith(("val/", "test/"))}
    if "perf/tokens_per_s" in metrics:
        figures["tokens_per_s"] = metrics["perf/tokens_per_s"]
    if "perf/mfu" in metrics:
        figures["mfu"] = metrics["perf/mfu"]
    return figures


def machine(out: Path) -> dict[str, Any]:
    """The GPU (from the gpu_info step's nvidia-smi output), torch's version and the date."""
    facts: dict[str, Any] = {"date": datetime.date.today().isoformat(), "python": platform.python_version()}
    for package in ("torch", "transformers", "lightning"):  # from the installed metadata: no import
        try:
            facts[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            facts[package] = None
    info = out / "gpu_info.log"
    if info.is_file():
        rows = [line for line in info.read_text(encoding="utf-8").splitlines() if line and not line.startswith("name")]
        facts["gpus"] = rows
    return facts


def summary(out: Path) -> dict[str, Any]:
    ran = steps(out)
    found: dict[str, Any] = {"machine": machine(out), "steps": ran, "experiments": {}, "benchmarks": {}}
    found["paces"] = paces(out)
    for row in ran:
        figures = experiment(out, row["step"])
        if figures is not None:
            found["experiments"][row["step"]] = {"status": row["status"], **figures}
    for name, file in BENCHES.items():
        path = out / file
        if path.is_file():
            try:
                found["benchmarks"][name] = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as error:  # a step cut off while writing: said, not fatal
                found["benchmarks"][name] = {"error": f"unreadable {file}: {error}"}
    return found


def write_atomically(path: Path, text: str) -> None:
    """``text`` in ``path`` whole or not at all: a reader never sees half a JSON."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu_summary.py", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder of one scripts/gpu_check.sh run")
    parser.add_argument("--quiet", action="store_true", help="write the JSON only (the check, after each step)")
    args = parser.parse_args(argv)
    if not args.out.is_dir():
        print(
            f"zoo: FileNotFoundError: {args.out} is not the folder of a gpu check; give the check's OUT",
            file=sys.stderr,
        )
        return 2
    target = args.out / OUT
    found = summary(args.out)
    write_atomically(target, json.dumps(found, indent=2) + "\n")
    if args.quiet:
        return 0
    for name, figures in found["experiments"].items():
        pace = f"{figures['it_per_s']:.1f} it/s" if "it_per_s" in figures else "no pace"
        print(f"  {name:<26} {figures['status']:<10} {pace}")
    for name, pace in found["paces"].items():
        if pace["gpu_vs_cpu"] is not None:
            verdict = "met" if pace["met"] else "NOT met"
            print(f"  {name} steady pace: {pace['gpu_vs_cpu']:.2f}x the CPU's (goal >= {GOAL_PACE}x: {verdict})")
    print(f"figures in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
