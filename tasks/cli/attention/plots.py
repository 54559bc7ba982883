"""zoo-attention's figures: a heatmap per attention layer (a panel per head) and the attention
rollout (Abnar & Zuidema 2020, https://arxiv.org/abs/2005.00928) of each stack's self-attention.
Importing this module selects matplotlib's file-only backend (Agg)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
from torch import Tensor

from tasks.cli.attention.heads import HeadRow, layer_of
from zoo.inspect import attention_rollout, layers_by_kind

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib.colors import PowerNorm  # noqa: E402

FILE_STEM = {"encoder self": "encoder_self", "decoder self": "decoder_self", "cross": "cross"}


def _tick_size(n: int, inches: float) -> float:
    """A font size (points) that lets n labels share ``inches`` without overlapping."""
    return max(3.5, min(9.0, 0.8 * inches * 72 / max(n, 1)))


def _panel_inches(n: int) -> float:
    return max(2.8, min(9.0, 0.17 * n + 1.2))


def plot_layer(
    path: Path, probs: Tensor, title: str, q_labels: list[str], k_labels: list[str], rows: list[HeadRow]
) -> None:
    """One figure for one layer: a panel per head, a shared colour bar. Probabilities are on one
    0..1 scale for every head, square-root spaced so that weak links stay visible; keys a query
    cannot see are grey."""
    H, Tq, Tk = probs.shape
    cols = math.ceil(math.sqrt(H))
    n_rows = math.ceil(H / cols)
    width, height = _panel_inches(Tk), _panel_inches(Tq)
    fig, axes = plt.subplots(
        n_rows, cols, figsize=(cols * width + 1.2, n_rows * (height + 0.5) + 0.9), squeeze=False, layout="constrained"
    )
    cmap = plt.get_cmap("viridis").with_extremes(bad="#d9d9d9")
    hidden = ~(probs > 0).any(dim=0)  # (Tq, Tk): masked for every head
    image = None
    for h, ax in enumerate(axes.flat):
        if h >= H:
            ax.axis("off")
            continue
        values = probs[h].float().masked_fill(hidden, math.nan).numpy()
        image = ax.imshow(
            values, cmap=cmap, norm=PowerNorm(0.5, vmin=0.0, vmax=1.0), interpolation="nearest", aspect="auto"
        )
        row = rows[h]
        flags = f" [{', '.join(row.flags)}]" if row.flags else ""
        ax.set_title(f"head {h}{flags}\nnormalised entropy {row.stats.norm_entropy.item():.2f}", fontsize=9)
        ax.set_xticks(range(Tk), k_labels, rotation=90, fontsize=_tick_size(Tk, width))
        ax.set_yticks(range(Tq), q_labels, fontsize=_tick_size(Tq, height))
        ax.tick_params(length=0)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, label="attention probability (square-root scale)")
    fig.suptitle(title, fontsize=11)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_rollout(path: Path, rollout: Tensor, title: str, labels: list[str]) -> None:
    """The (T, T) rollout: row i = how much position i at the top of the stack draws from each input token."""
    T = rollout.shape[0]
    side = _panel_inches(T) + 1.5
    fig, ax = plt.subplots(figsize=(side + 1.2, side + 0.6), layout="constrained")
    image = ax.imshow(
        rollout.numpy(), cmap="magma", norm=PowerNorm(0.5, vmin=0.0, vmax=float(rollout.max())), interpolation="nearest"
    )
    ax.set_xticks(range(T), labels, rotation=90, fontsize=_tick_size(T, side))
    ax.set_yticks(range(T), labels, fontsize=_tick_size(T, side))
    ax.set_xlabel("input token")
    ax.set_ylabel("position at the top of the stack")
    ax.tick_params(length=0)
    fig.colorbar(image, ax=ax, shrink=0.7, label="rolled-out attention (square-root scale)")
    ax.set_title(title, fontsize=10)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_figures(
    out: Path,
    maps: dict[str, Tensor],
    rows: list[HeadRow],
    src_labels: list[str],
    tgt_labels: list[str] | None,
    notes: list[str],
) -> list[Path]:
    """Every layer's heatmap and each self-attention stack's rollout into ``out``; the files written.
    Cross-attention reads another sequence, so it has no square map to roll out."""
    axes = {
        "encoder self": (src_labels, src_labels),
        "decoder self": (tgt_labels or src_labels,) * 2,
        "cross": (tgt_labels, src_labels),
    }  # (query labels, key labels)
    note = f"\n{'; '.join(notes)}" if notes else ""
    written: list[Path] = []
    for kind, names in layers_by_kind(maps).items():
        q_labels, k_labels = axes[kind]
        for name in names:
            path = out / f"{FILE_STEM[kind]}_layer{layer_of(name)}.png"
            axes_note = "target queries down, source keys across" if kind == "cross" else "queries down, keys across"
            title = f"{name}: {kind}-attention, layer {layer_of(name)} ({axes_note}){note}"
            plot_layer(path, maps[name], title, q_labels, k_labels, [r for r in rows if r.module == name])
            written.append(path)
        if kind != "cross":
            stack = kind.split()[0]
            rollout = attention_rollout([maps[n] for n in names])
            path = out / f"rollout_{stack}.png"
            plot_rollout(
                path,
                rollout,
                f"attention rollout, {stack} self-attention\n({len(names)} layers; heads "
                f"averaged, identity added for the residual){note}",
                q_labels,
            )
            written.append(path)
    return written
