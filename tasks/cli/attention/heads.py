"""zoo-attention's per-head table: each head's statistics and flags (``zoo.inspect.head_stats``),
written as ``heads.md`` and printed to the console."""

from __future__ import annotations

import math
from dataclasses import dataclass

from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table
from torch import Tensor

from zoo.inspect import HeadStats, head_stats, layers_by_kind

FLAGS = ("flat", "sink", "diagonal", "previous")
COLUMNS = [
    "module",
    "kind",
    "layer",
    "head",
    "entropy (nats)",
    "normalised entropy",
    "first-token mass",
    "self mass",
    "previous mass",
    "flags",
]
SHORT = ["module", "kind", "layer", "head", "H nats", "H/Hmax", "first", "self", "prev", "flags"]  # console


@dataclass
class HeadRow:
    module: str
    kind: str
    layer: int
    head: int
    stats: HeadStats
    flags: list[str]


def layer_of(name: str) -> int:
    """The block number in an attention module's name (``decoder.blocks.3.attn`` -> 3)."""
    return int(name.split(".blocks.")[1].split(".")[0])


def head_rows(maps: dict[str, Tensor], cfg: DictConfig) -> list[HeadRow]:
    """Stats and flags of every head, in stack and layer order."""
    rows = []
    for kind, names in layers_by_kind(maps).items():
        for name in names:
            stats = head_stats(maps[name], self_attention=kind != "cross")
            flags = stats.flags(flat=cfg.flat_threshold, sink=cfg.sink_threshold, diagonal=cfg.diagonal_threshold)
            for h, names_h in enumerate(flags):
                one = HeadStats(*(getattr(stats, f)[h : h + 1] for f in HeadStats.__dataclass_fields__))
                rows.append(HeadRow(name, kind, layer_of(name), h, one, names_h))
    return rows


def thresholds_line(cfg: DictConfig) -> str:
    """The flag thresholds in words, for the table's title and the header of heads.md."""
    return (
        f"flat: normalised entropy > {cfg.flat_threshold}; sink: first-token mass > {cfg.sink_threshold}; "
        f"diagonal / previous: self / previous mass > {cfg.diagonal_threshold}"
    )


def flag_counts(rows: list[HeadRow]) -> dict[str, int]:
    """How many heads carry each flag."""
    return {flag: sum(flag in r.flags for r in rows) for flag in FLAGS}


def _cells(row: HeadRow) -> list[str]:
    def number(t: Tensor) -> str:
        value = t.item()
        return "–" if math.isnan(value) else f"{value:.3f}"

    s = row.stats
    return [
        row.module,
        row.kind,
        str(row.layer),
        str(row.head),
        number(s.entropy),
        number(s.norm_entropy),
        number(s.first_mass),
        number(s.self_mass),
        number(s.prev_mass),
        ", ".join(row.flags),
    ]


def markdown(rows: list[HeadRow], header: list[str]) -> str:
    lines = [*header, "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def print_table(rows: list[HeadRow], thresholds: str, notes: list[str], *, limit: int | None = None) -> None:
    """The table on the console (flagged heads in bold), then the notes and the flag counts. Beyond
    ``limit`` rows (a large model's hundreds of heads) it shows the flagged heads first, up to
    ``limit``, and says where the whole table is (heads.md)."""
    shown = rows
    if limit is not None and len(rows) > limit:
        first = sorted(range(len(rows)), key=lambda i: not rows[i].flags)[:limit]  # flagged first, in order
        shown = [rows[i] for i in sorted(first)]
    title = f"attention heads ({thresholds})"
    if len(shown) < len(rows):
        title += f"; {len(shown)} of {len(rows)}, the flagged first: all of them are in heads.md"
    table = Table(title=title)
    for column in SHORT:
        table.add_column(column, justify="left" if column in ("module", "kind", "flags") else "right", no_wrap=True)
    for row in shown:
        table.add_row(*_cells(row), style="bold" if row.flags else None)
    console = Console(width=max(Console().width, 120))  # the full table, also when piped
    console.print(table)
    for n in notes:
        console.print(f"note: {n}")
    console.print(f"{len(rows)} heads: " + ", ".join(f"{n} {flag}" for flag, n in flag_counts(rows).items()))
