"""zoo-bench decoding: tokens/s of greedy ``generate`` against transformers, each side at its best.

    python scripts/bench/decoding.py                  # the zoo-bench GPT-2, batch 1 and 8: ~5 min on 2 cores
    python scripts/bench/decoding.py --batches 1 --new-tokens 100 --rounds 3 --json decoding.json

One process, one set of weights: an HF GPT-2 built at random (seed 0) and converted with
``zoo.from_hf``. Four variants decode the same prompts, in rotating order over ``--rounds`` rounds so
that drift on a shared machine hits all of them:

- ``zoo``: ``generate`` with its growing KV cache, eager;
- ``zoo compiled``: ``generate(compile=True)``, a static cache and a compiled single-token step;
- ``hf``: transformers' ``generate`` with its dynamic cache, eager;
- ``hf static compiled``: ``cache_implementation="static"`` and a ``CompileConfig`` that compiles its
  forward on the CPU too (transformers compiles only on accelerators unless asked).

``vs HF eager`` compares each variant with transformers' eager ``generate``: for ``zoo`` that is
eager against eager at equal precision (the default model is the GPT-2 shape whose eager decoding
once fell behind transformers': 6 layers, d_model 384, vocabulary 8192; the goal is >= 1.3x).

Each call decodes ``--new-tokens`` tokens after a 16-token prompt (the prompt's step included); the
first call of each variant (where compilation happens) is not timed. Reported: median tokens/s, the
ratio of each zoo variant to the faster HF variant, whether all four give the same tokens, and the
memory-bandwidth bound: a step reads every weight once, so steps/s can be at most the machine's copy
bandwidth (bytes read and written by ``copy_``) divided by the weights' bytes. It is measured twice:
with 512 MiB buffers (main memory) and with buffers of the weights' size, which a large last-level
cache may hold; a model that fits in that cache can pass the first bound, never the second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # a checkout's scripts/bench/ is no package: its siblings are imported from here
    sys.path.insert(0, str(HERE))

from hf_compare import hf_model, machine_info  # noqa: E402

import zoo  # noqa: E402
from zoo.io import atomic_write_text  # noqa: E402

VARIANTS = ("zoo", "zoo compiled", "hf", "hf static compiled")


def copy_bandwidth(nbytes: int, repeats: int = 20) -> float:
    """Bytes per second that ``copy_`` moves (read + write) between two buffers of ``nbytes``: best of ``repeats``."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * src.element_size() / best


def decoders(hf: Any, ours: zoo.ZooModel, prompt: torch.Tensor, new: int) -> dict[str, Callable[[], torch.Tensor]]:
    """One greedy call per variant, each returning prompt + ``new`` tokens."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import CompileConfig

    mask = torch.ones_like(prompt)
    common = dict(attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    compile_config = CompileConfig(mode="default")  # reduce-overhead means CUDA graphs; there are none on a CPU
    compile_config._compile_all_devices = True  # transformers' switch for compiling on the CPU
    static = GenerationConfig(
        cache_implementation="static",
        compile_config=compile_config,
        **{k: v for k, v in common.items() if k != "attention_mask"},
    )
    return {
        "zoo": lambda: ours.generate(prompt, new, eos_token_id=None),
        "zoo compiled": lambda: ours.generate(prompt, new, eos_token_id=None, compile=True),
        "hf": lambda: hf.generate(prompt, **common),
        "hf static compiled": lambda: hf.generate(prompt, attention_mask=mask, generation_config=static),
    }


def rates(
    calls: dict[str, Callable[[], torch.Tensor]], tokens: int, rounds: int, warmup: int
) -> tuple[dict[str, list[float]], dict[str, torch.Tensor]]:
    """tokens/s of each call over ``rounds`` rounds in rotating order, after ``warmup`` untimed calls;
    and each call's output."""
    outputs = {}
    for name, call in calls.items():
        for _ in range(warmup):
            outputs[name] = call()
    measured: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            calls[name]()
            measured[name].append(tokens / (time.perf_counter() - start))
    return measured, outputs


