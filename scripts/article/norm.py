"""Experiment 2: Pre-Norm vs Post-Norm at several depths, with and without warmup, at a high learning rate."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .common import Context, Result, pyplot, read_metrics, save_figure, train_run

NUMBER, NAME, TITLE = 2, "norm", "Pre-Norm vs Post-Norm"
TRAINS = True
UNITS = 12  # 3 depths x 2 placements x 2 warmups
CLAIM = (
    "Post-Norm trains less stably and deep Post-Norm networks diverge easily; Pre-Norm's clean residual path "
    "lets a network go deeper without lowering the learning rate (article section 5)."
)
SETUP = (
    "`zoo-train experiment=ablation_norm model/norm_placement=<pre|post> model.n_layers=<d> "
    "scheduler.warmup_steps=<0|30>`: gpt-tiny layout at d_model 64, 4 heads, lr 3e-3 (AdamW, cosine decay), no "
    "gradient clipping, 150 steps of 16 x 64 tokens. Diverged = a non-finite loss, or the mean of the last three "
    "logged losses above the first."
)
HEADERS = [
    "layers",
    "placement",
    "warmup steps",
    "first loss",
    "max loss after it",
    "last loss",
    "val loss",
    "diverged",
]
Curves = dict[str, list[tuple[int, float]]]


def diverged(losses: Sequence[float]) -> bool:
    """A run diverged when a loss is not finite or the loss at the end is above where it started."""
    if not losses or any(not math.isfinite(v) for v in losses):
        return True
    tail = losses[-3:]
    return sum(tail) / len(tail) > losses[0]


def run(ctx: Context) -> Result:
    """Pre vs Post placement at several depths, with and without warmup, at a high learning rate."""
    depths = [2] if ctx.quick else [2, 6, 12]
    warmups = [0] if ctx.quick else [0, 30]
    curves: Curves = {}
    rows = []
    for depth in depths:
        for placement in ("pre", "post"):
            for warmup in warmups:
                name = f"{placement}_L{depth}_w{warmup}"
                ctx.step(f"2: train {placement}-norm, {depth} layers, warmup {warmup}")
                run_dir = train_run(
                    ctx,
                    "ablation_norm",
                    name,
                    [
                        f"model/norm_placement={placement}",
                        f"model.n_layers={depth}",
                        f"scheduler.warmup_steps={warmup}",
                    ],
                )
                curves[name] = read_metrics(run_dir, "train/loss")
                rows.append(_row(depth, placement, warmup, curves[name], read_metrics(run_dir, "val/loss")))
    figure = _figure(ctx, curves, depths, warmups)
    val_of = {(r[0], r[1], r[2]): (float(r[6]) if r[6] != "-" and r[7] == "no" else math.inf) for r in rows}
    gap = {(d, w): val_of[(d, "post", w)] - val_of[(d, "pre", w)] for d in depths for w in warmups}
    div = [f"{r[1]}-norm {r[0]} layers warmup {r[2]}" for r in rows if r[7] == "yes"]
    spikes = [f"{r[1]}-norm {r[0]} layers warmup {r[2]} (to {r[4]})" for r in rows if float(r[4]) > float(r[3])]
    observed = (
        "Validation loss of Post-Norm minus Pre-Norm (positive = Post-Norm worse; inf = diverged): "
        + ", ".join(f"{d} layers warmup {w}: {gap[(d, w)]:+.3f}" for d in depths for w in warmups)
        + f". Diverged runs: {', '.join(div) if div else 'none'}. Loss spikes above the first logged loss "
        f"after it: {', '.join(spikes) if spikes else 'none'}."
    )
    claims = [
        gap[(depths[-1], 0)] > 0.05,  # deep Post-Norm without warmup is clearly worse (or diverges)
        gap[(depths[-1], 0)] > gap[(depths[0], 0)],
    ]  # and the gap grows with depth
    agreement = "yes" if all(claims) else "partial" if any(claims) else "no"
    return Result(NUMBER, TITLE, CLAIM, SETUP, HEADERS, rows, figure, observed, agreement, data={"curves": curves})


def _row(
    depth: int, placement: str, warmup: int, curve: list[tuple[int, float]], val: list[tuple[int, float]]
) -> list[object]:
    losses = [v for _, v in curve]
    return [
        depth,
        placement,
        warmup,
        f"{losses[0]:.2f}" if losses else "-",
        f"{max(losses[1:], default=math.nan):.2f}",
        f"{losses[-1]:.2f}" if losses else "-",
        f"{val[-1][1]:.3f}" if val else "-",
        "yes" if diverged(losses) else "no",
    ]


def _figure(ctx: Context, curves: Curves, depths: list[int], warmups: list[int]) -> str:
    fig, axes = pyplot().subplots(1, len(depths), figsize=(4.2 * len(depths) + 1, 4), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, depth in zip(axes, depths, strict=True):
        for placement, color in (("pre", "tab:blue"), ("post", "tab:red")):
            for warmup in warmups:
                curve = curves[f"{placement}_L{depth}_w{warmup}"]
                values = [v if math.isfinite(v) else float("nan") for _, v in curve]
                ax.plot(
                    [s for s, _ in curve],
                    values,
                    color=color,
                    linestyle="-" if warmup else "--",
                    label=f"{placement}-norm, warmup {warmup}",
                )
        ax.set(title=f"{depth} layers", xlabel="step")
        ax.grid(True, alpha=0.3)
    starts = [c[0][1] for c in curves.values() if c and math.isfinite(c[0][1])]
    if starts:
        axes[0].set_ylim(top=max(starts) + 1.0)  # a diverging curve runs off the top instead of squashing the rest
    axes[0].set_ylabel("training loss")
    axes[0].legend(fontsize=8)
    fig.suptitle("Pre-Norm vs Post-Norm (d_model 64, lr 3e-3, no gradient clipping)")
    return save_figure(ctx.out / "2_norm.png", fig)
