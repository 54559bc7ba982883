"""Quantized inference: zoo's generate in each weight precision, with HF GPT-2 in float32 as the peer.

Every side starts from the same weights (an HF GPT-2 built at random and converted with
``zoo.from_hf``, as in hf_compare.py); each zoo precision is a copy of the float32 model passed
through ``zoo.quantize``. Runs alternate (forward order, then reversed) so that drift on a shared
machine hits every side; reported are median tokens/s, the spread and the ratios to zoo float32 and
to HF. Quality against zoo float32: the largest absolute difference of the logits over a batch of
prompts and the fraction of greedy tokens that agree (on random weights the logits are nearly flat,
so agreement there is a lower bound; a trained checkpoint is the real test: ``--pretrained`` and
``--eval-ids`` report its perplexity per precision).

    python scripts/bench/quantize.py                              # 6 layers, d_model 384, vocab 8192
    python scripts/bench/quantize.py --batches 1 --rounds 7 --threads 1
    python scripts/bench/quantize.py --pretrained out/model --eval-ids test_ids.pt --no-hf
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from datetime import date
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

import zoo
from zoo.io import atomic_write_text

HERE = Path(__file__).resolve().parent
PRECISIONS = ("fp32", "bf16", "int8", "int4")


def quantized(model: zoo.ZooModel, precision: str, kv_cache: str | None = None) -> zoo.ZooModel:
    """A copy of float32 ``model`` in ``precision`` (``fp32``: the copy unchanged), its KV cache in
    ``kv_cache`` (None: the weights' dtype)."""
    return zoo.quantize(copy.deepcopy(model).eval(), None if precision == "fp32" else precision, kv_cache=kv_cache)


@torch.inference_mode()
def cache_bytes(model: zoo.ZooModel, length: int, batch: int = 1) -> int:
    """Bytes of the KV cache ``generate`` builds for ``batch`` sequences of ``length`` positions."""
    cache = model.new_cache(length)
    model.features(torch.randint(5, model.config.vocab_size, (batch, length)), cache=cache)
    return cache.nbytes()


@torch.inference_mode()
def perplexity(model: zoo.ZooModel, batches: Iterable[torch.Tensor]) -> float:
    """exp(mean next-token cross-entropy) of a decoder over (B, T) token-id batches: the hook that
    ``zoo-eval`` (or anyone) calls with a quantized model and a held-out split."""
    total, count = 0.0, 0
    for ids in batches:
        logits = model(ids[:, :-1]).float()  # (B, T-1, V)
        total += F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="sum").item()
        count += ids[:, 1:].numel()
    return math.exp(total / count)


@torch.inference_mode()
def quality(model: zoo.ZooModel, reference: zoo.ZooModel, prompt: torch.Tensor, new_tokens: int) -> dict[str, float]:
    """Logits max-abs-diff on ``prompt`` and greedy-token agreement over ``new_tokens``, against ``reference``."""
    diff = (model(prompt).float() - reference(prompt).float()).abs().max().item()
    ours = model.generate(prompt, new_tokens, eos_token_id=None)[:, prompt.shape[1] :]
    theirs = reference.generate(prompt, new_tokens, eos_token_id=None)[:, prompt.shape[1] :]
    return {"logits_max_abs_diff": diff, "greedy_agreement": (ours == theirs).float().mean().item()}


def alternate(fns: dict[str, Callable[[], None]], tokens: int, rounds: int) -> dict[str, list[float]]:
    """tokens/s of each function over ``rounds`` rounds, in forward then reversed order; two warm-up
    calls each (the first compiles a compiled variant)."""
    for fn in fns.values():
        fn()
        fn()
    rates: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            start = time.perf_counter()
            fns[name]()
            rates[name].append(tokens / (time.perf_counter() - start))
    return rates


def hf_gpt2(args: argparse.Namespace):
    """The random HF GPT-2 of hf_compare.py (same seed, same sizes), in eval mode."""
    sys.path.insert(0, str(HERE))
    from hf_compare import hf_model

    torch.manual_seed(0)
    return hf_model("gpt2", layers=args.layers, d=args.d_model, heads=args.heads, vocab=args.vocab, ctx=1024).eval()


