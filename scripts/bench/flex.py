"""Training throughput and peak memory of the position biases that SDPA cannot fuse, at growing
sequence lengths: ALiBi and T5 relative biases with attention='flex' and attention='auto' (both run
torch.nn.attention.flex_attention on FlexMods: the bias as a score_mod and the mask as a block mask,
computed from positions inside one compiled kernel, no (T, T) tensor) against attention='sdpa' with
the bias as a float (H, T, T) attn_mask, and RoPE on SDPA (no bias) as the ceiling. Each row gives
``vs_rope``, its tokens/s over RoPE's at that length (the goal: >= 0.9 for flex), and ``flex_mods``,
whether every self-attention layer received FlexMods. A step of scripts/gpu_check.sh.

    python scripts/bench/flex.py --json flex_bench.json                  # CUDA: bf16 autocast training
    python scripts/bench/flex.py --device cpu --lengths 32 --tokens 64   # CPU dry run: forward only

Lengths share one token budget per step (batch = tokens // length), so tokens/s compare across
lengths and peak memory shows how each path grows with T. torch has no flex_attention backward on
the CPU, so there the rows time the forward pass only (``train`` is false) and the figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from rich.console import Console

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # a checkout's scripts/bench/ is no package: its sibling is imported from here
    sys.path.insert(0, str(HERE))

from device import time_steps  # noqa: E402

import zoo  # noqa: E402
from zoo.attention import SelfAttention  # noqa: E402

RUNS = [
    ("rope", "sdpa"),
    ("alibi", "flex"),
    ("alibi", "auto"),
    ("alibi", "sdpa"),
    ("t5_relative", "flex"),
    ("t5_relative", "auto"),
    ("t5_relative", "sdpa"),
]


def bench_flex_training(
    position: str, attention: str, *, batch: int, length: int, steps: int, d_model: int, n_layers: int, device: str
) -> dict[str, Any]:
    """Tokens/s of a decoder (causal mask) with this position encoding and attention kernel: a bf16
    autocast AdamW training step on CUDA, a plain forward on the CPU."""
    cuda = device.startswith("cuda")
    cfg = zoo.ModelConfig(
        arch="decoder",
        vocab_size=8192,
        d_model=d_model,
        n_layers=n_layers,
        n_heads=d_model // 64,
        max_seq_len=length,
        position=position,
        attention=attention,
    )
    with torch.device(device):
        model = zoo.build_model(cfg, seed=0).train(cuda)
    received = []  # what each self-attention layer got: FlexMods or a dense mask
    for layer in (m for m in model.modules() if isinstance(m, SelfAttention)):
        layer.register_forward_pre_hook(lambda _m, args: received.append(args[1].flex is not None))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    ids = torch.randint(0, cfg.vocab_size, (batch, length + 1), device=device)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda), torch.set_grad_enabled(cuda):
            logits = model(ids[:, :-1])
        if cuda:
            F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    seconds = time_steps(step, steps, warmup=2, cuda=cuda)  # the warm-up compiles flex_attention
    return {
        "position": position,
        "attention": attention,
        "train": cuda,
        "batch": batch,
        "length": length,
        "d_model": d_model,
        "n_layers": n_layers,
        "tokens_per_s": batch * length * steps / seconds,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "flex_mods": bool(received) and all(received),
    }


def flex_main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(
        prog="scripts/bench/flex.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per step: batch = tokens // length")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--n-layers", type=int, default=6)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", default="flex_bench.json")
    args = parser.parse_args(argv)
    rows, console = [], Console()
    for length in args.lengths:
        rope = None
        for position, attention in RUNS:
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            row = bench_flex_training(
                position,
                attention,
                batch=max(1, args.tokens // length),
                length=length,
                steps=args.steps,
                d_model=args.d_model,
                n_layers=args.n_layers,
                device=args.device,
            )
            rope = row["tokens_per_s"] if position == "rope" else rope
            row["vs_rope"] = row["tokens_per_s"] / rope if rope else None
            rows.append(row)
            what = "training" if row["train"] else "forward only (CPU dry run)"
            memory = "" if row["peak_memory_gib"] is None else f", peak {row['peak_memory_gib']:.2f} GiB"
            console.print(
                f"T={length:<5d} {position:12s} {attention:5s} {what}: {row['tokens_per_s']:,.0f} tokens/s "
                f"({row['vs_rope']:.2f} x rope{memory}; flex_mods={row['flex_mods']})"
            )
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    flex_main()
