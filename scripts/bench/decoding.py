"""zoo-bench decoding: tokens/s of greedy ``generate`` against transformers, each side at its best.

    python scripts/bench/decoding.py                  # the zoo-bench GPT-2, batch 1 and 8: ~5 min on 2 cores
    python scripts/bench/decoding.py --batches 1 --new-tokens 100 --rounds 3 --json decoding.json
    python scripts/bench/decoding.py --gpu --json decoding_gpu.json            # GPT-2 124M, bf16, on CUDA
    python scripts/bench/decoding.py --gpu --dry-run --json decoding_dry.json  # its steps on the CPU, tiny

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

``--gpu`` is the CUDA-graph check: GPT-2 124M (the HF GPT-2 config at random weights), bf16 on CUDA,
256 new tokens at batch 1 and 16, where ``zoo compiled`` replays its step as a CUDA graph and ``hf
static compiled`` is transformers' own choice on a GPU (``CompileConfig()``: mode "reduce-overhead",
its CUDA graphs). The goals, each reported as met or not: ``zoo compiled`` at >= 1.5x ``hf static
compiled`` at every batch, and >= 2,000 tokens/s at batch 1. ``--dry-run`` runs the same steps on the
CPU at a tiny size, in well under a minute, to show that the script works; its figures mean nothing.

A variant that fails (transformers' static cache on a version without ``CompileConfig``, a compile error)
is a row with its ``error`` and no figures; the others are still measured (ratios to a failed HF variant
are None) and written, and the script exits 1. ``--quick`` with ``--gpu``: 128 new tokens, 2 rounds.
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
GPU = dict(  # --gpu: GPT-2 124M in bf16 on CUDA
    layers=12, d_model=768, heads=12, vocab=50257, batches=[1, 16], new_tokens=256, rounds=3, warmup=2, device="cuda"
)
DRY_RUN = dict(layers=2, d_model=64, heads=2, vocab=256, batches=[1], new_tokens=8, rounds=1, warmup=1, device="cpu")
QUICK = dict(new_tokens=128, rounds=2, warmup=1)  # --gpu --quick: what fits scripts/gpu_check.sh --quick's minute
GOAL_VS_HF = 1.5  # --gpu: zoo compiled / hf static compiled, at every batch
GOAL_TOKENS_PER_S = 2000.0  # --gpu: zoo compiled at batch 1


def copy_bandwidth(nbytes: int, repeats: int = 20, device: str = "cpu") -> float:
    """Bytes per second that ``copy_`` moves (read + write) between two buffers of ``nbytes`` on ``device``: best
    of ``repeats``."""
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        _wait(device)
        start = time.perf_counter()
        dst.copy_(src)
        _wait(device)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * src.element_size() / best


def _wait(device: str) -> None:
    """Wait for the work queued on ``device`` (a CUDA call returns before its kernels finish)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def decoders(
    hf: Any, ours: zoo.ZooModel, prompt: torch.Tensor, new: int
) -> tuple[dict[str, Callable[[], torch.Tensor]], dict[str, str]]:
    """One greedy call per variant, each returning prompt + ``new`` tokens; and the variants that could not
    be set up, with their error (transformers' static cache on a version without ``CompileConfig``)."""
    calls: dict[str, Callable[[], torch.Tensor]] = {
        "zoo": lambda: ours.generate(prompt, new, eos_token_id=None),
        "zoo compiled": lambda: ours.generate(prompt, new, eos_token_id=None, compile=True),
    }
    mask = torch.ones_like(prompt)
    common = dict(attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    calls["hf"] = lambda: hf.generate(prompt, **common)
    try:
        calls["hf static compiled"] = _hf_static(hf, prompt, mask, common)
    except Exception as error:
        return calls, {"hf static compiled": _error(error)}
    return calls, {}


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:300]}"


