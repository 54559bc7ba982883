"""zoo-bench data: zoo-train on a user's own corpus as it grows, the prepared path measured end to end.

    python scripts/bench/data.py --sizes 16,64,256,1024 --steps 100   # the README's table (about an hour on 2 cores)
    python scripts/bench/data.py --sizes 1 --steps 2 --json bench_data.json

For each size (MB) it builds a corpus of .txt files (4 MB each) from text every Python machine has: the
.py files of this Python's standard library and site-packages, in sorted order; where they hold less
text than asked, the files come round again, each copy behind a line ``# copy <n> of <path>`` so that
no two copies are the same text. Then it runs the real command twice on it, each in a fresh process:

    zoo-train data=local_text data.source_args.path=<corpus> trainer.max_steps=<steps> ...

with ``ZOO_CACHE`` pointing at a cache of its own: the first run prepares the corpus (tokenizer trained
on its sample, ids written into the memory map) and trains, the second finds both in the cache and
trains. For each run: wall time and the peak resident memory of the process (and any it starts),
polled every 0.05 s. Then the loader alone, in this process: tokens per second of training batches
read from the prepared map (``LMDataModule.train_dataloader``, batch 16 x 257). The goals of issue 35:
training memory within 10% from the smallest corpus to the largest, preparation at least 5 MB/s per
core, a loader of at least 5 million tokens/s, a second run that starts training in under 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tasks/ is imported from the checkout
    sys.path.insert(0, str(ROOT))

from zoo.io import atomic_write_text  # noqa: E402

MB = 2**20
PART = 4 * MB
SMALL = ["data.vocab_size=8192", "trainer.limit_val_batches=2", "test=false", "callbacks.rich_progress_bar=null"]


def sources() -> list[Path]:
    """The .py files of this Python (stdlib, then site-packages), sorted: text on every machine."""
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])]
    files = []
    for root in dict.fromkeys(roots):
        files += sorted(
            p for p in root.rglob("*.py") if p.is_file() and "site-packages" not in p.relative_to(root).parts
        )
    return files


def build_corpus(folder: Path, size_mb: float) -> int:
    """``size_mb`` MB of text in 4 MB .txt files under ``folder`` (reused when it is there already)."""
    done = folder / ".complete"
    if done.is_file():
        return int(done.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    want, total, part, buffer, copy = int(size_mb * MB), 0, 0, [], 0
    files = sources()
    while total < want:
        copy += 1
        for path in files:
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            text = f"# copy {copy} of {path.name}\n{text}" if copy > 1 else text
            buffer.append(text)
            total += len(text.encode("utf-8"))
            if sum(map(len, buffer)) >= PART or total >= want:
                (folder / f"part{part:05d}.txt").write_text("".join(buffer), encoding="utf-8")
                part, buffer = part + 1, []
            if total >= want:
                break
    done.write_text(str(total))
    return total


def measured(command: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Wall seconds, peak RSS (MB, the process and its children) and the exit status of ``command``."""
    started, peak = time.perf_counter(), 0
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        watched = psutil.Process(process.pid)
        while process.poll() is None:
            try:
                rss = watched.memory_info().rss + sum(c.memory_info().rss for c in watched.children(recursive=True))
                peak = max(peak, rss)
            except psutil.Error:
                pass
            time.sleep(0.05)
        log.seek(0)
        tail = log.read().decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    row = {"seconds": round(time.perf_counter() - started, 2), "peak_rss_mb": round(peak / MB, 1)}
    if process.returncode != 0:
        row["error"] = tail[0][-300:]
    return row


def loader_speed(corpus: Path, cache: Path, batches: int) -> tuple[float, float]:
    """Seconds the data module takes to set up from the cache (what a second run waits for its data), and
    tokens per second of training batches read from the prepared map, in this process."""
    from tasks.data import LMDataModule

    dm = LMDataModule(
        source="local",
        source_args={"path": str(corpus)},
        cache_dir=str(cache),
        vocab_size=8192,
        seq_len=256,
        batch_size=16,
        val_fraction=0.02,
        test_fraction=0.02,
    )
    ready = time.perf_counter()
    dm.setup("fit")
    ready = time.perf_counter() - ready
    loader, tokens = dm.train_dataloader(), 0
    started = time.perf_counter()
    for n, batch in enumerate(loader):
        tokens += batch["input_ids"].numel()
        if n + 1 >= batches:
            break
    return ready, tokens / (time.perf_counter() - started)


