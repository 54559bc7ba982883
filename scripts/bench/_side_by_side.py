"""Timing two sides in alternation, and what one comparison reports: a helper of hf_compare.py, not a
script (imported by name from scripts/bench/, which is no package)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from rich.console import Console


@dataclass
class Result:
    """One comparison: the median tokens/s of each side, their spread (min, max over rounds) and any
    extra facts (``baseline`` names the second side where it is not HF)."""

    name: str
    zoo_tokens_per_s: float
    hf_tokens_per_s: float
    zoo_spread: tuple[float, float]
    hf_spread: tuple[float, float]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.zoo_tokens_per_s / self.hf_tokens_per_s


def bf16_autocast(enabled: bool) -> torch.autocast:
    """CPU autocast to bfloat16 where ``enabled``; a no-op context otherwise."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


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
        with bf16_autocast(autocast):
            for _ in range(warmup):
                fn()
    for r in range(rounds):
        order = [(zoo_fn, zoo_rates), (hf_fn, hf_rates)]
        for fn, rates in order if r % 2 == 0 else order[::-1]:
            with bf16_autocast(autocast):
                start = time.perf_counter()
                for _ in range(steps):
                    fn()
                rates.append(tokens * steps / (time.perf_counter() - start))
    return zoo_rates, hf_rates


def summarize(name: str, zoo_rates: list[float], hf_rates: list[float], **extra: Any) -> Result:
    return Result(
        name,
        statistics.median(zoo_rates),
        statistics.median(hf_rates),
        (min(zoo_rates), max(zoo_rates)),
        (min(hf_rates), max(hf_rates)),
        extra,
    )


def report(result: Result) -> None:
    """One line per comparison as it finishes (the table comes at the end)."""
    Console().print(
        f"  {result.name}: zoo {result.zoo_tokens_per_s:,.0f} tok/s, other {result.hf_tokens_per_s:,.0f} "
        f"tok/s, ratio {result.ratio:.2f}x"
    )
