"""zoo-bench records: the memory a classifier's or a translator's data module takes for a user's JSON Lines
file of records, as the file grows.

    python scripts/bench/records.py --sizes 8,24 --task classifier    # issue 35's record sources
    python scripts/bench/records.py --sizes 1 --task translator

For each size (MB = 2**20 bytes) a JSON Lines file is written into --work from the text scripts/bench/data.py
builds its corpora from (this Python's .py files, then /usr/share/doc), cut into records of about 250
bytes of text at line ends: {"text", "label"} for the classifier (the label: the file's folder under its
tree's root, e.g. ``asyncio``), {"source", "target"} for the translator (a record's first and second
half). Then, in a fresh process: the data module (``ClassificationDataModule`` or
``TranslationDataModule``, source ``local``, 8192-token vocabulary) after the
imports (HF ``datasets`` and ``tokenizers`` included), the peak resident memory reset (Linux:
/proc/self/clear_refs), ``setup("fit")``, and the peak (VmHWM) read: the MB that setting up adds, divided
by the file's MB; and, between the smallest and the largest size, what each further MB of records adds.
The goal of issue 35: at most about 3x the data.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # data.py beside this file: the same text as its corpora

from data import MB, ROOT, readable_text, text_sources  # noqa: E402

RECORD_BYTES = 250
GOAL = 3.0
MODULES = {"classifier": "ClassificationDataModule", "translator": "TranslationDataModule"}
PROBE = """
import json, sys, time
sys.path.insert(0, {root!r})
import datasets, tokenizers  # imported before the peak is reset: the libraries are not the data
from tasks.data import {module}

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

data = {module}(source="local", source_args={{"path": {path!r}}}, vocab_size=8192, seq_len=128)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM from here
before, started = status("VmRSS"), time.perf_counter()
data.setup("fit")
print(json.dumps({{"added_mb": (status("VmHWM") - before) / 2**20, "seconds": time.perf_counter() - started,
                  "examples": sum(len(d) for d in data.datasets.values())}}))
"""


def records(task: str) -> Iterator[dict[str, str]]:
    """Records of about RECORD_BYTES of text each, cut at line ends, from the corpora's text."""
    for path in text_sources():
        data = readable_text(path)
        if not data:
            continue
        label = path.parent.name or "root"
        text, held = data.decode("utf-8"), []
        for line in text.splitlines():
            held.append(line)
            if sum(map(len, held)) >= RECORD_BYTES:
                chunk = "\n".join(held)
                held = []
                if task == "classifier":
                    yield {"text": chunk, "label": label}
                else:
                    half = len(chunk) // 2
                    yield {"source": chunk[:half], "target": chunk[half:]}


def build(file: Path, size_mb: float, task: str) -> int:
    """A JSON Lines file of at least ``size_mb`` MB of records (reused when it is there); its bytes."""
    if not file.is_file():
        written = 0
        with open(file.with_suffix(".part"), "w", encoding="utf-8") as out:
            for record in records(task):
                line = json.dumps(record, ensure_ascii=False) + "\n"
                out.write(line)
                written += len(line.encode("utf-8"))
                if written >= size_mb * MB:
                    break
        file.with_suffix(".part").rename(file)
    return file.stat().st_size


def measure(size_mb: float, task: str, work: Path) -> dict[str, float]:
    file = work / f"{task}-{size_mb:g}MB.jsonl"
    size = build(file, size_mb, task)
    code = PROBE.format(root=str(ROOT), module=MODULES[task], path=str(file))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the {task} data module failed on {file}: {done.stderr.strip().splitlines()[-1:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    return {"task": task, "file_mb": round(size / MB, 2), **row, "ratio": round(row["added_mb"] / (size / MB), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench/records.py", description=__doc__)
    parser.add_argument("--sizes", default="8,24", help="file sizes in MB, comma-separated")
    parser.add_argument("--task", choices=sorted(MODULES), default="classifier")
    parser.add_argument("--work", type=Path, default=None, help="the files (default: a temp folder)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="zoo-bench-records-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = [measure(float(size), args.task, work) for size in args.sizes.split(",")]
    print(f"{'file MB':>8} | {'setup adds MB':>13} | {'x the file':>10} | {'setup s':>7} | examples")
    for r in rows:
        added, seconds = f"{r['added_mb']:.1f}", f"{r['seconds']:.1f}"
        print(f"{r['file_mb']:>8} | {added:>13} | {r['ratio']:>10} | {seconds:>7} | {r['examples']:,}")
    largest = rows[-1]
    verdict = "met" if largest["ratio"] <= GOAL else "NOT met"
    print(f"at {largest['file_mb']} MB setting up adds {largest['ratio']}x the file (goal about {GOAL:g}x: {verdict})")
    if len(rows) > 1:  # what each further MB of records costs, the fixed part (threads, caches) left out
        small = rows[0]
        slope = (largest["added_mb"] - small["added_mb"]) / (largest["file_mb"] - small["file_mb"])
        print(f"each further MB of records, from {small['file_mb']} to {largest['file_mb']} MB, adds {slope:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
