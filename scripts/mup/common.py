"""What the muP studies share: the checked model's shape (heads HEAD_DIM wide, their number growing
with the width; muP's base width BASE), their two-panel figure (standard parametrization | muP) and
how they write their record."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

BASE = 64
HEAD_DIM = 16
OUT = Path(__file__).resolve().parents[2] / "docs" / "mup"
TITLES = {"standard": "standard parametrization", "mup": f"muP (base width {BASE})"}


def panels():
    """A figure with one panel per parametrization, sharing the y axis: (pyplot, figure, {key: axis})."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, title in zip(axes, TITLES.values(), strict=True):
        ax.set_title(title)
    return plt, fig, dict(zip(TITLES, axes, strict=True))


def save(fig, axes: dict, *, ylabel: str, title: str, path: Path) -> None:
    axes["standard"].set_ylabel(ylabel)
    for ax in (axes["mup"], axes["standard"]):  # the legend on the muP panel, where it has lines
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
            break
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_json(path: Path, record: dict) -> None:
    """``record`` as JSON (a diverged run's inf as null), replaced whole: a reader never sees half."""

    def finite(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [finite(v) for v in value]
        return value

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(finite(record), indent=1) + "\n")
    os.replace(tmp, path)
