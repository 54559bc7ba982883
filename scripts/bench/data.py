"""zoo-bench data: zoo-train's data path on a user's own corpus as it grows, measured end to end.

    python scripts/bench/data.py --sizes 16,64,256,1024 --steps 100   # issue 35's table: an hour or more on 2 cores
    python scripts/bench/data.py --quick                               # a check that every part runs: ~25 s
    python scripts/bench/data.py --sizes 1 --steps 5 --work /tmp/bench-data --keep --out bench_data.json

The corpora. For each size (MB = 2**20 bytes) a folder ``<work>/corpus-<size>MB/`` of .txt files
(``part-00000.txt``, ... of about 4 MB each) is written from text that is on every such machine, in this
order: the .py files of this Python's standard library, then of its site-packages, then the files under
/usr/share/doc where there is such a folder (those that are not UTF-8 or hold a NUL byte, such as the
.gz ones, are skipped); each tree walked in sorted order (a folder's files, then its subfolders), each
real file once. The files are copied byte for byte, one after the other, until the size is reached
(the last one cut at the end of the line that reaches it). Where they hold less text than asked (a
Python with torch and Lightning installed has about 340 MB of .py, /usr/share/doc some 50 MB), they come
round again: in the n-th pass (n >= 2) each file is preceded by the line ``# zoo-bench data: copy <n>
of <path>``, so no two copies are the same bytes. ``.corpus.json`` in the folder records what was
built; a later run with the same --work reuses a corpus of the same size.
zoo's local source reads a .txt file line by line: each line is a record.

For each size, one at a time (the corpus built just before, and removed with its cache after, unless
--keep):

1. ``python -m tasks.cli.train data=local_text data.source_args.path=<corpus> trainer.max_steps=<steps>
   trainer.val_check_interval=<steps> trainer.limit_val_batches=2 test=false callbacks.rich_progress_bar=null
   hydra.run.dir=<a fresh folder>`` plus any --override, in a fresh process with ``ZOO_CACHE=<work>/cache-
   <size>MB`` (emptied first): the first run prepares the corpus (trains the tokenizer on a sample,
   writes the token map) and trains; then the same command again, which should find both in the cache.
   The model is the config's default, gpt-tiny (1.4 M parameters with the data's 8192-token vocabulary):
   100 steps take about 2.5 minutes on 2 cores. For each run: the wall time; the time until training
   starts (the model summary Lightning prints at fit start, when the data is ready and the model built;
   the whole run where that line is missing); the peak resident memory of the process tree (/proc read
   every 0.1 s, the RSS of the process and all its descendants summed: file pages of the token map
   count); its CPU seconds, in all (getrusage) and until training starts (/proc); and the size of the
   cache folder after the first run (and whether the second left it as it was).
2. The loader alone, in this process: zoo-train's config composed with Hydra's compose API (the same
   overrides), ``instantiate(cfg.data)``, ``setup("fit")`` from the cache of step 1, then
   ``train_dataloader()`` iterated for --batches batches after one untimed: tokens per second of
   ``input_ids`` delivered.
3. The tokenizer alone, the bound of preparation: the run's tokenizer encoding the corpus' first 16 MB
   in its thread pool (``encode_batch``), as lines (what a .txt file's records are) and as whole files,
   in MB/s per core.

Derived: preparation time = the first run's start minus the second's (both import, compose and build
the same; the first also trains the tokenizer and writes the map); preparation MB/s per core = corpus MB
/ that time / the cores this process may use; MB per CPU second likewise from the CPU seconds until the
start (the better figure on a machine that other work shares).
The goals of issue 35: peak RSS at the largest corpus within 1.10x of the smallest's, preparation of at
least 5 MB/s per core, a loader of at least 5,000,000 tokens/s, a second run that starts training in
under 10 s. A size that fails is a row with the error's last line (the run's whole output is in
``<work>/<size>MB-<run>.log``); the script then exits 1, after the table and the JSON.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tasks/ is imported from the checkout
    sys.path.insert(0, str(ROOT))

from zoo.io import atomic_write_text  # noqa: E402

MB = 2**20
PART_BYTES = 4 * MB  # about this much text per .txt file of a corpus
CACHE_PER_TEXT = 1.0  # prepared bytes per corpus byte, at most: uint16 ids (~0.65) + one int64 end per line (~0.2)
HEADROOM = 256 * MB  # runs, checkpoints, logs
POLL_S = 0.1
START_LINE = "Parameters:"  # tasks.run.callbacks.ModelSummary, printed when fitting starts
QUICK = ["data.vocab_size=512", "data.seq_len=32", "model.d_model=32", "model.n_heads=2"]
TOKENIZER_BYTES = 16 * MB  # of a corpus' text the tokenizer alone is timed on
GOALS = {"rss_ratio": 1.10, "prepare_mb_per_s_per_core": 5.0, "loader_tokens_per_s": 5_000_000, "start_s": 10.0}


# ---- the corpora ---------------------------------------------------------------------------------------
def text_sources() -> Iterator[Path]:
    """The .py files of this Python's standard library, then of its site-packages, then the files under
    /usr/share/doc: each tree walked in sorted order (a folder's files, then its subfolders), each real
    file once, found as they are asked for (which of them are text is decided on reading)."""
    paths = sysconfig.get_paths()
    stdlib = Path(paths["stdlib"])
    trees = [(stdlib, ".py"), *((Path(paths[k]), ".py") for k in ("purelib", "platlib")), (Path("/usr/share/doc"), "")]
    seen: set[Path] = set()
    for root, suffix in dict.fromkeys(trees):
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if root != stdlib or d not in ("site-packages", "dist-packages"))
            for name in sorted(n for n in names if n.endswith(suffix)):
                path = Path(folder, name)
                with contextlib.suppress(OSError):
                    real = path.resolve()
                    if real not in seen and real.is_file():
                        seen.add(real)
                        yield path


def readable_text(path: Path) -> bytes | None:
    """The bytes of ``path`` when they are UTF-8 text without a NUL byte, else None."""
    try:
        data = path.read_bytes()
        data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return None if b"\0" in data else data


def build_corpus(folder: Path, size_mb: float, sources: Callable[[], Iterable[Path]]) -> dict[str, Any]:
    """``size_mb`` MB of text from the files ``sources()`` names, in .txt files under ``folder``, as the
    module docstring says; what was built (the folder's ``.corpus.json``). A folder that holds a corpus
    of this size already is reused."""
    manifest = folder / ".corpus.json"
    with contextlib.suppress(OSError, ValueError, KeyError):
        built = json.loads(manifest.read_text())
        if built["size_mb"] == size_mb and built["bytes"] == sum(f.stat().st_size for f in folder.glob("*.txt")):
            return built
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    want, total, held, files, copies = int(size_mb * MB), 0, 0, 0, 0
    part: list[bytes] = []  # the next .txt file's texts, ``held`` bytes
    for n, data in texts_round_and_round(sources):
        full = total + len(data) >= want
        if full:
            data = cut_at_line(data, want - total)
        part.append(data)
        total, held, copies = total + len(data), held + len(data), n
        if full or held >= PART_BYTES:
            (folder / f"part-{files:05d}.txt").write_bytes(b"".join(part))
            files, part, held = files + 1, [], 0
        if full:
            break
    built = {"size_mb": size_mb, "bytes": total, "files": files, "copies": copies}
    manifest.write_text(json.dumps(built) + "\n")
    return built


def texts_round_and_round(sources: Callable[[], Iterable[Path]]) -> Iterator[tuple[int, bytes]]:
    """(n, text) of each readable file ``sources()`` names, in the n-th pass over them, without end; from
    the second pass on each text starts with a line that names its copy."""
    for copies in itertools.count(1):
        found, looked = False, 0
        for path in sources():
            looked += 1
            if data := readable_text(path):
                found = True
                yield copies, data if copies == 1 else f"# zoo-bench data: copy {copies} of {path}\n".encode() + data
        if not found:
            raise RuntimeError(f"none of the {looked} files looked at is UTF-8 text to build a corpus from")


def cut_at_line(data: bytes, limit: int) -> bytes:
    """The first ``limit`` bytes of ``data`` and the rest of the line the last of them is in."""
    end = data.find(b"\n", max(limit - 1, 0))
    return data if end < 0 else data[: end + 1]


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0


# ---- one run of zoo-train, watched ---------------------------------------------------------------------
def process_tree(root: int) -> list[int]:
    """Process ``root`` and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                children[int(proc_stat(int(entry.name))[1])].append(int(entry.name))  # the parent's pid
    tree, todo = [], [root]
    while todo:
        tree.append(pid := todo.pop())
        todo += children.get(pid, [])
    return tree


def proc_stat(pid: int) -> list[bytes]:
    """The fields of /proc/<pid>/stat after the command's name: state, parent, ... (``man 5 proc``)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rfind(b")") + 2 :].split()


def tree_rss(root: int) -> int:
    """Resident bytes of process ``root`` and its descendants (a process gone meanwhile counts 0)."""
    total = 0
    for pid in process_tree(root):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/statm", "rb") as f:
            total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return total


def tree_cpu_s(root: int) -> float:
    """CPU seconds of process ``root`` and its descendants so far, the children they reaped included."""
    ticks = 0
    for pid in process_tree(root):
        with contextlib.suppress(OSError):
            ticks += sum(int(v) for v in proc_stat(pid)[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def watched(command: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    """Run ``command``, its output (stdout and stderr) to ``log``: wall seconds, and the seconds and CPU
    seconds until the line ``START_LINE`` (None if it never came); the peak RSS of the process tree in
    MB, its CPU seconds, the exit status, and the last line of its output when it failed."""
    started, cpu, peak = time.perf_counter(), children_cpu_s(), 0
    start: list[tuple[float, float]] = []  # (seconds, CPU seconds) when the start line came
    tail: collections.deque[str] = collections.deque(maxlen=20)
    with open(log, "w", encoding="utf-8") as written:
        process = subprocess.Popen(
            command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )

        def read() -> None:
            for line in process.stdout:
                if not start and START_LINE in line:
                    start.append((time.perf_counter() - started, tree_cpu_s(process.pid)))
                written.write(line)
                tail.append(line.rstrip())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        while process.poll() is None:
            peak = max(peak, tree_rss(process.pid))
            time.sleep(POLL_S)
        reader.join()
    run = {
        "seconds": round(time.perf_counter() - started, 2),
        "start_s": round(start[0][0], 2) if start else None,
        "start_cpu_s": round(start[0][1], 2) if start else None,
        "peak_rss_mb": round(peak / MB, 1),
        "cpu_s": round(children_cpu_s() - cpu, 2),
        "returncode": process.returncode,
    }
    if process.returncode:
        run["error"] = next((line.strip() for line in reversed(tail) if line.strip()), f"exit {process.returncode}")
    return run


# ---- the loader, in this process -----------------------------------------------------------------------
@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` set, as it was afterwards."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def loader_speed(corpus: Path, cache: Path, overrides: list[str], batches: int) -> dict[str, Any]:
    """The LM data module zoo-train builds for ``corpus`` (its config composed, ``instantiate(cfg.data)``),
    set up from ``cache``: the seconds ``setup("fit")`` takes, and tokens/s of ``input_ids`` delivered by
    ``train_dataloader()`` over ``batches`` batches after one untimed."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from tasks.cli.schemas import conf_dir, register_configs

    register_configs()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("train", overrides=["data=local_text", f"data.source_args.path={corpus}", *overrides])
    with environment(ZOO_CACHE=str(cache)):
        datamodule = instantiate(cfg.data, _convert_="all", _recursive_=False)
        started = time.perf_counter()
        datamodule.setup("fit")
        setup_s = time.perf_counter() - started
    batches_seen, tokens = 0, 0
    loader = iter(datamodule.train_dataloader())
    next(loader)
    started = time.perf_counter()
    for batch in loader:
        tokens += batch["input_ids"].numel()
        batches_seen += 1
        if batches_seen >= batches:
            break
    seconds = time.perf_counter() - started
    return {
        "cached_setup_s": round(setup_s, 3),
        "loader_batches": batches_seen,
        "loader_tokens_per_s": round(tokens / seconds) if seconds > 0 else None,
        **tokenizer_speed(corpus, datamodule.tokenizer),
    }


def tokenizer_speed(corpus: Path, tokenizer: Any, most: int = TOKENIZER_BYTES) -> dict[str, Any]:
    """The bound of preparation: MB/s per core at which the run's tokenizer alone encodes the corpus'
    first files (up to ``most`` bytes), in its thread pool (``encode_batch``), as the lines that the
    default run reads and as whole files; nothing else runs meanwhile."""
    from tasks.data.prepared import encode_fast

    texts, size = [], 0
    for file in sorted(corpus.glob("*.txt")):
        if size >= most:
            break
        texts.append(file.read_text(encoding="utf-8"))
        size += len(texts[-1].encode("utf-8"))
    cores, rates = len(os.sched_getaffinity(0)), {}
    for name, items in (("lines", [line for text in texts for line in text.split("\n")]), ("files", texts)):
        started = time.perf_counter()
        for i in range(0, len(items), 4096):
            encode_fast(tokenizer, items[i : i + 4096])
        rates[f"tokenizer_{name}_mb_per_s_per_core"] = round(size / MB / (time.perf_counter() - started) / cores, 2)
    return rates


def last_line(error: BaseException) -> str:
    lines = [line for line in f"{type(error).__name__}: {error}".splitlines() if line.strip()]
    return lines[-1].strip()[:500] if lines else type(error).__name__


# ---- one size ------------------------------------------------------------------------------------------
def bench_size(size_mb: float, args: argparse.Namespace) -> dict[str, Any]:
    """The row of one corpus size (see the module docstring); errors are the row's, not raised."""
    name = f"{size_mb:g}MB"
    corpus, cache = args.work / f"corpus-{name}", args.work / f"cache-{name}"
    row: dict[str, Any] = {"corpus_mb": size_mb, "steps": args.steps, "overrides": args.overrides}
    try:
        built = build_corpus(corpus, size_mb, text_sources)
        row.update(text_bytes=built["bytes"], corpus_files=built["files"], corpus_copies=built["copies"])
    except Exception as error:  # a row that says what broke; the next size still runs
        row["error"] = f"building the corpus: {last_line(error)}"
        return row
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    env = {**os.environ, "ZOO_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}  # lines arrive when printed
    try:
        for run in ("first", "second"):
            run_dir = args.work / f"run-{name}-{run}"
            shutil.rmtree(run_dir, ignore_errors=True)
            row[run] = watched(train_command(corpus, run_dir, args), env, args.work / f"{name}-{run}.log")
            shutil.rmtree(run_dir, ignore_errors=True)
            if run == "first":
                row["cache_mb"] = round(folder_bytes(cache) / MB, 1)
            if "error" in row[run]:
                row["error"] = f"{run} run: {row[run]['error']}"
                return row
        row["cache_reused"] = round(folder_bytes(cache) / MB, 1) == row["cache_mb"]
        row.update(preparation(row))
        try:
            row.update(loader_speed(corpus, cache, args.overrides, args.batches))
        except Exception as error:  # the data module's API changed, or its data: said in the row
            row["loader_error"] = last_line(error)
    finally:
        if not args.keep:
            shutil.rmtree(corpus, ignore_errors=True)
            shutil.rmtree(cache, ignore_errors=True)
    return row


def train_command(corpus: Path, run_dir: Path, args: argparse.Namespace) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tasks.cli.train",
        "data=local_text",
        f"data.source_args.path={corpus}",
        f"trainer.max_steps={args.steps}",
        f"trainer.val_check_interval={args.steps}",
        "trainer.limit_val_batches=2",
        "test=false",
        f"hydra.run.dir={run_dir}",
        "callbacks.rich_progress_bar=null",
        *args.overrides,
    ]


def preparation(row: dict[str, Any]) -> dict[str, Any]:
    """Seconds, MB/s per core and MB per CPU second of preparing the corpus: what the first run took
    more than the second until training started (their whole runs where a start was not seen)."""
    first, second = row["first"], row["second"]
    timed = first["start_s"] is not None and second["start_s"] is not None
    key, cpu_key = ("start_s", "start_cpu_s") if timed else ("seconds", "cpu_s")
    seconds, cpu_s = first[key] - second[key], first[cpu_key] - second[cpu_key]
    mb, cores = row["text_bytes"] / MB, len(os.sched_getaffinity(0))
    return {
        "prepare_s": round(seconds, 2),
        "prepare_cpu_s": round(cpu_s, 2),
        "prepare_timed_by": "start" if timed else "whole run",
        "cores": cores,
        "prepare_mb_per_s_per_core": round(mb / seconds / cores, 2) if seconds > 0 else None,
        "prepare_mb_per_cpu_s": round(mb / cpu_s, 2) if cpu_s > 0 else None,
    }


# ---- the report ----------------------------------------------------------------------------------------
def report(rows: list[dict[str, Any]]) -> None:
    """The table, then each goal of issue 35 against what was measured."""
    header = [
        "corpus MB",
        "prep+steps s",
        "peak RSS 1st MB",
        "2nd run s (start)",
        "peak RSS 2nd MB",
        "cache MB",
        "loader tok/s",
    ]
    lines = []
    for r in rows:
        first, second = r.get("first", {}), r.get("second", {})
        lines.append(
            [
                f"{r['corpus_mb']:g}",
                shown(first.get("seconds")),
                shown(first.get("peak_rss_mb")),
                f"{shown(second.get('seconds'))} ({shown(second.get('start_s'))})",
                shown(second.get("peak_rss_mb")),
                shown(r.get("cache_mb")),
                shown(r.get("loader_tokens_per_s")),
            ]
        )
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    print(" | ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    print("-|-".join("-" * w for w in widths))
    for r, line in zip(rows, lines, strict=True):
        print(" | ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)))
        for key in ("error", "loader_error"):
            if key in r:
                print(f"    {r['corpus_mb']:g} MB {key.replace('_', ' ')}: {r[key]}")
    good = [r for r in rows if "error" not in r]
    if not good:
        return
    print()
    if len(good) >= 2:
        small, large = good[0], good[-1]
        for run in ("first", "second"):
            ratio = large[run]["peak_rss_mb"] / small[run]["peak_rss_mb"]
            goal(
                f"peak RSS, {large['corpus_mb']:g} MB / {small['corpus_mb']:g} MB corpus ({run} runs)",
                f"{ratio:.3f}",
                ratio <= GOALS["rss_ratio"],
                f"<= {GOALS['rss_ratio']}",
            )
    else:
        print("peak RSS ratio: needs two sizes")
    large = good[-1]
    rate = large.get("prepare_mb_per_s_per_core")
    goal(
        f"preparation at {large['corpus_mb']:g} MB, MB/s per core ({large['cores']} cores; "
        f"{shown(large.get('prepare_mb_per_cpu_s'))} MB per CPU second)",
        shown(rate),
        rate is not None and rate >= GOALS["prepare_mb_per_s_per_core"],
        f">= {GOALS['prepare_mb_per_s_per_core']:g}",
    )
    if large.get("tokenizer_lines_mb_per_s_per_core") is not None:
        print(
            f"  the tokenizer alone, the bound of preparation: {large['tokenizer_lines_mb_per_s_per_core']} MB/s "
            f"per core by line, {large['tokenizer_files_mb_per_s_per_core']} by whole file"
        )
    speeds = [r["loader_tokens_per_s"] for r in good if r.get("loader_tokens_per_s")]
    goal(
        "loader tokens/s, the slowest size",
        shown(min(speeds)) if speeds else "-",
        bool(speeds) and min(speeds) >= GOALS["loader_tokens_per_s"],
        f">= {GOALS['loader_tokens_per_s']:,}",
    )
    starts = [r["second"]["start_s"] for r in good]
    whole = None in starts
    start = max(r["second"]["seconds"] if whole else r["second"]["start_s"] for r in good)
    goal(
        "second run, seconds until training starts, the slowest size"
        + (" (whole runs: no start seen)" if whole else ""),
        shown(start),
        start < GOALS["start_s"],
        f"< {GOALS['start_s']:g}",
    )


def shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def goal(what: str, value: str, met: bool, target: str) -> None:
    print(f"{what}: {value} (goal {target}: {'met' if met else 'NOT met'})")


# ---- the command ---------------------------------------------------------------------------------------
def disk_refusal(sizes: list[float], args: argparse.Namespace) -> str | None:
    """One line when ``--work`` has too little room for the biggest corpus and its prepared cache (for
    all of them with --keep); None when it has."""

    def need(size: float) -> float:
        manifest = args.work / f"corpus-{size:g}MB" / ".corpus.json"
        text = 0 if manifest.is_file() else size  # a built corpus is reused
        return (text + size * CACHE_PER_TEXT) * MB

    total = (sum(map(need, sizes)) if args.keep else max(map(need, sizes))) + HEADROOM
    free = shutil.disk_usage(args.work).free
    if free >= total:
        return None
    return (
        f"zoo-bench data: --work {args.work} has {free / MB:,.0f} MB free; the {max(sizes):.10g} MB corpus"
        f"{'s kept (--keep)' if args.keep else ''} and the prepared cache need about {total / MB:,.0f} MB: "
        f"free some, pass --work on a bigger disk, or smaller --sizes"
    )


def sizes_mb(text: str) -> list[float]:
    """``--sizes``: positive MB, comma-separated, smallest first."""
    try:
        sizes = sorted(float(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of MB like 16,64,256") from None
    if sizes[0] <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: every size must be > 0 MB")
    return sizes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/bench/data.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=sizes_mb, default="16,64,256,1024", help="corpus sizes in MB, comma-separated")
    parser.add_argument("--steps", type=int, default=100, help="training steps of each zoo-train run")
    parser.add_argument("--batches", type=int, default=200, help="batches the loader is timed over")
    parser.add_argument(
        "--override",
        dest="overrides",
        action="append",
        default=[],
        help="a zoo-train override for every run and the loader, e.g. model=llama-tiny (repeatable)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a check that every part runs: a 0.1 MB corpus, 2 steps, 5 loader batches, {' '.join(QUICK)}",
    )
    parser.add_argument(
        "--work", type=Path, default=None, help="corpora, caches, runs and logs (default: a temp folder)"
    )
    parser.add_argument("--keep", action="store_true", help="keep each corpus and its cache after measuring it")
    parser.add_argument("--out", "--json", type=Path, default=Path("bench_data.json"), help="the rows as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Every size measured, the table printed, the rows written; 1 when a size failed."""
    args = build_parser().parse_args(argv)
    if args.quick:
        args.sizes, args.steps, args.batches, args.overrides = [0.1], 2, 5, [*QUICK, *args.overrides]
    sizes = args.sizes
    if not Path("/proc/self/statm").is_file():
        sys.exit("zoo-bench data: reads memory from /proc, which this system does not have (Linux only)")
    args.work = (args.work or Path(tempfile.mkdtemp(prefix="zoo-bench-data-"))).resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    if refusal := disk_refusal(sizes, args):
        sys.exit(refusal)
    print(
        f"zoo-train data=local_text, {args.steps} steps a run, model: "
        f"{next((o for o in args.overrides if o.startswith('model=')), 'the default gpt-tiny')}; "
        f"overrides: {' '.join(args.overrides) or 'none'}; work folder: {args.work}",
        flush=True,
    )
    rows = []
    for size in sizes:
        rows.append(bench_size(size, args))
        print(json.dumps(rows[-1]), flush=True)
    print()
    report(rows)
    atomic_write_text(args.out, json.dumps(rows, indent=1) + "\n")
    print(f"rows: {args.out}; logs of the runs: {args.work}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
