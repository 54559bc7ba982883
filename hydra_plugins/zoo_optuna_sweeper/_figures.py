"""The figures of zoo-sweep-report: one PNG per swept parameter, the monitored metric against it
(one line per value of the other parameter, where a grid sweeps two and that one takes a few values).

Private (leading underscore) so that Hydra's plugin scan does not import it; matplotlib is imported
only when a figure is drawn.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from hydra_plugins.zoo_optuna_sweeper.report import Sweep, Trial

STATE_STYLES: tuple[tuple[str, dict[str, Any]], ...] = (  # how a trial that ended in each state is drawn
    ("COMPLETE", {"color": "tab:blue", "label": "complete"}),
    ("PRUNED", {"facecolors": "none", "edgecolors": "tab:orange", "label": "pruned (last report)"}),
    ("INCOMPLETE", {"facecolors": "none", "edgecolors": "tab:gray", "label": "incomplete"}),
)


def plot(sweep: Sweep, out_dir: Path) -> list[Path]:
    """One PNG per swept parameter: the metric against it. Numbers on a linear or log axis (log-searched,
    spanning two decades, or a grid of values each at least twice the last), joined by one line per
    value of the other parameter where there is one other with a few values (``series_of``); other
    values as a box and jittered points per value. A parameter with no trial that reported a (non-NaN)
    value gets no figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for name in sweep.params:
        shown = [t for t in sweep.trials if name in t.params and t.value is not None and not math.isnan(t.value)]
        if not shown:
            continue
        fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
        draw(ax, sweep, name, shown)
        fig.tight_layout()
        path = out_dir / f"sweep_{re.sub(r'[^A-Za-z0-9_.-]+', '_', name.lstrip('+'))}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def draw(ax: Axes, sweep: Sweep, name: str, shown: list[Trial]) -> None:
    """The metric of the ``shown`` trials against parameter ``name``, on ``ax``: the points by state,
    the best trial starred, the axes labelled."""
    values = [t.params[name] for t in shown]
    numeric = name not in sweep.categorical and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
    )
    xs = [float(v) for v in values] if numeric else boxes(ax, name, shown)
    other = series_of(sweep, name, shown) if numeric else None
    if other is not None:
        for value in sorted({str(t.params[other]) for t in shown}, key=category_order):
            line = sorted((x, t.value) for x, t in zip(xs, shown, strict=True) if str(t.params[other]) == value)
            ax.plot(*zip(*line, strict=True), linewidth=1.5, zorder=2, label=f"{other}={value}")
    scatter(ax, xs, shown, sweep.best_trial())
    if numeric and (name in sweep.log_params or _log_spaced(xs)):
        ax.set_xscale("log")
    ax.set_xlabel(name)
    ax.set_ylabel(f"{sweep.metric} ({'lower' if sweep.mode == 'min' else 'higher'} is better)")
    ax.set_title(f"{sweep.metric} vs {name} ({len(shown)} trials)")
    ax.ticklabel_format(axis="y", useOffset=False)  # the metric's own values, not "1e-5 + 5.698"
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def series_of(sweep: Sweep, name: str, shown: list[Trial]) -> str | None:
    """The parameter whose values each get a line in ``name``'s figure: the one other swept parameter,
    where there is exactly one and the ``shown`` trials give it 2 to 6 values (e.g. optimizer=adamw,muon
    against optimizer.lr); else None (points alone)."""
    others = [p for p in sweep.params if p != name]
    if len(others) != 1 or not all(others[0] in t.params for t in shown):
        return None
    return others[0] if 2 <= len({str(t.params[others[0]]) for t in shown}) <= 6 else None


def _log_spaced(xs: list[float]) -> bool:
    """Positive values spanning two decades, or three or more each at least twice the last (a grid such
    as 1e-3,3e-3,1e-2 or 64,128,256)."""
    points = sorted(set(xs))
    if points[0] <= 0:
        return False
    doubling = len(points) >= 3 and all(b >= 2 * a for a, b in zip(points, points[1:], strict=False))
    return points[-1] / points[0] >= 100 or doubling


def boxes(ax: Axes, name: str, shown: list[Trial]) -> list[float]:
    """A box of the metric per value of ``name`` (labels on the x axis, numbers first), and each trial's
    x position: its value's slot plus a jitter fixed by its trial number, so that reruns draw alike."""
    values = [t.params[name] for t in shown]
    categories = sorted({str(v) for v in values}, key=category_order)
    position = {c: i for i, c in enumerate(categories)}
    groups = [[t.value for t in shown if str(t.params[name]) == c] for c in categories]
    ax.boxplot(groups, positions=range(len(categories)), widths=0.5, showfliers=False)
    ax.set_xticks(range(len(categories)), categories)
    jitter = [((t.number * 0.618) % 1 - 0.5) * 0.25 for t in shown]
    return [position[str(v)] + j for v, j in zip(values, jitter, strict=True)]


def scatter(ax: Axes, xs: list[float], shown: list[Trial], best: Trial | None) -> None:
    """The ``shown`` trials at ``xs``, styled by how they ended (other states, FAIL among them, are not drawn);
    ``best`` as a red star where it is among them."""
    for state, style in STATE_STYLES:
        pts = [(x, t.value) for x, t in zip(xs, shown, strict=True) if t.state == state]
        if pts:
            ax.scatter(*zip(*pts, strict=True), s=36, zorder=3, **style)
    if best is not None and best in shown:
        ax.scatter(
            [xs[shown.index(best)]],
            [best.value],
            marker="*",
            s=220,
            color="tab:red",
            zorder=4,
            label=f"best (trial {best.number})",
        )


def category_order(text: str) -> tuple[bool, float, str]:
    """Numbers first, by value; then the other labels, alphabetically."""
    try:
        return False, float(text), text
    except ValueError:
        return True, 0.0, text
