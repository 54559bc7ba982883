"""What zoo measures while it runs: how fast generation ran (``with measured() as m: ...`` counts the
new tokens and the seconds of every ``generate`` called inside, a task's answer or a script's loop,
for a tokens/s figure that compares precisions and ``compile`` on the same call), and how much memory
a device can still give (``free_bytes``: what generation and zoo-train check a length or a model
against before they allocate)."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch


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


def free_bytes(device: torch.device) -> int | None:
    """Memory the device can still give, in bytes; None where zoo cannot tell."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type == "cpu":
        return _available_ram()
    return None


def _available_ram() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), else the physical memory, else None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