def bench(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    hf = hf_model("gpt2", layers=args.layers, d=args.d_model, heads=args.heads, vocab=args.vocab, ctx=1024).eval()
    ours = zoo.from_hf(hf).eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in ours.parameters())
    bandwidth = {"memory": copy_bandwidth(512 * 2**20), "weights-sized": copy_bandwidth(weight_bytes)}
    rows = []
    for batch in args.batches:
        prompt = torch.randint(5, args.vocab, (batch, 16), generator=torch.Generator().manual_seed(batch))
        with torch.inference_mode():
            measured, outputs = rates(
                decoders(hf, ours, prompt, args.new_tokens), batch * args.new_tokens, args.rounds, args.warmup
            )
        medians = {name: statistics.median(values) for name, values in measured.items()}
        best_hf = max(medians["hf"], medians["hf static compiled"])
        same = all(torch.equal(out, outputs["zoo"]) for out in outputs.values())
        for name in VARIANTS:
            values = measured[name]
            steps_per_s = medians[name] / batch  # each step reads every weight once, whatever the batch
            rows.append(
                {
                    "batch": batch,
                    "variant": name,
                    "tokens_per_s": medians[name],
                    "spread": [min(values), max(values)],
                    "vs_best_hf": medians[name] / best_hf,
                    "vs_hf_eager": medians[name] / medians["hf"],  # zoo eager / hf: equal precision, no compile
                    "bandwidth_fraction": {k: steps_per_s * weight_bytes / b for k, b in bandwidth.items()},
                    "same_tokens": same,
                }
            )
            _report(rows[-1])
    return {
        "weights_mib": weight_bytes / 2**20,
        "copy_gib_per_s": {k: b / 2**30 for k, b in bandwidth.items()},
        "bound_steps_per_s": {k: b / weight_bytes for k, b in bandwidth.items()},
        "rows": rows,
    }


def _report(row: dict[str, Any]) -> None:
    print(
        f"batch {row['batch']} {row['variant']:>20}: {row['tokens_per_s']:8.1f} tok/s "
        f"({row['vs_best_hf']:.2f}x the faster HF, {row['vs_hf_eager']:.2f}x HF eager)",
        flush=True,
    )


def print_table(out: dict[str, Any]) -> None:
    gib, bound = out["copy_gib_per_s"], out["bound_steps_per_s"]
    table = Table(
        title=f"greedy decoding, {out['config']['new_tokens']} new tokens, weights "
        f"{out['weights_mib']:.1f} MiB; copy bandwidth {gib['memory']:.1f} GiB/s in memory "
        f"(bound {bound['memory']:.0f} steps/s), {gib['weights-sized']:.1f} GiB/s weights-sized "
        f"(bound {bound['weights-sized']:.0f} steps/s)"
    )
    for column in (
        "batch",
        "variant",
        "tok/s (min..max)",
        "vs faster HF",
        "vs HF eager",
        "of memory bound",
        "of weights-sized",
        "same tokens",
    ):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for row in out["rows"]:
        fraction = row["bandwidth_fraction"]
        table.add_row(
            str(row["batch"]),
            row["variant"],
            f"{row['tokens_per_s']:,.0f} ({row['spread'][0]:,.0f}..{row['spread'][1]:,.0f})",
            f"{row['vs_best_hf']:.2f}x",
            f"{row['vs_hf_eager']:.2f}x",
            f"{fraction['memory']:.0%}",
            f"{fraction['weights-sized']:.0%}",
            str(row["same_tokens"]),
        )
    Console().print(table)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/bench/decoding.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per variant (the first compiles)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--json", default=None, help="also write the results here")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cli = build_parser()
    args = cli.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = {"machine": machine_info(cli), "config": vars(args)}
    out.update(bench(args))
    print_table(out)
    if args.json:
        atomic_write_text(args.json, json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
