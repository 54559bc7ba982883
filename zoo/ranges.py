"""The finite numbers a float setting takes, said once for its check and its message."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class FloatRange:
    """The finite numbers a float field takes: from ``low`` (excluded when ``low_open``) to ``high``
    (excluded when ``high_open``; ``math.inf``: no upper end). ``hint`` says what the field means."""

    low: float
    high: float = math.inf
    low_open: bool = False
    high_open: bool = True
    hint: str = ""

    def holds(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        """What a value must do, after ``must``: ``lie in [0, 1)``, ``be > 0 and finite``, ``be finite``."""
        if self.high != math.inf:
            low, high = "(" if self.low_open else "[", ")" if self.high_open else "]"
            rule = f"lie in {low}{self.low:g}, {self.high:g}{high}"
        elif self.low != -math.inf:
            rule = f"be {'>' if self.low_open else '>='} {self.low:g} and finite"
        else:
            rule = "be finite"
        return rule + (f" ({self.hint})" if self.hint else "")


POSITIVE = FloatRange(0.0, low_open=True)
