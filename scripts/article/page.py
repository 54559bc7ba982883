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
        f"Six claims of {ARTICLE} tested on a small CPU. Command of the last run: "
        f"`{meta['command']}` (records of earlier runs are kept).  ",
        f"Date: {meta['date']}. Machine: {meta['machine']}. Total time: {meta['total_seconds'] / 60:.1f} min "
        f"({meta['threads']} PyTorch thread; the cores were shared with other work).",
        "",
        "Trained experiments (1-3) run zoo-train's `train()` on `conf/experiment/ablation_*.yaml`; 4-6 "
        "measure the library. Everything is seeded; numbers are from one seed at tiny scale and say what "
        "happens here, not what happens at the article's scale.",
        "",
        md_table(
            ["#", "experiment", "agreement", "time"],
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
        f"**Agrees with the article:** {r['agreement']}. Time: {r['seconds']:.0f} s.",
        "",
    ]
