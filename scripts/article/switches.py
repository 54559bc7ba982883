"""Experiment 8: the switches the field adopted after the article, each against one baseline, several seeds.

QK-norm (Dehghani et al. 2023, https://arxiv.org/abs/2302.05442), soft-capped scores and logits (Gemma 2,
https://arxiv.org/abs/2408.00118), value residual (Zhou et al. 2024, https://arxiv.org/abs/2410.17897),
squared ReLU (So et al. 2021, https://arxiv.org/abs/2109.08668), Dynamic Tanh (Zhu et al. 2025,
https://arxiv.org/abs/2503.10622) and a top-1 mixture of four experts with about the dense FFN's active
parameters per token (Fedus et al. 2021, https://arxiv.org/abs/2101.03961). Each is one Hydra override of
``experiment=ablation_switches`` (``VARIANTS``; a new switch is one more line there), trained with every
seed, and judged against the baseline by whether their 95% intervals separate (``seeds``). The Muon
optimizer (``optimizer=muon``) is not among them: torch's Muon orthogonalises in bfloat16, which on a CPU
without bf16 units made one step about 17 times as slow as AdamW's; its comparison needs a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .common import Context, Result, pyplot, read_metrics, save_figure, train_run
from .page import md_table
from .seeds import fmt, separated, summarize

NUMBER, NAME, TITLE = 8, "switches", "Today's switches against one baseline"
TRAINS = True
VARIANTS: dict[str, list[str]] = {  # name -> zoo-train overrides of experiment=ablation_switches
    "baseline": [],
    "qk_norm": ["model/qk_norm=rmsnorm"],
    "softcap": ["model/attention=math", "model.attn_softcap=50", "model.final_softcap=30"],
    "value_residual": ["model.value_residual=true"],
    "relu2": ["model/ffn=relu2"],
    "dyt": ["model/norm=dyt"],
    # four SwiGLU experts of width 170, one per token: 3 x 64 x 170 = 32,640 active FFN weights per block
    # against the dense GELU's 2 x 64 x 256 = 32,768 (plus a 64 x 4 router)
    "moe": ["model/ffn=moe", "model.n_experts=4", "model.moe_top_k=1", "model.d_ff=170"],
}
SEEDS = (0, 1, 2)
QUICK_VARIANTS, QUICK_SEEDS = ("baseline", "qk_norm"), (0, 1)  # --quick: one switch against the baseline
UNITS = len(VARIANTS) * len(SEEDS)
CLAIM = (
    "Each switch the field adopted after the article (QK-norm, soft-capping, value residual, squared ReLU, "
    "DyT, a mixture of experts at about equal active parameters) trains a decoder to a lower loss in the same "
    "steps than the baseline it replaces, as its paper reports."
)
SETUP = (
    "`zoo-train experiment=ablation_switches <override> seed=<s>` for seeds 0, 1, 2: a gpt-tiny decoder at "
    "d_model 64, 4 layers, 4 heads, learned positions, no biases, GELU FFN (d_ff 256), Pre-LayerNorm, AdamW; "
    "1,000 steps of 8 x 64 tokens; validation loss on the same 40 batches every 250 steps. Overrides: "
    + "; ".join(f"{name} `{' '.join(o)}`" for name, o in VARIANTS.items() if o)
    + ". Mean ± sample standard deviation over the seeds; 95% interval = mean ± t(n-1) std / sqrt(n)."
)
HEADERS = ["variant", "val loss per seed", "val loss", "95% interval", "minus baseline", "apart from baseline"]
Curve = list[tuple[int, float]]


def standing(variant: Sequence[float], baseline: Sequence[float]) -> str:
    """How one variant's final losses stand against the baseline's: "lower", "higher" (the 95% intervals
    separate) or "not separable"."""
    a, b = summarize(variant), summarize(baseline)
    if not separated(a.interval, b.interval):
        return "not separable"
    return "lower" if a.mean < b.mean else "higher"


def verdict(standings: dict[str, str]) -> str:
    """The claim holds ("agrees") when every switch is lower, "does not" when none is and one is
    higher, "partial" when some are lower, otherwise "not separable at this scale"."""
    seen = set(standings.values())
    if seen == {"lower"}:
        return "agrees"
    if "lower" in seen:
        return "partial"
    return "does not" if "higher" in seen else "not separable at this scale"


def run(ctx: Context) -> Result:
    """Train every variant with every seed; the final validation loss of each against the baseline's."""
    names, seeds = (QUICK_VARIANTS, QUICK_SEEDS) if ctx.quick else (tuple(VARIANTS), SEEDS)
    curves: dict[str, list[Curve]] = {}
    for name in names:
        for seed in seeds:
            ctx.step(f"8: train {name} seed={seed}")
            run_dir = train_run(ctx, "ablation_switches", f"{name}_seed{seed}", [*VARIANTS[name], f"seed={seed}"])
            curves.setdefault(name, []).append(read_metrics(run_dir, "val/loss"))
    final = {name: [c[-1][1] for c in cs] for name, cs in curves.items()}
    base = final["baseline"]
    standings = {name: standing(v, base) for name, v in final.items() if name != "baseline"}
    rows = [_row(name, values, base, standings.get(name, "")) for name, values in final.items()]
    steps = curves["baseline"][0][-1][0] + 1
    return Result(
        NUMBER,
        TITLE,
        CLAIM,
        SETUP,
        HEADERS,
        rows,
        _figure(ctx, curves, steps),
        _observed(final, standings, seeds, steps),
        verdict(standings),
        data={"seeds": list(seeds), "steps": steps, "final_val_loss": final, "standings": standings},
    )