def base_model(args: argparse.Namespace, hf: Any) -> zoo.ZooModel:
    """The float32 model every precision is copied from: ``--pretrained``'s weights, else ``hf``
    converted, else (``--no-hf``) zoo's own GPT-2 layout at the sizes of ``args``, seed 0."""
    if args.pretrained:
        return zoo.load_pretrained(args.pretrained).float().eval()
    if hf is not None:
        return zoo.from_hf(hf).eval()
    return zoo.create_model(  # no peer: zoo's own GPT-2 layout at these sizes
        "gpt2",
        n_layers=args.layers,
        d_model=args.d_model,
        n_heads=args.heads,
        vocab_size=args.vocab,
        eos_token_id=None,
        pad_token_id=0,
        seed=0,
    ).eval()


def precision_models(
    base: zoo.ZooModel, precisions: list[str], kv_caches: list[str]
) -> tuple[dict[str, zoo.ZooModel], dict[str, str]]:
    """A copy of ``base`` per weight precision and KV-cache precision, named ``int8`` or ``int8 kv int8``;
    and, by the same names, the reason of each that ``zoo.quantize`` refuses on this machine (printed too)."""
    models, skipped = {}, {}
    for precision in precisions:
        for kv_cache in kv_caches:
            name = precision if kv_cache == "none" else f"{precision} kv {kv_cache}"
            try:
                models[name] = quantized(base, precision, None if kv_cache == "none" else kv_cache)
            except zoo.ConfigError as refusal:  # e.g. int4 on a CPU: the row is skipped, the reason reported
                skipped[name] = str(refusal)
                Console().print(f"  skipping {name}: {refusal}")
    return models, skipped


def generators(
    models: dict[str, zoo.ZooModel], hf: Any, prompt: torch.Tensor, n: int, compiled: list[str]
) -> dict[str, Callable[[], None]]:
    """One greedy call per side, each decoding ``n`` new tokens after ``prompt``: ``zoo <name>`` per
    model, ``zoo <name> compiled`` for the names in ``compiled``, and ``hf fp32`` where ``hf`` is given."""
    fns: dict[str, Callable[[], None]] = {
        f"zoo {p}": (lambda m=m: m.generate(prompt, n, eos_token_id=None)) for p, m in models.items()
    }
    fns.update(
        {  # the same models through generate(compile=True): a static cache and a compiled step
            f"zoo {p} compiled": (lambda m=m: m.generate(prompt, n, eos_token_id=None, compile=True))
            for p, m in models.items()
            if p in compiled
        }
    )
    if hf is not None:
        fns["hf fp32"] = lambda: hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            use_cache=True,
        )
    return fns


def speed_rows(batch: int, rates: dict[str, list[float]]) -> list[dict[str, Any]]:
    """One row per side timed at ``batch``: median tokens/s, the spread, and the ratios to zoo float32
    and to HF (None where that side was not timed)."""
    fp32 = statistics.median(rates["zoo fp32"]) if "zoo fp32" in rates else None
    peer = statistics.median(rates["hf fp32"]) if "hf fp32" in rates else None
    rows = []
    for name, r in rates.items():
        median = statistics.median(r)
        rows.append(
            {
                "batch": batch,
                "name": name,
                "tokens_per_s": median,
                "spread": [min(r), max(r)],
                "vs_zoo_fp32": median / fp32 if fp32 else None,
                "vs_hf_fp32": median / peer if peer else None,
            }
        )
    return rows


