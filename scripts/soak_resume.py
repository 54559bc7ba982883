"""Soak test of exact resume: a tiny zoo-train run interrupted many times at random moments — SIGINT (Ctrl-C),
SIGTERM or SIGKILL (kill -9), chosen at random, a random time after the attempt has logged a step — and
resumed each time with ``zoo-train resume=<run dir>``; at the end its metrics.csv must hold the rows of the
same run that never stopped, every loss equal to the bit (timing columns present, any value).

    python -m scripts.soak_resume --interrupts 50

Prints each interrupt, then one line: how many interrupts (by signal), how many attempts, the time, and
whether every row came out as in the uninterrupted run (exit status 0) or which did not (1).
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN = [  # the tiny generator of the tests, with dropout, two epochs' boundaries and validations on the way
    "experiment=gpt_generator",
    "data.source_args.max_files=40",
    "data.vocab_size=300",
    "data.seq_len=32",
    "model.d_model=32",
    "model.n_heads=2",
    "model.dropout=0.1",
    "trainer.val_check_interval=5",
    "++trainer.limit_train_batches=7",
    "trainer.limit_val_batches=2",
    "trainer.num_sanity_val_steps=0",
    "trainer.log_every_n_steps=1",
    "callbacks.rich_progress_bar=null",
    "callbacks.rich_model_summary=null",
    "callbacks.throughput.window=3",
    "test=false",
]
SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL}
ENDED = {130, -signal.SIGKILL, -signal.SIGTERM}  # interrupted (zoo's line), killed, or a SIGTERM before training


def rows(run_dir: Path) -> list[tuple[tuple[str, str], ...]]:
    """metrics.csv's rows as sorted (column, value) pairs of their non-empty cells, timings as "…"."""
    path = run_dir / "logs" / "metrics.csv"
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return sorted(
            tuple(sorted((k, "…" if k.startswith("perf/") else v) for k, v in row.items() if v))
            for row in csv.DictReader(f)
        )


def zoo_train(*args: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(
        [sys.executable, "-m", "tasks.cli.train", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def written(path: Path) -> tuple[int, int]:
    """When ``path`` was last written, and its size ((0, 0) while there is none)."""
    try:
        info = path.stat()
    except OSError:
        return 0, 0
    return info.st_mtime_ns, info.st_size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interrupts", type=int, default=50, help="interrupts to make (default 50)")
    parser.add_argument("--steps", type=int, default=0, help="the run's steps (default: 10 per interrupt + 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random signals and delays")
    parser.add_argument("--max-delay", type=float, default=1.0, help="seconds after a step is logged (default 1)")
    parser.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    steps = args.steps or 10 * args.interrupts + 20  # enough that the interrupts come before the end
    work = Path(tempfile.mkdtemp(prefix="zoo-soak-"))
    cwd = Path(__file__).resolve().parent.parent
    run = [*RUN, f"trainer.max_steps={steps}"]
    started = time.perf_counter()
    try:
        whole = work / "whole"
        reference = zoo_train(*run, f"hydra.run.dir={whole}", cwd=cwd)
        _, err = reference.communicate()
        if reference.returncode != 0:
            print(f"the uninterrupted run failed:\n{err[-3000:]}")
            return 1
        run_dir = work / "run"
        first = [*run, f"hydra.run.dir={run_dir}", f"data.tokenizer_path={whole / 'tokenizer.json'}"]
        counts = {name: 0 for name in SIGNALS}
        attempts = 0
        while True:
            fresh = not any((run_dir / "checkpoints").glob("*.ckpt"))
            if fresh:  # killed before its first checkpoint: nothing to resume, the run starts again
                shutil.rmtree(run_dir, ignore_errors=True)
            attempts += 1
            process = zoo_train(*(first if fresh else [f"resume={run_dir}"]), cwd=cwd)
            if sum(counts.values()) >= args.interrupts:
                _, err = process.communicate()
                if process.returncode != 0:
                    print(f"the last attempt failed (rc {process.returncode}):\n{err[-3000:]}")
                    return 1
                break
            metrics, before = run_dir / "logs" / "metrics.csv", written(run_dir / "logs" / "metrics.csv")
            while process.poll() is None and written(metrics) == before:
                time.sleep(0.02)  # the attempt has written the metrics file (a resume, its first rows): training
            time.sleep(rng.uniform(0, args.max_delay))
            name = rng.choice(list(SIGNALS))
            if process.poll() is None:
                process.send_signal(SIGNALS[name])
            _, err = process.communicate()
            if process.returncode == 0:
                break  # it finished first
            if process.returncode not in ENDED or (process.returncode == 130 and "Traceback" in err):
                print(f"attempt {attempts} ended with rc {process.returncode} after {name}:\n{err[-3000:]}")
                return 1
            counts[name] += 1
            print(f"interrupt {sum(counts.values())}: {name} (rc {process.returncode})", flush=True)
        seconds = time.perf_counter() - started
        got, want = rows(run_dir), rows(whole)
        total = sum(counts.values())
        by_signal = ", ".join(f"{n} {name}" for name, n in counts.items())
        if got == want:
            print(
                f"soak: {total} interrupts ({by_signal}) in {attempts} attempts of a {steps}-step run, "
                f"{seconds:.0f} s: every one of the {len(want)} metrics rows as in the run that never stopped"
            )
            return 0
        missing = [dict(r) for r in want if r not in got][:5]
        extra = [dict(r) for r in got if r not in want][:5]
        print(f"soak: {total} interrupts ({by_signal}), {seconds:.0f} s: DIFFERENT rows")
        print(f"  missing: {missing}\n  not in the uninterrupted run: {extra}")
        return 1
    finally:
        if args.keep:
            print(f"run directories kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
