"""zoo-bench text metrics: the translator's chrF (tasks.text_metrics.ChrF, counted by sacrebleu) against
torchmetrics' CHRFScore, on the translator's own kind of text, side by side.

    python scripts/bench/text_metrics.py                 # 128 sentences a batch, 5 rounds: ~10 s on 2 cores
    python scripts/bench/text_metrics.py --sentences 32 --device cuda --json text_metrics.json

Each round updates a fresh metric of each kind with one batch of French number words (hypotheses cut
and changed from the references, as a half-trained translator writes them) and computes it, in
alternating order; the median milliseconds per batch of each, their ratio and both scores are reported.
This is what a translator's validation does with each batch it translates (tasks/translator.py).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from num2words import num2words
from torchmetrics.text import CHRFScore

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tasks/ is imported from the checkout
    sys.path.insert(0, str(ROOT))

from tasks.text_metrics import ChrF  # noqa: E402
from zoo.io import atomic_write_text  # noqa: E402


def batch(n: int, seed: int) -> tuple[list[str], list[list[str]]]:
    """``n`` hypotheses and their references: French number words, two in three cut short and extended."""
    rng = random.Random(seed)
    refs = [num2words(rng.randint(0, 100_000), lang="fr") for _ in range(n)]
    hyps = [
        r if i % 3 == 0 else r[: rng.randint(1, len(r))] + rng.choice(["", " mille", "-et-un"])
        for i, r in enumerate(refs)
    ]
    return hyps, [[r] for r in refs]


def time_metric(make: type, hyps: list[str], refs: list[list[str]], device: str) -> tuple[float, float]:
    """Milliseconds to update a fresh metric with the batch and compute it, and the score."""
    metric = make().to(device)
    start = time.perf_counter()
    metric.update(hyps, refs)
    score = float(metric.compute())
    return 1000 * (time.perf_counter() - start), score


def run(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="scripts/bench/text_metrics.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sentences", type=int, default=128, help="sentences per batch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="where the metrics keep their states")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    sides = {"zoo ChrF": ChrF, "torchmetrics CHRFScore": CHRFScore}
    times: dict[str, list[float]] = {name: [] for name in sides}
    scores: dict[str, float] = {}
    for r in range(args.rounds):
        hyps, refs = batch(args.sentences, seed=r)
        order = list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]
        for name, make in order:
            ms, score = time_metric(make, hyps, refs, args.device)
            times[name].append(ms)
            scores.setdefault(name, score)  # the first round's batch, the same for both
    result = {
        "device": args.device,
        "sentences": args.sentences,
        "torch": torch.__version__,
        **{name: {"ms_per_batch": statistics.median(t), "score": scores[name]} for name, t in times.items()},
    }
    result["speedup"] = result["torchmetrics CHRFScore"]["ms_per_batch"] / result["zoo ChrF"]["ms_per_batch"]
    for name in sides:
        print(
            f"{name:24s} {result[name]['ms_per_batch']:8.1f} ms per {args.sentences} sentences, chrF {scores[name]:.5f}"
        )
    print(f"zoo's ChrF is {result['speedup']:.1f}x as fast")
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    run()
