"""Experiment 2's figure: gradient norm per layer at initialisation, the output change of one step against
depth, and the training curves of the deepest sweep runs."""

from __future__ import annotations

import math
from typing import Any

from .common import Context, plain_log_x, pyplot, save_figure

COLORS = {"pre": "tab:blue", "post": "tab:red", "sandwich": "tab:green", "deepnorm": "tab:purple"}


def figure(ctx: Context, data: dict[str, Any]) -> str:
    fig, (grads, steps, sweep) = pyplot().subplots(1, 3, figsize=(17, 4.8))
    _grads(grads, data["grads"])
    _steps(steps, data["steps"])
    _sweep(sweep, data["sweep"])
    fig.suptitle("Norm placement: d_model 64, 4 heads; (a), (b) at initialisation, (c) no gradient clipping")
    return save_figure(ctx.out / "2_norm.png", fig)


def _grads(ax: Any, grads: dict[str, dict[int, list[float]]]) -> None:
    depths = sorted({d for by_depth in grads.values() for d in by_depth})
    styles = dict(zip(depths, (":", "--", "-"), strict=False))
    for placement, by_depth in grads.items():
        for depth, norms in by_depth.items():
            label = f"{placement}, {depth} layers"
            ax.plot(range(1, depth + 1), norms, styles.get(depth, "-"), color=COLORS.get(placement), label=label)
    ax.set(
        yscale="log",
        xlabel="layer (1 = next to the embeddings)",
        ylabel="gradient norm of the layer's FFN weights",
        title="(a) Gradients per layer at initialisation",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2)


def _steps(ax: Any, steps: dict[str, dict[int, float]]) -> None:
    for placement, by_depth in steps.items():
        depths = sorted(by_depth)
        ax.plot(depths, [by_depth[d] for d in depths], "-o", color=COLORS.get(placement), label=placement)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="layers",
        ylabel="mean squared change of the logits",
        title="(b) How far one Adam step (lr 1e-3) moves the output",
    )
    plain_log_x(ax, sorted({d for by_depth in steps.values() for d in by_depth}))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def _sweep(ax: Any, sweep: list[dict[str, Any]]) -> None:
    deepest = max(r["depth"] for r in sweep)
    top = max(r["lr"] for r in sweep)
    for r in (r for r in sweep if r["depth"] == deepest and r["lr"] == top):
        values = [v if math.isfinite(v) else float("nan") for _, v in r["curve"]]
        style = "-" if r["warmup"] else "--"
        label = f"{r['placement']}, warmup {r['warmup']}{' (diverged)' if r['diverged'] else ''}"
        ax.plot([s for s, _ in r["curve"]], values, style, color=COLORS.get(r["placement"]), label=label)
    starts = [r["curve"][0][1] for r in sweep if r["curve"] and math.isfinite(r["curve"][0][1])]
    if starts:
        ax.set_ylim(top=max(starts) + 1.0)  # a diverging curve runs off the top instead of squashing the rest
    ax.set(xlabel="step", ylabel="training loss", title=f"(c) Training at {deepest} layers, lr {top:g}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
