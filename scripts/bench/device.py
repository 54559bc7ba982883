"""GPU training throughput and MFU of a zoo preset, torch.compile off and on: the benchmark of
scripts/gpu_check.sh (on a CPU, with a tiny preset, its dry run).

    python scripts/bench/device.py --preset gpt2 --batch 16 --length 1024 --steps 20 --json gpu_bench.json
    python scripts/bench/device.py --preset gpt-tiny --batch 2 --length 64 --steps 2 --device cpu --compile off
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from typing import Any

import torch
import torch.nn.functional as F
from rich.console import Console

import zoo
from zoo.io import atomic_write_text


def bench_device_training(
    preset: str, *, batch: int, length: int, steps: int, compile: bool, device: str
) -> dict[str, Any]:
    """Training throughput and MFU of a zoo preset: bf16 autocast, fused AdamW, TF32 and the SDPA
    kernels on a GPU; the same loop in fp32 on a CPU (the dry run of scripts/gpu_check.sh)."""
    from lightning.fabric.utilities.throughput import get_available_flops

    cuda = device.startswith("cuda")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    with torch.device(device):
        model = zoo.create_model(preset, seed=0, max_seq_len=max(length, 1024) if preset.startswith("gpt") else None)
    if compile:
        model.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    ids = torch.randint(0, model.config.vocab_size, (batch, length + 1), device=device)
    dtype = torch.bfloat16 if cuda else torch.float32

    def step() -> None:
        with torch.autocast(device.split(":")[0], dtype=dtype, enabled=cuda):
            logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    seconds = time_steps(step, steps, warmup=3, cuda=cuda)
    tokens_per_s = batch * length * steps / seconds
    flops_per_token = zoo.stats(model.config, seq_len=length).flops_per_token_train
    peak = get_available_flops(torch.device(device), dtype) if cuda else None
    return {
        "preset": preset,
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "compile": compile,
        "batch": batch,
        "length": length,
        "tokens_per_s": tokens_per_s,
        "model_tflops_per_s": tokens_per_s * flops_per_token / 1e12,
        "mfu": tokens_per_s * flops_per_token / peak if peak else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }


def time_steps(step: Any, steps: int, *, warmup: int, cuda: bool) -> float:
    """Seconds for ``steps`` calls of ``step`` after ``warmup`` untimed ones (and compilation), the
    device synchronised around the timed ones."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return time.perf_counter() - start


def device_main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """GPT-2-124M training throughput and MFU with compile off and on (scripts/gpu_check.sh)."""
    parser = argparse.ArgumentParser(
        prog="scripts/bench/device.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="gpt2")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--compile",
        choices=("off", "on", "both"),
        default="both",
        help="torch.compile off, on, or both rows (inductor on a CPU takes minutes)",
    )
    parser.add_argument("--json", default="gpu_bench.json", help="write the rows here (its folder is created)")
    args = parser.parse_args(argv)
    rows = []
    for compile in {"off": (False,), "on": (True,), "both": (False, True)}[args.compile]:
        row = bench_device_training(
            args.preset, batch=args.batch, length=args.length, steps=args.steps, compile=compile, device=args.device
        )
        rows.append(row)
        mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "n/a (peak FLOP/s unknown for this device)"
        Console().print(
            f"{row['preset']} on {row['device']}, compile={compile}: {row['tokens_per_s']:,.0f} tokens/s, "
            f"{row['model_tflops_per_s']:.1f} model TFLOP/s, MFU {mfu}"
        )
    atomic_write_text(args.json, json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    device_main()