def _hf_static(hf: Any, prompt: torch.Tensor, mask: torch.Tensor, common: dict[str, Any]) -> Callable[[], Any]:
    """transformers' static-cache compiled ``generate`` (``CompileConfig`` and its CPU switch: recent versions)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import CompileConfig

    if prompt.device.type == "cuda":
        compile_config = CompileConfig()  # transformers' default on a GPU: mode="reduce-overhead", CUDA graphs
    else:
        compile_config = CompileConfig(mode="default")  # reduce-overhead means CUDA graphs; there are none on a CPU
        compile_config._compile_all_devices = True  # transformers' switch for compiling on the CPU
    static = GenerationConfig(
        cache_implementation="static",
        compile_config=compile_config,
        **{k: v for k, v in common.items() if k != "attention_mask"},
    )
    return lambda: hf.generate(prompt, attention_mask=mask, generation_config=static)


def rates(
    calls: dict[str, Callable[[], torch.Tensor]],
    tokens: int,
    rounds: int,
    warmup: int,
    device: str = "cpu",
    failed: dict[str, str] | None = None,
) -> tuple[dict[str, list[float]], dict[str, torch.Tensor]]:
    """tokens/s of each call over ``rounds`` rounds in rotating order, after ``warmup`` untimed calls;
    and each call's output. A call that fails in its warm-up is left out, its error put in ``failed``."""
    outputs = {}
    for name, call in list(calls.items()):
        try:
            for _ in range(warmup):
                outputs[name] = call()
        except Exception as error:
            if failed is None:
                raise
            failed[name] = _error(error)
            del calls[name]
            outputs.pop(name, None)
    measured: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            _wait(device)
            start = time.perf_counter()
            calls[name]()
            _wait(device)
            measured[name].append(tokens / (time.perf_counter() - start))
    return measured, outputs