def _row(name: str, values: list[float], base: list[float], standing_: str) -> list[Any]:
    s = summarize(values)
    lo, hi = s.interval
    diff = "" if name == "baseline" else f"{s.mean - summarize(base).mean:+.4f}"
    return [name, ", ".join(f"{v:.4f}" for v in values), fmt(values, 4), f"[{lo:.4f}, {hi:.4f}]", diff, standing_]


def _observed(final: dict[str, list[float]], standings: dict[str, str], seeds: Sequence[int], steps: int) -> str:
    groups = {kind: [n for n, s in standings.items() if s == kind] for kind in ("lower", "higher", "not separable")}
    said = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in groups.items() if names)
    best = min(final, key=lambda n: summarize(final[n]).mean)
    return (
        f"Validation loss after {steps} steps, mean ± std over seeds {', '.join(map(str, seeds))}: "
        + ", ".join(f"{n} {fmt(v, 4)}" for n, v in final.items())
        + f". Lowest mean: {best}. Against the baseline's 95% interval, {said}."
    )


def page_tables(record: dict[str, Any]) -> list[str]:
    """The overrides that make each variant, so any row can be rerun by hand."""
    rows = [
        [name, " ".join(f"`{o}`" for o in VARIANTS.get(name, [])) or "(none)"]
        for name in record["data"]["final_val_loss"]
    ]
    return [
        "Each variant's overrides of `experiment=ablation_switches`:",
        "",
        md_table(["variant", "overrides"], rows),
        "",
    ]


def _figure(ctx: Context, curves: dict[str, list[Curve]], steps: int) -> str:
    fig, ax = pyplot().subplots(figsize=(7.5, 4.2))
    for i, (name, runs) in enumerate(curves.items()):
        for j, curve in enumerate(runs):
            x, y = zip(*curve, strict=True)
            ax.plot(x, y, color=f"C{i}", alpha=0.8, lw=1.2, label=name if j == 0 else None)
    ax.set(xlabel="step", ylabel="validation loss", title=f"Switches against the baseline, {steps} steps")
    ax.legend(fontsize=8, ncol=2)
    return save_figure(ctx.out / "8_switches.png", fig)
