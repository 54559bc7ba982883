"""zoo-bench LoRA: full fine-tuning against LoRA on the same decoder, the cost of a whole training step.

    python scripts/bench/lora.py        # 12 layers, d 512, seq 256, batch 4, vocab 8192: ~2 min on 2 cores
    python scripts/bench/lora.py --rank 16 --targets q,k,v,out,ffn --out lora.json

Two variants, each in a fresh process with the same weights (seed 0): every parameter trains
(AdamW over all of them), and ``adapter=lora`` (the model frozen, AdamW over the adapters). A step is
forward + loss + backward + ``AdamW.step()`` + ``zero_grad(set_to_none=True)``, so what LoRA saves shows:
no gradients and no AdamW state (twice the weights) for frozen parameters.

Memory: the peak growth of the process's resident set (CPU: VmHWM after ``--steps`` steps minus VmRSS
before the first, the method and malloc setting of memory.py) or ``max_memory_allocated`` (CUDA), over
the steps, from a model built and moved to the device. Speed: tokens per second over the steps after
the first (which allocates the optimizer state), median of their times.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # a checkout's scripts/bench/ is no package: its siblings are imported from here
    sys.path.insert(0, str(HERE))

from hf_compare import _peak_rss, _reset_peak_rss, machine_info  # noqa: E402
from memory import in_fresh_process, next_token_loss  # noqa: E402

import zoo  # noqa: E402

VARIANTS = ("full", "lora")


def build(variant: str, args: argparse.Namespace) -> tuple[zoo.ZooModel, torch.optim.Optimizer]:
    cfg = zoo.ModelConfig(
        arch="decoder",
        vocab_size=args.vocab,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        position="learned",
        norm="layernorm",
        ffn="gelu",
        bias=True,
        max_seq_len=args.length,
    )
    model = zoo.build_model(cfg, seed=0).to(args.device).train()
    if variant == "lora":
        zoo.adapters.apply(model, "lora", rank=args.rank, targets=tuple(args.targets.split(",")))
    trainable = [p for p in model.parameters() if p.requires_grad]
    return model, torch.optim.AdamW(trainable, lr=1e-4)


def probe(args: argparse.Namespace) -> dict[str, Any]:
    """In this (fresh) process: ``--steps`` training steps of one variant, their memory and speed."""
    if args.threads:
        torch.set_num_threads(args.threads)
    model, optimizer = build(args.probe, args)
    ids = torch.randint(5, args.vocab, (args.batch, args.length), generator=torch.Generator().manual_seed(0))
    ids = ids.to(args.device)
    cuda = args.device.startswith("cuda")
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _reset_peak_rss()
    times, losses = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = next_token_loss(model(ids), ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    peak = torch.cuda.max_memory_allocated() if cuda else _peak_rss()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "variant": args.probe,
        "peak_mib": (peak - before) / 2**20,
        "trainable": trainable,
        "parameters": zoo.count_parameters(model),
        "tokens_per_s": ids.numel() / statistics.median(times[1:]),
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/bench/lora.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for name, default in (
        ("layers", 12),
        ("d-model", 512),
        ("heads", 8),
        ("vocab", 8192),
        ("batch", 4),
        ("length", 256),
        ("rank", 8),
        ("steps", 4),
    ):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--targets", default="q,k,v,out", help="LoRA targets, comma-separated")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    return parser


def run(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(args)))
        return {}
    results = {variant: in_fresh_process(Path(__file__).resolve(), args, variant) for variant in VARIANTS}
    full, lora = results["full"], results["lora"]
    ratios = {
        "peak_lora_over_full": lora["peak_mib"] / full["peak_mib"],
        "speed_lora_over_full": lora["tokens_per_s"] / full["tokens_per_s"],
    }
    for name, r in results.items():
        print(
            f"{name:5s} trainable {r['trainable']:>11,} of {r['parameters']:,}  peak {r['peak_mib']:8.0f} MiB  "
            f"{r['tokens_per_s']:8.0f} tokens/s  loss {r['first_loss']:.4f} -> {r['last_loss']:.4f}"
        )
    print(
        f"LoRA / full: peak memory {ratios['peak_lora_over_full']:.2f}x, tokens/s {ratios['speed_lora_over_full']:.2f}x"
    )
    out = {
        "machine": machine_info(parser),
        "config": {k: v for k, v in vars(args).items() if k != "probe"},
        "results": results,
        "ratios": ratios,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    run()
