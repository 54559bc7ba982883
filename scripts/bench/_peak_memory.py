"""Peak resident memory of a training step, each side in a fresh process (Linux: /proc/self): a helper of
hf_compare.py, not a script (imported by name from scripts/bench/, which is no package)."""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
from pathlib import Path

import torch
from _hf_models import hf_model, train_steps
from _side_by_side import bf16_autocast

import zoo

HERE = Path(__file__).resolve().parent  # the probe's fresh process imports this file from here


def peak_memory(family: str, precision: str, side: str, args: argparse.Namespace) -> float:
    """MiB the training steps add to the peak resident set, measured in a fresh process."""
    code = (
        f"import sys; sys.argv=['x']; sys.path.insert(0, {str(HERE)!r}); from _peak_memory import memory_probe; "
        f"memory_probe({family!r}, {precision!r}, {side!r}, {args.layers}, {args.d_model}, {args.heads}, "
        f"{args.vocab}, {args.batch}, {args.length})"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def memory_probe(
    family: str, precision: str, side: str, layers: int, d: int, heads: int, vocab: int, batch: int, length: int
) -> None:
    """The fresh process of ``peak_memory``: builds both sides, then prints the MiB that two training
    steps of ``side`` add to the peak resident set."""
    torch.manual_seed(0)
    hf = hf_model(family, layers=layers, d=d, heads=heads, vocab=vocab, ctx=1024).train()
    ours = zoo.from_hf(hf).train()
    zoo_fn, hf_fn = train_steps(family, hf, ours, batch, length)
    fn = zoo_fn if side == "zoo" else hf_fn
    del zoo_fn, hf_fn  # the other side's optimizer (its state is created on the first step) never grows
    gc.collect()
    before = reset_peak_rss()
    for _ in range(2):
        with bf16_autocast(precision == "bf16"):
            fn()
    print((peak_rss() - before) / 2**20)


def status_bytes(field: str) -> int:
    """A ``kB`` field of /proc/self/status (Linux), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak_rss() -> int:
    """Current resident bytes, after resetting the peak (Linux: ``5`` to clear_refs resets VmHWM),
    so that the peak measured next is this run's and not the model building's."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_bytes("VmRSS")


def peak_rss() -> int:
    """The peak resident bytes of this process since the last ``reset_peak_rss``."""
    return status_bytes("VmHWM")
