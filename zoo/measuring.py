"""How fast generation ran: ``with measured() as m: ...`` counts the new tokens and the seconds of
every ``generate`` called inside (a task's answer, a script's loop), for a tokens/s figure that
compares precisions and ``compile`` on the same call."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class Measured:
    """What the ``generate`` calls inside ``measured()`` did: new tokens (decoding steps times rows of
    the output) and the seconds they took, compiling included."""

    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


_MEASURING: contextvars.ContextVar[Measured | None] = contextvars.ContextVar("zoo_generation_measured", default=None)


@contextlib.contextmanager
def measured() -> Iterator[Measured]:
    """Count the new tokens and the time of every ``generate`` called inside, e.g. a task's answer:
    ``with measured() as m: text = task.respond(...)``, then ``m.tokens_per_s``."""
    record = Measured()
    token = _MEASURING.set(record)
    try:
        yield record
    finally:
        _MEASURING.reset(token)


def count_generated(tokens: int, seconds: float) -> None:
    """Add one ``generate`` call to the ``measured()`` block under way, if any."""
    record = _MEASURING.get()
    if record is not None:
        record.tokens += tokens
        record.seconds += seconds