def bench(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    hf = hf_model("gpt2", layers=args.layers, d=args.d_model, heads=args.heads, vocab=args.vocab, ctx=1024).eval()
    ours = zoo.from_hf(hf).eval().to(args.device, dtype)
    hf = hf.to(args.device, dtype)
    weight_bytes = sum(p.numel() * p.element_size() for p in ours.parameters())
    bandwidth = {
        "memory": copy_bandwidth(512 * 2**20, device=args.device),
        "weights-sized": copy_bandwidth(weight_bytes, device=args.device),
    }
    rows = []
    for batch in args.batches:
        prompt = torch.randint(5, args.vocab, (batch, 16), generator=torch.Generator().manual_seed(batch))
        prompt = prompt.to(args.device)
        with torch.inference_mode():
            calls, failed = decoders(hf, ours, prompt, args.new_tokens)
            measured, outputs = rates(calls, batch * args.new_tokens, args.rounds, args.warmup, args.device, failed)
        medians = {name: statistics.median(values) for name, values in measured.items()}
        hf_rates = [medians[name] for name in ("hf", "hf static compiled") if name in medians]
        best_hf = max(hf_rates) if hf_rates else None
        same = all(torch.equal(out, next(iter(outputs.values()))) for out in outputs.values())
        for name in VARIANTS:
            if name in failed:
                rows.append({"batch": batch, "variant": name, "tokens_per_s": None, "error": failed[name]})
                print(f"batch {batch} {name:>20}: FAILED: {failed[name]}", flush=True)
                continue
            values = measured[name]
            steps_per_s = medians[name] / batch  # each step reads every weight once, whatever the batch
            rows.append(
                {
                    "batch": batch,
                    "variant": name,
                    "tokens_per_s": medians[name],
                    "spread": [min(values), max(values)],
                    "vs_best_hf": _ratio(medians[name], best_hf),
                    "vs_hf_eager": _ratio(medians[name], medians.get("hf")),  # zoo eager / hf: no compile
                    "vs_hf_static_compiled": _ratio(medians[name], medians.get("hf static compiled")),
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


def _ratio(a: float, b: float | None) -> float | None:
    return None if b is None else a / b


def goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The CUDA-graph goals (``--gpu``), each with the value measured and whether it is met: ``zoo compiled``
    at >= GOAL_VS_HF times ``hf static compiled`` at every batch, and >= GOAL_TOKENS_PER_S tokens/s at batch 1."""
    found = []
    for row in rows:
        if row["variant"] != "zoo compiled" or row.get("error"):
            continue
        ratio = row["vs_hf_static_compiled"]
        goal = f"batch {row['batch']}: zoo compiled >= {GOAL_VS_HF}x hf static compiled"
        found.append({"goal": goal, "value": ratio, "met": None if ratio is None else ratio >= GOAL_VS_HF})
        if row["batch"] == 1:
            rate, goal = row["tokens_per_s"], f"batch 1: zoo compiled >= {GOAL_TOKENS_PER_S:,.0f} tok/s"
            found.append({"goal": goal, "value": rate, "met": rate >= GOAL_TOKENS_PER_S})
    return found


def _x(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def _report(row: dict[str, Any]) -> None:
    print(
        f"batch {row['batch']} {row['variant']:>20}: {row['tokens_per_s']:8.1f} tok/s "
        f"({_x(row['vs_best_hf'])} the faster HF, {_x(row['vs_hf_eager'])} HF eager, "
        f"{_x(row['vs_hf_static_compiled'])} HF static compiled)",
        flush=True,
    )


def print_table(out: dict[str, Any]) -> None:
    gib, bound = out["copy_gib_per_s"], out["bound_steps_per_s"]
    config = out["config"]
    table = Table(
        title=f"greedy decoding on {config['device']} in {config['dtype']}, {config['new_tokens']} new tokens, weights "
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
        "vs HF static compiled",
        "of memory bound",
        "of weights-sized",
        "same tokens",
    ):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for row in out["rows"]:
        if row.get("error"):
            table.add_row(str(row["batch"]), row["variant"], "FAILED", *[""] * 5, row["error"][:60])
            continue
        fraction = row["bandwidth_fraction"]
        table.add_row(
            str(row["batch"]),
            row["variant"],
            f"{row['tokens_per_s']:,.0f} ({row['spread'][0]:,.0f}..{row['spread'][1]:,.0f})",
            _x(row["vs_best_hf"]),
            _x(row["vs_hf_eager"]),
            _x(row["vs_hf_static_compiled"]),
            f"{fraction['memory']:.0%}",
            f"{fraction['weights-sized']:.0%}",
            str(row["same_tokens"]),
        )
    Console().print(table)
    for goal in out.get("goals", []):
        if goal["value"] is None:
            print(f"goal {goal['goal']}: n/a (that HF variant failed)", flush=True)
            continue
        print(f"goal {goal['goal']}: {goal['value']:,.2f} -> {'met' if goal['met'] else 'NOT met'}", flush=True)
    if config["dry_run"]:
        print("dry run on the CPU at a tiny size: the figures and verdicts mean nothing", flush=True)


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
    parser.add_argument("--device", default="cpu", help="where both sides decode (cpu, cuda)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights and activations")
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="the CUDA-graph check: GPT-2 124M, bfloat16, cuda, 256 new tokens at batch 1 and 16, and its goals",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="with --gpu: its steps on the CPU at a tiny size (figures mean nothing)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="with --gpu: 128 new tokens, 2 rounds, 1 warm-up (gpu_check.sh --quick)"
    )
    parser.add_argument("--json", default=None, help="also write the results here")
    return parser


def parse(cli: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The arguments, where ``--gpu`` (shrunk by ``--dry-run``) sets defaults that flags given beside it override."""
    args = cli.parse_args(argv)
    if args.dry_run and not args.gpu:
        cli.error("--dry-run shrinks the --gpu check: pass --gpu --dry-run")
    if args.quick and not args.gpu:
        cli.error("--quick shortens the --gpu check: pass --gpu --quick")
    if args.gpu:
        quick = QUICK if args.quick and not args.dry_run else {}
        cli.set_defaults(**(DRY_RUN if args.dry_run else GPU), **quick, dtype="bfloat16")
        args = cli.parse_args(argv)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        cli.error(f"--device {args.device}: no CUDA device here (--gpu --dry-run runs the check on the CPU)")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cli = build_parser()
    args = parse(cli, argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = {"machine": machine_info(cli), "config": vars(args)}
    out.update(bench(args))
    if args.gpu:
        out["goals"] = goals(out["rows"])
    print_table(out)
    if args.json:
        atomic_write_text(args.json, json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    sys.exit(1 if any(row.get("error") for row in main()["rows"]) else 0)  # the rows that ran are written
