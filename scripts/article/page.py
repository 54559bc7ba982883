"""The results page, ``README.md``, written from every record in ``results.json``.

Each record gets the same section (claim, setup, its table, its figure, what was seen, agreement); an
experiment module adds tables of its own through ``page_tables(record) -> list[str]`` (markdown lines
placed after the main table), found in the registry the caller passes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ARTICLE = "the design article (shared/seed, Chinese)"


def md_table(headers: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(str(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_page(out: Path, results: dict[str, Any], experiments: Mapping[int, ModuleType] | None = None) -> Path:
    """``out/README.md`` from every record in ``results`` (the contents of results.json); ``experiments``
    maps a record's number to its module, whose ``page_tables`` (if any) adds to its section."""
    records = sorted(results["experiments"].values(), key=lambda r: r["number"])
    parts = _intro(results["meta"], records)
    for record in records:
        parts += _section(record, getattr((experiments or {}).get(record["number"]), "page_tables", None))
    page = out / "README.md"
    page.write_text("\n".join(parts))
    return page


def _intro(meta: dict[str, Any], records: list[dict[str, Any]]) -> list[str]:
    return [
        "# The article's claims at small scale",
        "",
        f"{len(records)} claim{'s' if len(records) > 1 else ''} of {ARTICLE} tested on a small CPU. "
        "Command of the last run: "
        f"`{meta['command']}` (records of earlier runs are kept).  ",
        f"Date: {meta['date']}. Machine: {meta['machine']}. Total time: {meta['total_seconds'] / 60:.1f} min "
        f"({meta['threads']} PyTorch thread; the cores were shared with other work){_wall(meta)}.",
        "",
        "Trained experiments run zoo-train's `train()` on `conf/experiment/ablation_*.yaml`; the others "
        "measure the library. Everything is seeded, and each section names its seeds. A claim whose effect "
        "is small is trained with several seeds and reported as mean ± standard deviation: where the "
        "intervals overlap the verdict is *not separable at this scale*, which is not a *does not*. The "
        "numbers say what happens at this scale, not at the article's.",
        "",
        md_table(
            ["#", "experiment", "verdict", "time"],
            [
                [r["number"], f"[{r['title']}](#{r['number']})", r["agreement"], f"{r['seconds']:.0f} s"]
                for r in records
            ],
        ),
        "",
    ]


def _section(r: dict[str, Any], page_tables: Callable[[dict[str, Any]], list[str]] | None) -> list[str]:
    parts = [
        f'<a id="{r["number"]}"></a>',
        f"## {r['number']}. {r['title']}",
        "",
        f"**Claim.** {r['claim']}",
        "",
        f"**Setup.** {r['setup']}",
        "",
        md_table(r["headers"], r["rows"]),
        "",
    ]
    if page_tables is not None:
        parts += page_tables(r)
    return parts + [
        f"![{r['title']}]({r['figure']})",
        "",
        f"**What we saw.** {r['observed']}",
        "",
        f"**Verdict:** {r['agreement']}. Seeds: {_seeds(r)}. Time: {r['seconds']:.0f} s.",
        "",
    ]


def _seeds(r: dict[str, Any]) -> str:
    """The record's ``data["seeds"]``: a list, or a mapping of what was seeded to a list."""
    seeds = r.get("data", {}).get("seeds")
    if not seeds:
        return f"{r['number']} (the driver seeds each experiment by its number)"
    if isinstance(seeds, dict):
        return "; ".join(f"{what} {', '.join(map(str, values))}" for what, values in seeds.items())
    return ", ".join(map(str, seeds))


def _wall(meta: dict[str, Any]) -> str:
    """The wall-clock time, where the experiments ran side by side and it differs from their sum."""
    wall = meta.get("wall_seconds")
    return f"; {wall / 60:.1f} min of wall-clock time" if wall else ""
