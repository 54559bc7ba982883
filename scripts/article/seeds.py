"""Statistics over seeds: a claim whose effect is small is trained with several seeds, and two settings
are told apart only when their 95% confidence intervals of the mean do not overlap.

    summary = summarize([4.12, 4.13, 4.11])      # mean, sample std, n, interval
    separated(summary.interval, other.interval)  # True: the two means differ at this scale
    fmt([4.12, 4.13, 4.11])                      # "4.120 ± 0.010 (n=3)"

The interval is mean ± t·s/√n with t the 97.5% quantile of Student's t at n − 1 degrees of freedom
(https://en.wikipedia.org/wiki/Confidence_interval#Example): with 2 or 3 seeds t is large (12.7, 4.3),
so an interval separates only a difference that is large beside the seed-to-seed spread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Interval = tuple[float, float]

T_975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip
"""The 97.5% quantile of Student's t for 1..30 degrees of freedom (``T_975[df - 1]``)."""
Z_975 = 1.959963984540054  # the normal distribution's 97.5% quantile


def t_quantile(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom: the table up to 30, beyond it
    the Cornish-Fisher expansion around the normal quantile (Abramowitz & Stegun 26.7.5; its error at
    df 31 is below 1e-5)."""
    if df < 1:
        raise ValueError(f"df={df}: Student's t needs at least 1 degree of freedom (2 values)")
    if df <= len(T_975):
        return T_975[df - 1]
    z = Z_975
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
    )
    return z + sum(term / df ** (i + 1) for i, term in enumerate(terms))


@dataclass(frozen=True)
class Summary:
    """Values from several seeds: their mean, sample standard deviation (n − 1) and 95% interval of the
    mean. With one value the deviation is nan and the interval unbounded: one seed separates nothing."""

    values: tuple[float, ...]
    mean: float
    std: float

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def interval(self) -> Interval:
        if self.n < 2:
            return (-math.inf, math.inf)
        half = t_quantile(self.n - 1) * self.std / math.sqrt(self.n)
        return (self.mean - half, self.mean + half)


def summarize(values: Sequence[float]) -> Summary:
    """Mean and sample standard deviation of ``values`` (one per seed; at least one)."""
    if not values:
        raise ValueError("summarize: no values (one per seed is needed)")
    n = len(values)
    mean = math.fsum(values) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
    return Summary(tuple(float(v) for v in values), mean, std)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample standard deviation) of ``values``; the deviation is nan for a single value."""
    s = summarize(values)
    return s.mean, s.std


def interval(values: Sequence[float]) -> Interval:
    """The 95% confidence interval of the mean of ``values``: mean ± t(n − 1)·s/√n."""
    return summarize(values).interval


def separated(a: Interval, b: Interval) -> bool:
    """Whether intervals ``a`` and ``b`` do not overlap (touching ends count as overlapping)."""
    return a[1] < b[0] or b[1] < a[0]


def fmt(values: Sequence[float], digits: int = 3) -> str:
    """``values`` as "mean ± std (n=k)", e.g. "4.123 ± 0.010 (n=3)"; a single value reads "4.123 (n=1)"."""
    s = summarize(values)
    spread = "" if s.n < 2 else f" ± {s.std:.{digits}f}"
    return f"{s.mean:.{digits}f}{spread} (n={s.n})"
