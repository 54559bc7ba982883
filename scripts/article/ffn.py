"""Experiment 3: relu / gelu / swiglu / geglu FFNs at (nearly) the same parameter count."""

from __future__ import annotations

import math

import zoo

from .common import Context, Result, ffn_parameters, pyplot, read_metrics, save_figure, train_run

NUMBER, NAME, TITLE = 3, "ffn", "FFN variants at equal parameter count"
TRAINS = True
FFNS = ("relu", "gelu", "swiglu", "geglu")
UNITS = len(FFNS)
CLAIM = (
    "At the same parameter budget SwiGLU gives better quality than a GELU FFN (article section 6, after Shazeer "
    "2020); GELU is a smoother ReLU."
)
SETUP = (
    "`zoo-train experiment=ablation_ffn model/ffn=<f>`: d_model 96, 2 layers, 4 heads; plain MLPs d_ff = 384, "
    "gated d_ff = 256 (2/3), so FFN parameters match to within the biases; 400 steps of 16 x 64 tokens, lr 2e-3, "
    "one seed."
)
HEADERS = ["ffn", "d_ff", "FFN params", "total params", "final val loss", "val ppl"]


def run(ctx: Context) -> Result:
    """relu / gelu / swiglu / geglu at (nearly) the same parameter count: final validation loss."""
    from tasks.cli.loading import load_task

    ffns = ("relu", "swiglu") if ctx.quick else FFNS
    curves, rows, final = {}, [], {}
    for ffn in ffns:
        ctx.step(f"3: train ffn={ffn}")
        run_dir = train_run(ctx, "ablation_ffn", ffn, [f"model/ffn={ffn}"])
        model = load_task(run_dir / "checkpoints" / "last.ckpt")[0].model
        curves[ffn] = read_metrics(run_dir, "val/loss")
        final[ffn] = curves[ffn][-1][1]
        rows.append(
            [
                ffn,
                model.config.resolved_d_ff,
                ffn_parameters(model),
                zoo.count_parameters(model),
                f"{final[ffn]:.4f}",
                f"{math.exp(final[ffn]):.1f}",
            ]
        )
    gated_names = [f for f in ffns if f.endswith("glu")]
    figure = _figure(ctx, curves, final, gated_names)
    gated = min(final[f] for f in gated_names)
    plain = min(final[f] for f in ffns if f not in gated_names)
    best = min(final, key=final.get)
    observed = (
        "Final validation loss: "
        + ", ".join(f"{f} {final[f]:.4f}" for f in ffns)
        + f". Best: {best}. Best gated minus best plain MLP: {gated - plain:+.4f} nats. "
        "One seed each; differences of a few hundredths are within what a second seed could move."
    )
    agreement = "yes" if all(final[f] < plain for f in gated_names) else "partial" if gated < plain else "no"
    return Result(
        NUMBER, TITLE, CLAIM, SETUP, HEADERS, rows, figure, observed, agreement, data={"final_val_loss": final}
    )


def _figure(
    ctx: Context, curves: dict[str, list[tuple[int, float]]], final: dict[str, float], gated_names: list[str]
) -> str:
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(10, 4))
    for ffn, curve in curves.items():
        left.plot([s for s, _ in curve], [v for _, v in curve], marker="o", label=ffn)
    left.set(xlabel="step", ylabel="validation loss", title="Validation loss during training")
    left.legend()
    left.grid(True, alpha=0.3)
    ffns = list(final)
    right.bar(ffns, [final[f] for f in ffns], color=["tab:green" if f in gated_names else "tab:grey" for f in ffns])
    right.set_ylim(min(final.values()) - 0.15, max(final.values()) + 0.05)
    for i, f in enumerate(ffns):
        right.text(i, final[f], f"{final[f]:.3f}", ha="center", va="bottom", fontsize=9)
    right.set(ylabel="final validation loss", title="Final validation loss (gated in green)")
    return save_figure(ctx.out / "3_ffn.png", fig)
