"""zoo-bench optimizers: a whole training step under ``optimizer=muon`` against ``optimizer=adamw``.

    python scripts/bench/optimizers.py                     # the default experiment's model: ~1 min on 2 cores
    python scripts/bench/optimizers.py --d-model 512 --layers 8 --heads 8 --out optimizers.json

Two copies of one model (``--preset``, seed 0) in this process, each with the optimizer that
conf/optimizer/<name>.yaml describes, built by the code zoo-train uses (tasks.optim.build_optimizer:
Muon on the blocks' attention and FFN matrices, AdamW on the rest). A step is forward + loss +
backward + ``step()`` + ``zero_grad``; the two sides run in alternating rounds (the machine's load
falls on both) and are quoted as a ratio. ``optimizer.step()`` alone is timed too: Muon's
Newton-Schulz iterations (five matmul chains per matrix, in bfloat16 in torch) are what it adds.
The defaults are the default experiment's sizes: gpt-tiny, vocabulary 4096, 16 sequences of 128.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for path in (HERE, ROOT):  # scripts/bench/ is no package; tasks/ is imported from the checkout
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from _side_by_side import alternate  # noqa: E402
from memory import next_token_loss  # noqa: E402

import zoo  # noqa: E402
from tasks.optim import build_optimizer  # noqa: E402

SIDES = ("muon", "adamw")


def optimizer_yaml(name: str) -> dict[str, Any]:
    """conf/optimizer/<name>.yaml as plain data: the settings a run that chooses it starts from."""
    return OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "optimizer" / f"{name}.yaml"))


def side(model: torch.nn.Module, name: str, ids: torch.Tensor, step_times: list[float]) -> Any:
    """One training step of ``model`` under optimizer ``name``, as a function; appends the time of
    ``optimizer.step()`` to ``step_times``."""
    optimizer = build_optimizer(model, optimizer_yaml(name))
    cuda = ids.is_cuda

    def train_step() -> None:
        next_token_loss(model(ids), ids).backward()
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        step_times.append(time.perf_counter() - start)
        optimizer.zero_grad(set_to_none=True)

    return train_step


def run(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="scripts/bench/optimizers.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="gpt-tiny")
    for name, default in (
        ("d-model", 128),
        ("layers", 2),
        ("heads", 4),
        ("vocab", 4096),
        ("batch", 16),
        ("length", 128),
        ("rounds", 6),
        ("steps", 5),
    ):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    sizes = {"d_model": args.d_model, "n_layers": args.layers, "n_heads": args.heads, "d_ff": 4 * args.d_model}
    base = zoo.create_model(args.preset, vocab_size=args.vocab, max_seq_len=args.length, seed=0, **sizes)
    base = base.to(args.device).train()
    ids = torch.randint(5, args.vocab, (args.batch, args.length), generator=torch.Generator().manual_seed(0))
    ids = ids.to(args.device)
    step_times: dict[str, list[float]] = {name: [] for name in SIDES}
    fns = [side(copy.deepcopy(base), name, ids, step_times[name]) for name in SIDES]
    rates = dict(zip(SIDES, alternate(*fns, ids.numel(), args.rounds, args.steps, autocast=False), strict=True))
    result = {
        "machine": {"platform": platform.platform(), "threads": torch.get_num_threads(), "torch": torch.__version__},
        "device": args.device,
        "model": {"preset": args.preset, **sizes, "vocab": args.vocab, "parameters": zoo.count_parameters(base)},
        "batch": [args.batch, args.length],
        **{
            name: {
                "tokens_per_s": statistics.median(rates[name]),
                "spread": [min(rates[name]), max(rates[name])],
                "optimizer_step_ms": 1000 * statistics.median(step_times[name][1:]),
            }
            for name in SIDES
        },
    }
    result["step_time_muon_over_adamw"] = result["adamw"]["tokens_per_s"] / result["muon"]["tokens_per_s"]
    for name in SIDES:
        r = result[name]
        print(
            f"{name:5s} {r['tokens_per_s']:9.0f} tokens/s (rounds {r['spread'][0]:.0f}..{r['spread'][1]:.0f})  "
            f"optimizer.step() {r['optimizer_step_ms']:7.1f} ms"
        )
    print(f"a training step under muon takes {result['step_time_muon_over_adamw']:.2f}x the time of adamw's")
    if args.out:
        zoo.io.atomic_write_text(Path(args.out), json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    run()
