"""Test the design article's claims at small scale and write a results page.

    python -m scripts.article.run                       # every experiment (the page says how long it took)
    python -m scripts.article.run --only 4 5 6          # some of them
    python -m scripts.article.run --quick               # a tiny smoke run of every experiment (tests use it)
    python -m scripts.article.run --out docs/article    # update the committed page (an explicit choice)

The page, figures and ``results.json`` go to ``outputs/reproduce/<date>`` unless ``--out`` says
otherwise; training runs go to a fresh temporary folder unless ``--work`` names one.

The trained experiments go through zoo-train's own ``train()`` (Hydra's compose API on ``conf/``, the
``ablation_*`` experiments with overrides, several seeds where a claim's effect is small); the others
measure the library directly. Each experiment returns a record (claim, setup, table, figure, what was
seen, verdict, seeds) that goes into ``results.json``; the results page ``README.md`` is written from
every record in that file, so ``--only`` refreshes some experiments and keeps the others.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from . import ffn, heads, kv_cache, norm, positions, scale, sizes, switches
from .common import Context, console, quiet, shared_tokenizer
from .page import write_page

EXPERIMENTS = {m.NUMBER: m for m in (positions, norm, ffn, scale, kv_cache, sizes, heads, switches)}
"""Number -> module, which defines NUMBER, NAME (for the log), UNITS (the progress units its run reports), TRAINS
(whether it trains, needing the shared tokenizer), ``run(ctx) -> Result`` and optionally ``page_tables(record)``."""
COMMAND = "python -m scripts.article.run"


def machine() -> str:
    """A one-line description of this machine for the results page."""
    return (
        f"{os.cpu_count()}-core CPU ({platform.machine()}, {platform.system()}), "
        f"Python {platform.python_version()}, torch {torch.__version__}"
    )


def run(
    only: Sequence[int], out: Path, work: Path, quick: bool = False, threads: int = 1, command: str = COMMAND
) -> dict[str, Any]:
    """Run the chosen experiments, merge them into ``out/results.json`` and rewrite ``out/README.md``."""
    from tasks.cli.schemas import register_configs

    register_configs()  # the typed schemas and the sweeper that composing zoo-train's config needs
    quiet()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {"experiments": {}}
    ctx = Context(out=out, work=work, quick=quick)
    trains = any(EXPERIMENTS[n].TRAINS for n in only)
    start = time.perf_counter()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=console,
    ) as progress:
        progress.add_task("article", total=sum(EXPERIMENTS[n].UNITS for n in only) + int(trains))
        ctx.progress = progress
        if trains:
            ctx.step("train the shared tokenizer")
            ctx.tokenizer = shared_tokenizer(ctx)
        for number in only:
            t0 = time.perf_counter()
            torch.manual_seed(number)
            result = EXPERIMENTS[number].run(ctx)
            result.seconds = time.perf_counter() - t0
            results["experiments"][str(number)] = result.to_dict()
            console.log(
                f"experiment {number} ({EXPERIMENTS[number].NAME}): agreement {result.agreement}, "
                f"{result.seconds:.0f} s"
            )
            path.write_text(json.dumps(results, indent=1, default=float))
    total = time.perf_counter() - start
    seconds = {k: v["seconds"] for k, v in results["experiments"].items()}
    results["meta"] = {
        "command": command,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "threads": threads,
        "quick": quick,
        "total_seconds": total if set(only) == set(EXPERIMENTS) else sum(seconds.values()),
        "last_run_seconds": total,
    }
    path.write_text(json.dumps(results, indent=1, default=float))
    write_page(out, results, EXPERIMENTS)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.article.run", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--only",
        type=int,
        nargs="+",
        choices=sorted(EXPERIMENTS),
        default=sorted(EXPERIMENTS),
        help="experiment numbers to run (default: all)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where the page, PNGs and JSON go (default: outputs/reproduce/<date>; the committed page: docs/article)",
    )
    parser.add_argument(
        "--work", type=Path, default=None, help="training run directories (default: a fresh temporary folder)"
    )
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run of each experiment (seconds)")
    parser.add_argument("--threads", type=int, default=1, help="PyTorch CPU threads (1 is fastest on shared cores)")
    args = parser.parse_args(argv)
    args.out = args.out or Path("outputs/reproduce") / time.strftime("%Y-%m-%d_%H-%M-%S")
    args.work = args.work or Path(tempfile.mkdtemp(prefix="zoo-article-"))
    command = " ".join([COMMAND, *(sys.argv[1:] if argv is None else argv)])
    results = run(args.only, args.out, args.work, quick=args.quick, threads=args.threads, command=command)
    console.print(f"wrote {args.out / 'README.md'} ({results['meta']['last_run_seconds'] / 60:.1f} min)")