@torch.inference_mode()
def bench(args: argparse.Namespace) -> dict[str, Any]:
    """What ``run`` measures besides the machine: speed rows per batch size, the KV-cache bytes of one
    sequence, each precision's quality against float32 (and perplexity with ``--eval-ids``), and the
    precisions skipped here with the reason."""
    hf = None if args.no_hf else hf_gpt2(args)
    base = base_model(args, hf)
    models, skipped = precision_models(base, args.precisions, args.kv_cache)
    vocab = base.config.vocab_size
    length = args.prompt + args.new_tokens
    out: dict[str, Any] = {
        "speed": [],
        "quality": {},
        "skipped": skipped,
        "kv_cache_bytes": {name: cache_bytes(m, length) for name, m in models.items()},
    }
    for batch in args.batches:
        prompt = torch.randint(5, vocab, (batch, args.prompt), generator=torch.Generator().manual_seed(batch))
        fns = generators(models, hf, prompt, args.new_tokens, args.compiled)
        out["speed"] += speed_rows(batch, alternate(fns, batch * args.new_tokens, args.rounds))
    prompt = torch.randint(5, vocab, (8, args.prompt), generator=torch.Generator().manual_seed(0))
    reference = models.get("fp32") or base
    for precision, model in models.items():
        out["quality"][precision] = quality(model, reference, prompt, args.quality_tokens)
        if args.eval_ids:
            ids = torch.load(args.eval_ids).long()  # (N, T) held-out token ids
            out["quality"][precision]["perplexity"] = perplexity(model, ids.split(args.eval_batch))
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/bench/quantize.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--precisions",
        nargs="*",
        default=list(PRECISIONS),
        choices=PRECISIONS,
        help="zoo weight precisions; one that zoo.quantize refuses here is skipped and reported",
    )
    parser.add_argument(
        "--kv-cache",
        nargs="*",
        default=["none", "int8"],
        choices=("none", "int8"),
        help="KV-cache precisions, each with every weight precision (none: the weights' dtype)",
    )
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per batch size")
    parser.add_argument("--quality-tokens", type=int, default=32, help="greedy tokens compared with float32")
    parser.add_argument(
        "--compiled",
        nargs="*",
        default=["fp32", "int8", "int8 kv int8"],
        help="models (by name) also timed with generate(compile=True)",
    )
    parser.add_argument("--no-hf", action="store_true", help="leave out the HF peer (transformers not needed)")
    parser.add_argument(
        "--pretrained", default=None, help="a save_pretrained/zoo-export folder instead of random weights"
    )
    parser.add_argument(
        "--eval-ids",
        default=None,
        help="a torch.save'd (N, T) tensor of held-out token ids: report perplexity per precision",
    )
    parser.add_argument("--eval-batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--json", default=None, help="also write the results here")
    return parser


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """``main`` returning what it measured (the dict written as JSON)."""
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = {
        "date": date.today().isoformat(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    out = {"machine": machine, "config": vars(args), **bench(args)}
    print_summary(out)
    if args.json:
        atomic_write_text(args.json, json.dumps(out, indent=2))
    return out


def print_summary(out: dict[str, Any]) -> None:
    machine = out["machine"]
    table = Table(title=f"zoo.quantize {machine['date']}, {machine['threads']} threads, torch {machine['torch']}")
    for column in ("batch", "model", "tok/s (min..max)", "vs zoo fp32", "vs HF fp32"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for row in out["speed"]:
        ratio = lambda x: "" if x is None else f"{x:.2f}x"
        table.add_row(
            str(row["batch"]),
            row["name"],
            f"{row['tokens_per_s']:,.1f} ({row['spread'][0]:,.1f}..{row['spread'][1]:,.1f})",
            ratio(row["vs_zoo_fp32"]),
            ratio(row["vs_hf_fp32"]),
        )
    Console().print(table)
    length = out["config"]["prompt"] + out["config"]["new_tokens"]
    Console().print(
        f"KV cache of one sequence of {length} positions: "
        + ", ".join(f"{name} {size / 2**10:,.0f} KiB" for name, size in out["kv_cache_bytes"].items())
    )
    for precision, q in out["quality"].items():
        Console().print(f"  {precision}: " + ", ".join(f"{k} {v:.4g}" for k, v in q.items()))


def main(argv: list[str] | None = None) -> None:
    run(argv)


if __name__ == "__main__":
    main()
