"""zoo-bench: zoo against Hugging Face ``transformers``, side by side in one process.

Both sides get the same weights (the HF model is built at random and converted with
``zoo.from_hf``), the same batch, the same precision and no dropout; runs alternate (zoo, HF, HF,
zoo, ...) so that drift on a shared machine hits both. Reported: median tokens/s, the spread
(min..max over rounds) and the ratio zoo/HF of the medians. Each side does what it does when it
trains: zoo's mlm task runs BERT's MLM head on the masked positions only, HF's
``BertForMaskedLM`` on every position.

    python scripts/bench/hf_compare.py          # everything (about 15 minutes on 2 CPU cores)
    python scripts/bench/hf_compare.py --only train --families gpt2 llama --rounds 3
    python scripts/bench/hf_compare.py --json bench.json

The GPU run of scripts/gpu_check.sh is scripts/bench/device.py.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import date
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # a checkout's scripts/bench/ is no package: its helpers are imported from here
    sys.path.insert(0, str(HERE))

from _hf_models import FAMILIES, hf_model, train_steps  # noqa: E402
from _peak_memory import peak_memory  # noqa: E402
from _peak_memory import peak_rss as _peak_rss  # noqa: E402, F401 (memory.py and lora.py import it from here)
from _peak_memory import reset_peak_rss as _reset_peak_rss  # noqa: E402, F401 (as _peak_rss)
from _side_by_side import Result, alternate, report, summarize  # noqa: E402

import zoo  # noqa: E402


def bench_training(args: argparse.Namespace) -> list[Result]:
    """Training tokens/s of both sides: one Result per family and precision (``--compile``: both compiled)."""
    results = []
    for family in args.families:
        torch.manual_seed(0)
        hf = hf_model(family, layers=args.layers, d=args.d_model, heads=args.heads, vocab=args.vocab, ctx=1024).train()
        ours = zoo.from_hf(hf).train()
        if args.compile:  # both sides, in place (torch.compile's default inductor backend)
            hf.compile()
            ours.compile()
        zoo_fn, hf_fn = train_steps(family, hf, ours, args.batch, args.length)
        for precision in args.precisions:
            zoo_rates, hf_rates = alternate(
                zoo_fn,
                hf_fn,
                args.batch * args.length,
                args.rounds,
                args.steps,
                autocast=precision == "bf16",
                warmup=2 if args.compile else 1,
            )
            name = f"train {family} {precision}" + (" compiled" if args.compile else "")
            results.append(summarize(name, zoo_rates, hf_rates))
            report(results[-1])
        del hf, ours
    return results


def bench_generation(args: argparse.Namespace) -> list[Result]:
    """Cached greedy ``generate`` of GPT-2, zoo against HF at batch 1 and 8; then zoo's cached decoding
    against recomputing the whole prefix at each step, for each of ``--cache-lengths``."""
    results = []
    torch.manual_seed(0)
    hf = hf_model("gpt2", layers=args.layers, d=args.d_model, heads=args.heads, vocab=args.vocab, ctx=1024).eval()
    ours = zoo.from_hf(hf).eval()
    for batch in (1, 8):
        prompt = torch.randint(5, args.vocab, (batch, 16), generator=torch.Generator().manual_seed(batch))
        n = args.new_tokens

        def zoo_fn(prompt: torch.Tensor = prompt, n: int = n) -> None:
            ours.generate(prompt, n, eos_token_id=None)

        def hf_fn(prompt: torch.Tensor = prompt, n: int = n) -> None:
            hf.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
                use_cache=True,
            )

        with torch.inference_mode():
            zoo_rates, hf_rates = alternate(zoo_fn, hf_fn, batch * n, args.rounds, 1, autocast=False)
        results.append(summarize(f"generate gpt2 batch {batch}, {n} new tokens (cached)", zoo_rates, hf_rates))
        report(results[-1])
    prompt = torch.randint(5, args.vocab, (1, 16), generator=torch.Generator().manual_seed(0))
    for n in args.cache_lengths:
        cached = lambda n=n: ours.generate(prompt, n, eos_token_id=None)
        uncached = lambda n=n: ours.generate(prompt, n, eos_token_id=None, use_cache=False)
        with torch.inference_mode():
            c_rates, u_rates = alternate(cached, uncached, n, max(1, args.rounds // 2), 1, autocast=False)
        results.append(summarize(f"zoo cache vs recompute, {n} new tokens", c_rates, u_rates, baseline="zoo uncached"))
        report(results[-1])
    return results


def bench_first_step(args: argparse.Namespace) -> dict[str, float]:
    """Seconds from launching zoo-train (tiny experiment) to the end of its first optimizer step."""
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [
            sys.executable,
            "-m",
            "tasks.cli.train",
            "trainer.max_steps=1",
            "trainer.limit_val_batches=0",
            "trainer.num_sanity_val_steps=0",
            "test=false",
            "callbacks=none",
            "logger=[]",
            f"hydra.run.dir={run_dir}",
            "data.source_args.max_files=200",
        ]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return {"seconds_to_first_step": seconds}


def main(argv: list[str] | None = None) -> None:
    """The script: run, print the table, write the JSON."""
    run(argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/bench/hf_compare.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only",
        choices=("train", "generate", "first-step", "memory"),
        nargs="*",
        default=["train", "generate", "first-step", "memory"],
    )
    parser.add_argument("--families", nargs="*", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--precisions", nargs="*", default=["fp32", "bf16"], choices=("fp32", "bf16"))
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds per comparison")
    parser.add_argument("--steps", type=int, default=2, help="training steps per round")
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument(
        "--cache-lengths", type=int, nargs="*", default=[128, 512], help="new tokens for the cache-vs-recompute runs"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile both models for the training runs")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--json", default="bench.json", help="where to write the results")
    return parser


def machine_info(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Date, platform and versions, recorded with the results; an error without transformers."""
    machine = {
        "date": date.today().isoformat(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    try:
        import transformers

        machine["transformers"] = transformers.__version__
    except ImportError:
        parser.error("zoo-bench compares against transformers: pip install -e '.[dev]'")
    return machine


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """``main`` returning what it measured (the dict written as JSON)."""
    cli = build_parser()
    args = cli.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = machine_info(cli)
    Console().print(f"zoo-bench on {machine}")
    results: list[Result] = []
    out: dict[str, Any] = {"machine": machine, "config": vars(args)}
    if "train" in args.only:
        results += bench_training(args)
    if "generate" in args.only:
        results += bench_generation(args)
    if "memory" in args.only:
        out["peak_memory_mib"] = {
            f"{family} {precision} {side}": peak_memory(family, precision, side, args)
            for family in args.families
            for precision in args.precisions
            for side in ("zoo", "hf")
        }
    if "first-step" in args.only:
        out.update(bench_first_step(args))
    out["results"] = [{**asdict(r), "ratio": r.ratio} for r in results]
    print_summary(results, out)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
    return out


def print_summary(results: list[Result], out: dict[str, Any]) -> None:
    """The table of results, then the peak memory and the time to the first step where measured."""
    machine = out["machine"]
    table = Table(title=f"zoo-bench {machine['date']}, {machine['threads']} threads, torch {machine['torch']}")
    for column in ("benchmark", "zoo tok/s (min..max)", "other tok/s (min..max)", "ratio"):
        table.add_column(column, justify="left" if column == "benchmark" else "right")
    for r in results:
        table.add_row(
            r.name,
            f"{r.zoo_tokens_per_s:,.0f} ({r.zoo_spread[0]:,.0f}..{r.zoo_spread[1]:,.0f})",
            f"{r.hf_tokens_per_s:,.0f} ({r.hf_spread[0]:,.0f}..{r.hf_spread[1]:,.0f})",
            f"{r.ratio:.2f}x",
        )
    Console().print(table)
    if "peak_memory_mib" in out:
        Console().print({k: round(v, 1) for k, v in out["peak_memory_mib"].items()})
    if "seconds_to_first_step" in out:
        Console().print(f"zoo-train to first optimizer step: {out['seconds_to_first_step']:.1f} s")


if __name__ == "__main__":
    main()
