"""The figures of one scripts/gpu_check.sh in one JSON: the machine, each step's status and seconds,
each experiment's pace (it/s, validation included), tokens/s and final metrics, and the rows of the
training, decoding and flex benchmarks. The last step of the check; it reads only what the check wrote.

    python scripts/gpu_summary.py outputs/gpu_check/<time>      # writes <that folder>/gpu_check.json

An experiment's run is the folder ``<out>/<step>`` whose step log (``<out>/<step>.log``) ends on
zoo-train's closing table: its ``fit`` row gives the pace, its ``logs/metrics.csv`` the last value of
each logged metric. A step that failed or left no run is reported with what it has.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import platform
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout: zoo is importable without installing

from zoo.io import atomic_write_text  # noqa: E402

BENCHES = {"training": "gpu_bench.json", "decoding": "decode_bench.json", "flex": "flex_bench.json"}
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
    try:
        import torch  # noqa: PLC0415  (only to read its version)

        facts["torch"] = torch.__version__
        facts["cuda"] = torch.version.cuda
    except ImportError:
        pass
    info = out / "gpu_info.log"
    if info.is_file():
        rows = [line for line in info.read_text(encoding="utf-8").splitlines() if line and not line.startswith("name")]
        facts["gpus"] = rows
    return facts


def summary(out: Path) -> dict[str, Any]:
    ran = steps(out)
    found: dict[str, Any] = {"machine": machine(out), "steps": ran, "experiments": {}, "benchmarks": {}}
    for row in ran:
        figures = experiment(out, row["step"])
        if figures is not None:
            found["experiments"][row["step"]] = {"status": row["status"], **figures}
    for name, file in BENCHES.items():
        path = out / file
        if path.is_file():
            found["benchmarks"][name] = json.loads(path.read_text(encoding="utf-8"))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu_summary.py", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder of one scripts/gpu_check.sh run")
    args = parser.parse_args(argv)
    if not args.out.is_dir():
        print(
            f"zoo: FileNotFoundError: {args.out} is not the folder of a gpu check; give the check's OUT",
            file=sys.stderr,
        )
        return 2
    target = args.out / OUT
    if target.exists():
        print(f"zoo: FileExistsError: {target} exists; summarise a check once", file=sys.stderr)
        return 2
    found = summary(args.out)
    atomic_write_text(target, json.dumps(found, indent=2) + "\n")
    for name, figures in found["experiments"].items():
        pace = f"{figures['it_per_s']:.1f} it/s" if "it_per_s" in figures else "no pace"
        print(f"  {name:<26} {figures['status']:<10} {pace}")
    print(f"figures in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
