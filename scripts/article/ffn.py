"""Experiment 3: relu / gelu / swiglu / geglu FFNs at exactly the same parameter count, several seeds each.

The claim (SwiGLU beats GELU at equal parameters) rests on differences of a few hundredths of a nat in
Shazeer's own table (https://arxiv.org/abs/2002.05202, table 1), the size of the seed-to-seed spread at this
scale: each FFN is trained with every seed, and SwiGLU is judged against GELU by whether their 95% intervals
separate (``seeds``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import zoo

from .common import Context, Result, ffn_parameters, pyplot, read_metrics, save_figure, train_run
from .page import md_table
from .seeds import fmt, separated, summarize

NUMBER, NAME, TITLE = 3, "ffn", "FFN variants at equal parameter count"
TRAINS = True
FFNS = ("relu", "gelu", "swiglu", "geglu")
SEEDS = (0, 1, 2)
QUICK_FFNS, QUICK_SEEDS = ("gelu", "swiglu"), (0, 1)  # --quick: the two the verdict compares, a few steps each
UNITS = len(FFNS) * len(SEEDS)
CLAIM = (
    "At the same parameter budget SwiGLU gives better quality than a GELU FFN (article section 6, after Shazeer "
    "2020, https://arxiv.org/abs/2002.05202); GELU is a smoother ReLU."
)
SETUP = (
    "`zoo-train experiment=ablation_ffn model/ffn=<f> seed=<s>` for seeds 0, 1, 2: gpt-tiny layout at d_model 72, "
    "2 layers, 4 heads, no biases (`model.bias=false`); plain MLPs d_ff = 288, gated d_ff = 192 (2/3), so every "
    "variant has exactly 41,472 FFN parameters per block; 2,000 steps of 8 x 64 tokens, lr 2e-3 (AdamW, cosine); "
    "validation loss on the same 40 batches (20k tokens) every 250 steps. Mean ± sample standard deviation over "
    "the seeds; 95% interval = mean ± t(n-1) std / sqrt(n)."
)
HEADERS = ["ffn", "d_ff", "FFN params", "total params", "val loss per seed", "val loss", "95% interval", "val ppl"]
Curve = list[tuple[int, float]]


def verdict(swiglu: Sequence[float], gelu: Sequence[float]) -> str:
    """The verdict on the claim from the final validation losses of SwiGLU and GELU (one per seed):
    "agrees" when SwiGLU's 95% interval lies below GELU's, "does not" when above, otherwise
    "not separable at this scale" (the intervals overlap, or one seed leaves them unbounded)."""
    a, b = summarize(swiglu), summarize(gelu)
    if not separated(a.interval, b.interval):
        return "not separable at this scale"
    return "agrees" if a.mean < b.mean else "does not"


def run(ctx: Context) -> Result:
    """Train each FFN with each seed; final validation loss per seed, its mean ± std and interval."""
    from tasks.cli.loading import load_task

    ffns, seeds = (QUICK_FFNS, QUICK_SEEDS) if ctx.quick else (FFNS, SEEDS)
    curves: dict[str, list[Curve]] = {}
    rows, ffn_params = [], {}
    for ffn in ffns:
        for seed in seeds:
            ctx.step(f"3: train ffn={ffn} seed={seed}")
            run_dir = train_run(ctx, "ablation_ffn", f"{ffn}_seed{seed}", [f"model/ffn={ffn}", f"seed={seed}"])
            curves.setdefault(ffn, []).append(read_metrics(run_dir, "val/loss"))
        model = load_task(run_dir / "checkpoints" / "last.ckpt")[0].model
        ffn_params[ffn] = ffn_parameters(model)
        final = [c[-1][1] for c in curves[ffn]]
        s = summarize(final)
        lo, hi = s.interval
        rows.append(
            [
                ffn,
                model.config.resolved_d_ff,
                ffn_params[ffn],
                zoo.count_parameters(model),
                ", ".join(f"{v:.4f}" for v in final),
                fmt(final, 4),
                f"[{lo:.4f}, {hi:.4f}]",
                f"{math.exp(s.mean):.1f}",
            ]
        )
    final = {ffn: [c[-1][1] for c in cs] for ffn, cs in curves.items()}
    steps = curves[ffns[0]][0][-1][0] + 1
    return Result(
        NUMBER,
        TITLE,
        CLAIM,
        SETUP,
        HEADERS,
        rows,
        _figure(ctx, curves, steps),
        _observed(final, ffn_params, seeds, steps),
        verdict(final["swiglu"], final["gelu"]),
        data={"seeds": list(seeds), "steps": steps, "final_val_loss": final, "ffn_params": ffn_params},
    )


def _observed(final: dict[str, list[float]], ffn_params: dict[str, int], seeds: Sequence[int], steps: int) -> str:
    sw, ge = summarize(final["swiglu"]), summarize(final["gelu"])
    apart = "do not overlap" if separated(sw.interval, ge.interval) else "overlap"
    params = (
        f"FFN parameters are equal in every variant ({ffn_params['gelu']:,} in all blocks together)"
        if len(set(ffn_params.values())) == 1
        else "FFN parameters differ: " + ", ".join(f"{f} {n:,}" for f, n in ffn_params.items())
    )
    best = min(final, key=lambda f: summarize(final[f]).mean)
    return (
        f"Validation loss after {steps} steps, mean ± std over seeds {', '.join(map(str, seeds))}: "
        + ", ".join(f"{f} {fmt(v, 4)}" for f, v in final.items())
        + f". Lowest mean: {best}. SwiGLU minus GELU: {sw.mean - ge.mean:+.4f} nats; their 95% intervals "
        f"[{sw.interval[0]:.4f}, {sw.interval[1]:.4f}] and [{ge.interval[0]:.4f}, {ge.interval[1]:.4f}] {apart}. "
        f"{params}."
    )


def page_tables(record: dict[str, Any]) -> list[str]:
    """Every gated FFN against every plain one: difference of mean validation loss and whether the 95%
    intervals separate (records written before experiment 3 had seeds add nothing)."""
    data = record.get("data", {})
    if "seeds" not in data:
        return []
    final = {f: summarize(v) for f, v in data["final_val_loss"].items()}
    rows = [
        [
            f"{g} - {p}",
            f"{final[g].mean - final[p].mean:+.4f}",
            "yes" if separated(final[g].interval, final[p].interval) else "no",
        ]
        for g in final
        if g.endswith("glu")
        for p in final
        if not p.endswith("glu")
    ]
    head = "Gated minus plain, mean validation loss (negative: the GLU is better):"
    return [head, "", md_table(["pair", "difference (nats)", "intervals separate"], rows), ""]


def _figure(ctx: Context, curves: dict[str, list[Curve]], steps: int) -> str:
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(11, 4.2))
    for i, (ffn, runs) in enumerate(curves.items()):
        color = f"C{i}"
        final = [c[-1][1] for c in runs]
        s = summarize(final)
        std = 0.0 if s.n < 2 else s.std
        left.errorbar([i], [s.mean], yerr=[std], fmt="s", color=color, capsize=6, markersize=8, label="mean ± std")
        left.scatter([i + 0.12] * len(final), final, color=color, alpha=0.6, s=18, label="one seed")
        n = min(len(c) for c in runs)
        x = [runs[0][k][0] for k in range(n)]
        per_step = [summarize([c[k][1] for c in runs]) for k in range(n)]
        mean = [p.mean for p in per_step]
        spread = [0.0 if p.n < 2 else p.std for p in per_step]
        right.plot(x, mean, marker="o", markersize=3, color=color, label=ffn)
        right.fill_between(
            x, [m - d for m, d in zip(mean, spread, strict=True)], [m + d for m, d in zip(mean, spread, strict=True)],
            color=color, alpha=0.2,
        )  # fmt: skip
    by_label = dict(zip(*reversed(left.get_legend_handles_labels()), strict=True))  # one entry per label
    left.legend(by_label.values(), by_label.keys(), fontsize=8)
    left.set_xticks(range(len(curves)), list(curves))
    left.set(xlabel="FFN", ylabel=f"validation loss after {steps} steps (nats)", title="Final validation loss")
    left.grid(True, axis="y", alpha=0.3)
    finals = [c[-1][1] for runs in curves.values() for c in runs]
    later = [c[min(1, len(c) - 1)][1] for runs in curves.values() for c in runs]  # from the second check on
    right.set_ylim(min(finals) - 0.05, max(later) + 0.05)
    right.set(xlabel="step", ylabel="validation loss (nats)", title="Validation loss during training (mean ± std)")
    right.legend(fontsize=8)
    right.grid(True, alpha=0.3)
    return save_figure(ctx.out / "3_ffn.png", fig)