def bench(size_mb: float, args: argparse.Namespace) -> dict[str, Any]:
    corpus, cache = args.work / f"corpus-{size_mb:g}MB", args.work / f"cache-{size_mb:g}MB"
    shutil.rmtree(cache, ignore_errors=True)
    row: dict[str, Any] = {"corpus_mb": size_mb, "text_bytes": build_corpus(corpus, size_mb)}
    env = {**os.environ, "ZOO_CACHE": str(cache), "PYTHONWARNINGS": "ignore"}
    for name in ("first", "second"):
        run_dir = args.work / f"run-{size_mb:g}MB-{name}"
        shutil.rmtree(run_dir, ignore_errors=True)
        command = [
            sys.executable,
            "-m",
            "tasks.cli.train",
            "data=local_text",
            f"data.source_args.path={corpus}",
            f"trainer.max_steps={args.steps}",
            f"trainer.val_check_interval={args.steps}",
            *SMALL,
            f"hydra.run.dir={run_dir}",
        ]
        row[name] = measured(command, env)
        shutil.rmtree(run_dir, ignore_errors=True)
    row["cache_mb"] = round(sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) / MB, 1)
    if "error" not in row["first"]:
        prep = row["first"]["seconds"] - row["second"]["seconds"]
        row["prepare_mb_per_s_per_core"] = round(row["text_bytes"] / MB / max(prep, 1e-3) / (os.cpu_count() or 1), 2)
        try:
            ready, speed = loader_speed(corpus, cache, args.batches)
            row["cached_setup_s"], row["loader_tokens_per_s"] = round(ready, 2), round(speed)
        except Exception as error:  # a row that says what broke, not a traceback that ends the bench
            row["loader_error"] = f"{type(error).__name__}: {error}"[:300]
    if not args.keep:
        shutil.rmtree(corpus, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    return row


def report(rows: list[dict[str, Any]]) -> None:
    print(
        "corpus MB | 1st run s | 1st peak RSS MB | 2nd run s | 2nd peak RSS MB | cache MB | prep MB/s/core | "
        "cached setup s | loader tok/s"
    )
    for r in rows:
        first, second = r["first"], r["second"]
        print(
            f"{r['corpus_mb']:>9g} | {first['seconds']:>9} | {first['peak_rss_mb']:>15} | {second['seconds']:>9} | "
            f"{second['peak_rss_mb']:>15} | {r['cache_mb']:>8} | {r.get('prepare_mb_per_s_per_core', '-'):>14} | "
            f"{r.get('cached_setup_s', '-'):>14} | "
            f"{r.get('loader_tokens_per_s', '-'):>12,}"
            + (f"  error: {first.get('error') or second.get('error')}" if "error" in first or "error" in second else "")
        )
    good = [r for r in rows if "error" not in r["first"] and "error" not in r["second"]]
    if len(good) >= 2:
        ratio = good[-1]["second"]["peak_rss_mb"] / good[0]["second"]["peak_rss_mb"]
        print(f"training RSS, largest / smallest corpus (second runs): {ratio:.3f} (goal <= 1.10)")
    if good:
        setup = good[-1].get("cached_setup_s", "-")
        print(f"the largest corpus, prepared: its data ready in {setup} s (goal: training starts in < 10 s)")


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="scripts/bench/data.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="16,64", help="corpus sizes in MB, comma-separated")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batches", type=int, default=200, help="batches the loader is timed over")
    parser.add_argument("--work", type=Path, default=None, help="where corpora, caches and runs go (a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the corpora and caches")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    args.work = args.work or Path(tempfile.mkdtemp(prefix="zoo-bench-data-"))
    args.work.mkdir(parents=True, exist_ok=True)
    need = max(sizes) * MB * (2 if not args.keep else len(sizes) * 2) * 1.5  # text, its map, room
    free = shutil.disk_usage(args.work).free
    if free < need:
        sys.exit(
            f"zoo: UserError: --work={args.work}: {free / MB:,.0f} MB free, the corpora need about {need / MB:,.0f}"
        )
    rows = []
    for size in sizes:
        rows.append(bench(size, args))
        print(json.dumps(rows[-1]), flush=True)
    report(rows)
    if args.json:
        atomic_write_text(args.json, json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
