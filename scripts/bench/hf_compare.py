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
import gc
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

import zoo

FAMILIES = ("gpt2", "llama", "bert", "t5")
HERE = Path(__file__).resolve().parent  # the memory probe's fresh process imports this file from here


@dataclass
class Result:
    name: str
    zoo_tokens_per_s: float
    hf_tokens_per_s: float
    zoo_spread: tuple[float, float]
    hf_spread: tuple[float, float]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.zoo_tokens_per_s / self.hf_tokens_per_s


def hf_model(family: str, *, layers: int, d: int, heads: int, vocab: int, ctx: int):
    """A randomly initialised HF model of the family, without dropout, in train mode."""
    import transformers as tf

    ff = 4 * d
    if family == "gpt2":
        cfg = tf.GPT2Config(
            n_layer=layers,
            n_embd=d,
            n_head=heads,
            vocab_size=vocab,
            n_positions=ctx,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        return tf.GPT2LMHeadModel(cfg)
    if family == "llama":
        cfg = tf.LlamaConfig(
            hidden_size=d,
            intermediate_size=ff * 2 // 3,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads // 3 or 1,
            vocab_size=vocab,
            max_position_embeddings=ctx,
            tie_word_embeddings=False,
        )
        return tf.LlamaForCausalLM(cfg)
    if family == "bert":
        cfg = tf.BertConfig(
            hidden_size=d,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=ff,
            vocab_size=vocab,
            max_position_embeddings=ctx,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        return tf.BertForMaskedLM(cfg)
    if family == "t5":
        cfg = tf.T5Config(
            d_model=d,
            d_ff=ff,
            d_kv=d // heads,
            num_layers=layers,
            num_heads=heads,
            vocab_size=vocab,
            dropout_rate=0.0,
            decoder_start_token_id=0,
        )
        return tf.T5ForConditionalGeneration(cfg)
    raise ValueError(f"unknown family {family!r}; choose from {FAMILIES}")


def train_steps(family: str, hf, ours, batch: int, length: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """One optimizer step of each side on the same batch: forward, cross-entropy, backward, AdamW."""
    g = torch.Generator().manual_seed(0)
    vocab = ours.config.vocab_size
    ids = torch.randint(5, vocab, (batch, length), generator=g)
    opt_hf = torch.optim.AdamW(hf.parameters(), lr=1e-4)
    opt_zoo = torch.optim.AdamW(ours.parameters(), lr=1e-4)
    if family in ("gpt2", "llama"):
        hf_loss = lambda: hf(input_ids=ids, labels=ids).loss
        zoo_loss = lambda: F.cross_entropy(ours(ids[:, :-1]).flatten(0, 1).float(), ids[:, 1:].flatten())
    elif family == "bert":
        labels = torch.where(torch.rand(ids.shape, generator=g) < 0.15, ids, -100)
        hf_loss = lambda: hf(input_ids=ids, labels=labels).loss
        chosen = labels != -100  # zoo's mlm task runs the head on the masked positions only, as here
        zoo_loss = lambda: F.cross_entropy(ours.mlm_logits(ours(ids)[chosen]).float(), labels[chosen])
    else:
        target = ids[:, : length // 2].contiguous()
        dec = torch.cat([torch.zeros_like(target[:, :1]), target[:, :-1]], dim=1)
        hf_loss = lambda: hf(input_ids=ids, labels=target).loss
        zoo_loss = lambda: F.cross_entropy(ours(ids, dec).flatten(0, 1).float(), target.flatten())

    def step(loss_fn: Callable[[], torch.Tensor], opt: torch.optim.Optimizer) -> Callable[[], None]:
        def run() -> None:
            opt.zero_grad(set_to_none=True)
            loss_fn().backward()
            opt.step()

        return run

    return step(zoo_loss, opt_zoo), step(hf_loss, opt_hf)


def alternate(
    zoo_fn: Callable[[], None],
    hf_fn: Callable[[], None],
    tokens: int,
    rounds: int,
    steps: int,
    autocast: bool,
    warmup: int = 1,
) -> tuple[list[float], list[float]]:
    """tokens/s of each side over ``rounds`` rounds of ``steps`` calls, in alternating order."""
    zoo_rates, hf_rates = [], []
    for fn in (zoo_fn, hf_fn):  # warm-up: first-call allocations, lazy inits, compilation
        with _maybe_autocast(autocast):
            for _ in range(warmup):
                fn()
    for r in range(rounds):
        order = [(zoo_fn, zoo_rates), (hf_fn, hf_rates)]
        for fn, rates in order if r % 2 == 0 else order[::-1]:
            with _maybe_autocast(autocast):
                start = time.perf_counter()
                for _ in range(steps):
                    fn()
                rates.append(tokens * steps / (time.perf_counter() - start))
    return zoo_rates, hf_rates


def _maybe_autocast(enabled: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


def summarize(name: str, zoo_rates: list[float], hf_rates: list[float], **extra: Any) -> Result:
    return Result(
        name,
        statistics.median(zoo_rates),
        statistics.median(hf_rates),
        (min(zoo_rates), max(zoo_rates)),
        (min(hf_rates), max(hf_rates)),
        extra,
    )


def bench_training(args: argparse.Namespace) -> list[Result]:
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
            _report(results[-1])
        del hf, ours
    return results


def bench_generation(args: argparse.Namespace) -> list[Result]:
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
        _report(results[-1])
    prompt = torch.randint(5, args.vocab, (1, 16), generator=torch.Generator().manual_seed(0))
    for n in args.cache_lengths:
        cached = lambda n=n: ours.generate(prompt, n, eos_token_id=None)
        uncached = lambda n=n: ours.generate(prompt, n, eos_token_id=None, use_cache=False)
        with torch.inference_mode():
            c_rates, u_rates = alternate(cached, uncached, n, max(1, args.rounds // 2), 1, autocast=False)
        results.append(summarize(f"zoo cache vs recompute, {n} new tokens", c_rates, u_rates, baseline="zoo uncached"))
        _report(results[-1])
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


def peak_memory(family: str, precision: str, side: str, args: argparse.Namespace) -> float:
    """MiB the training steps add to the peak resident set, measured in a fresh process."""
    code = (
        f"import sys; sys.argv=['x']; sys.path.insert(0, {str(HERE)!r}); from hf_compare import _memory_probe; "
        f"_memory_probe({family!r}, {precision!r}, {side!r}, {args.layers}, {args.d_model}, {args.heads}, "
        f"{args.vocab}, {args.batch}, {args.length})"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def _memory_probe(
    family: str, precision: str, side: str, layers: int, d: int, heads: int, vocab: int, batch: int, length: int
) -> None:
    torch.manual_seed(0)
    hf = hf_model(family, layers=layers, d=d, heads=heads, vocab=vocab, ctx=1024).train()
    ours = zoo.from_hf(hf).train()
    zoo_fn, hf_fn = train_steps(family, hf, ours, batch, length)
    fn = zoo_fn if side == "zoo" else hf_fn
    del zoo_fn, hf_fn  # the other side's optimizer (its state is created on the first step) never grows
    gc.collect()
    before = _reset_peak_rss()
    for _ in range(2):
        with _maybe_autocast(precision == "bf16"):
            fn()
    print((_peak_rss() - before) / 2**20)


def _status_bytes(field: str) -> int:
    """A ``kB`` field of /proc/self/status (Linux), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _reset_peak_rss() -> int:
    """Current resident bytes, after resetting the peak (Linux: ``5`` to clear_refs resets VmHWM),
    so that the peak measured next is this run's and not the model building's."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_bytes("VmRSS")


def _peak_rss() -> int:
    return _status_bytes("VmHWM")


def _report(result: Result) -> None:
    Console().print(
        f"  {result.name}: zoo {result.zoo_tokens_per_s:,.0f} tok/s, other {result.hf_tokens_per_s:,.0f} "
        f"tok/s, ratio {result.ratio:.2f}x"
    )


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
