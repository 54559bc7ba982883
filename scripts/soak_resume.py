"""Soak test of exact resume: zoo-train runs interrupted many times at random moments — SIGINT (Ctrl-C),
SIGTERM or SIGKILL (kill -9), chosen at random, a random time after the attempt has logged a step — and
resumed each time with ``zoo-train resume=<run dir>``; at the end each run's metrics.csv must hold the rows
of the same run that never stopped, every loss equal to the bit (timing columns present, any value).

The run is the one of the fault-injection tests (tests/test_resume_anywhere.py, its ``command``: the tiny
generator with dropout, epochs of 5 steps, a validation every 4 steps, a throughput row every 3), with more
steps. When a run ends before the interrupts are made, the next run (the next seed) takes over;
``--parallel`` runs that many at once (a zoo-train start takes seconds, the interrupts' pace is theirs).

    nice -n 5 python -m scripts.soak_resume --interrupts 50 --parallel 3 --minutes 30

Prints each interrupt, then one line: how many interrupts (by signal), in how many attempts and runs, the
time, and whether every row of every run came out as in the uninterrupted run (exit status 0) or which did
not (1). An interrupt that the run does not end on within ``--patience`` seconds is a failure too: the
attempt's Python stacks are printed (faulthandler), it is killed and the run resumed. ``--minutes``: no
interrupt is made after that time (the runs under way are resumed to their end).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' run and their reading of metrics.csv, in one place

from test_resume_anywhere import command, differences, rows  # noqa: E402

SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL}
ENDED = {130, -signal.SIGINT, -signal.SIGKILL, -signal.SIGTERM}  # interrupted (zoo's line), killed, or stopped
# before training (a SIGTERM, or a Ctrl-C while the libraries are imported, which may end by SIGINT after the line)


ZOO_TRAIN = (  # zoo-train's entry point, with Python's stacks printed on SIGUSR1 (an interrupt that is not obeyed)
    "import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1, all_threads=True); "
    "signal.signal(signal.SIGINT, signal.default_int_handler); "  # Ctrl-C as a terminal's: a soak started in the
    "sys.argv[0] = 'zoo-train'; from tasks.cli.verbs import train; train()"  # background (&) has SIGINT ignored
)


def zoo_train(*args: str, log: Path) -> subprocess.Popen:
    """zoo-train with ``args``, its output (the checkpoint a resume starts from, the interrupt's line) in ``log``."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-c", ZOO_TRAIN, *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.is_file() else ""


def written(path: Path) -> tuple[int, int]:
    """When ``path`` was last written, and its size ((0, 0) while there is none)."""
    try:
        info = path.stat()
    except OSError:
        return 0, 0
    return info.st_mtime_ns, info.st_size


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.counts = {name: 0 for name in SIGNALS}
        self.attempts = self.runs = 0
        self.ignored: list[str] = []  # interrupts a run went on after
        self.failed: list[str] = []
        self.stop_at = time.monotonic() + 60 * args.minutes
        self.lock = threading.Lock()

    @property
    def made(self) -> int:
        return sum(self.counts.values())

    def interrupting(self) -> bool:
        return self.made < self.args.interrupts and time.monotonic() < self.stop_at and not self.failed

    def worker(self, index: int) -> None:
        rng = random.Random(self.args.seed * 1000 + index)
        while self.interrupting():
            with self.lock:
                self.runs += 1
                run = self.runs
            try:
                failed = self.run(run, rng)
            except Exception as error:  # noqa: BLE001 - reported as the soak's failure
                failed = f"run {run}: {type(error).__name__}: {error}"
            if failed:
                with self.lock:
                    self.failed.append(failed)

    def run(self, index: int, rng: random.Random) -> str | None:
        """One run: its uninterrupted reference, then attempts interrupted while ``interrupting()``, resumed to
        the end; None when its rows are the reference's, else what differs."""
        args = self.args
        run = [*command(args.setup), f"trainer.max_steps={args.steps}", f"seed={args.seed + index}"]
        whole, run_dir = self.work / f"whole_{index}", self.work / f"run_{index}"
        log = self.work / f"run_{index}.err"
        reference = zoo_train(*run, f"hydra.run.dir={whole}", log=log)
        if reference.wait() != 0:
            return f"run {index}: the uninterrupted run failed:\n{tail(log)}"
        first = [*run, f"hydra.run.dir={run_dir}", f"data.tokenizer_path={whole / 'tokenizer.json'}"]
        while True:
            fresh = not any((run_dir / "checkpoints").glob("*.ckpt"))
            if fresh:  # killed before its first checkpoint: nothing to resume, the run starts again
                shutil.rmtree(run_dir, ignore_errors=True)
            with self.lock:
                self.attempts += 1
                attempt = self.attempts
            if args.keep:  # each attempt's output kept beside the run: which checkpoint it resumed from, how it ended
                log = self.work / f"run_{index}.attempt_{attempt:03d}.log"
            process = zoo_train(*(first if fresh else [f"resume={run_dir}"]), log=log)
            if not self.interrupting():
                if process.wait() != 0:
                    return f"run {index}: the last attempt failed (rc {process.returncode}):\n{tail(log)}"
                break
            metrics = run_dir / "logs" / "metrics.csv"
            before = written(metrics)
            while process.poll() is None and written(metrics) == before:
                time.sleep(0.02)  # the attempt has written the metrics file (a resume, its first rows): training
            time.sleep(rng.uniform(0, args.max_delay))
            name = rng.choice(list(SIGNALS))
            if process.poll() is None:
                process.send_signal(SIGNALS[name])
            try:
                process.wait(timeout=args.patience)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGUSR1)
                time.sleep(3)
                process.kill()
                process.wait()
                with self.lock:
                    self.ignored.append(f"run {index}: {name} not obeyed in {args.patience:.0f} s:\n{tail(log)}")
                print(f"run {index}: {name} NOT OBEYED (the attempt killed, resumed from its last checkpoint)")
                continue
            if process.returncode == 0:
                break  # it finished first
            said = tail(log)
            if process.returncode not in ENDED or (process.returncode == 130 and "Traceback" in said):
                return f"run {index}: attempt ended with rc {process.returncode} after {name}:\n{said}"
            with self.lock:
                self.counts[name] += 1
                made = self.made
            print(f"interrupt {made}: {name} (rc {process.returncode}), run {index}, attempt {attempt}", flush=True)
        got, want = rows(run_dir), rows(whole)
        return None if got == want else f"run {index}: DIFFERENT rows: {differences(got, want)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interrupts", type=int, default=50, help="interrupts to make (default 50)")
    parser.add_argument("--steps", type=int, default=60, help="steps of each run (default 60)")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once (default 1)")
    parser.add_argument("--setup", default="generator", help="a run of tests/test_resume_anywhere.py's SETUPS")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random signals and delays, and the runs'")
    parser.add_argument("--max-delay", type=float, default=2.0, help="seconds after a step is logged (default 2)")
    parser.add_argument("--patience", type=float, default=120.0, help="seconds a run may take to obey (default 120)")
    parser.add_argument("--minutes", type=float, default=60.0, help="no interrupt after this time (default 60)")
    parser.add_argument("--keep", action="store_true", help="keep the runs and attempts' output (printed)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="zoo-soak-"))
    soak = Soak(args, work)
    started = time.perf_counter()
    try:
        workers = [threading.Thread(target=soak.worker, args=(i,)) for i in range(args.parallel)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        by_signal = ", ".join(f"{n} {name}" for name, n in soak.counts.items())
        made = (
            f"soak: {soak.made} interrupts ({by_signal}) in {soak.attempts} attempts of {soak.runs} "
            f"{args.steps}-step {args.setup} runs ({args.parallel} at once), {time.perf_counter() - started:.0f} s"
        )
        for failure in [*soak.failed, *soak.ignored]:
            print(failure)
        if soak.failed or soak.ignored:
            print(f"{made}: {len(soak.failed)} runs FAILED, {len(soak.ignored)} interrupts NOT OBEYED")
            return 1
        print(f"{made}: every metrics row of every run as in the run that never stopped")
        return 0 if soak.made >= args.interrupts else 1
    finally:
        if args.keep:
            print(f"run directories kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
