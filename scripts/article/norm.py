"""Experiment 2: Pre-Norm vs Post-Norm, and what fixes Post-Norm. Three measurements, cheapest first: the
gradient norm in each layer at initialisation, how far one optimizer step moves the output as depth grows
(norm_probe.py), and a training sweep over depth x learning rate x warmup without gradient clipping."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import mean
from typing import Any

from . import norm_probe
from .common import Context, Result, read_metrics, train_run
from .norm_figure import figure

NUMBER, NAME, TITLE = 2, "norm", "Pre-Norm vs Post-Norm"
TRAINS = True
PLACEMENTS = ("pre", "post", "sandwich", "deepnorm")
PROBE_DEPTHS = (6, 12, 24)
STEP_DEPTHS = (6, 12, 24, 48)
PROBE_SEEDS = (0, 1, 2)
SWEEP = {"depths": (6, 24), "lrs": (1e-3, 1e-2), "warmups": (0, 100), "placements": ("pre", "post", "deepnorm")}
UNITS = 2 + 2 * 2 * 2 * 3  # the two probes, the sweep
FAIL_MARGIN = 0.3  # nats above the Pre-Norm twin's last training loss: the run did not train
CLAIM = (
    "Post-Norm trains less stably and deep Post-Norm networks diverge easily; Pre-Norm's clean residual path "
    "lets a network go deeper without lowering the learning rate (article section 5). Xiong et al. 2020: at "
    "initialisation Post-Norm's gradients grow toward the output layers while Pre-Norm's stay flat; Liu et "
    "al. 2020: one update moves a Post-Norm network's output more, the more so the deeper it is."
)
SETUP = (
    "Probes at initialisation (zoo models built directly, gpt-tiny layout at d_model 64, 4 heads, random "
    "tokens, seeds {seeds}): (a) the gradient norm of each layer's FFN weights for a next-token loss, at "
    "{probe_depths} layers; (b) the mean squared change of the logits after one Adam step (lr 1e-3), at "
    "{step_depths} layers. (c) Training sweep: `zoo-train experiment=ablation_norm "
    "model/norm_placement=<p> model.n_layers=<d> optimizer.lr=<lr> scheduler.warmup_steps=<w>` for p in "
    "{placements}, d in {depths}, lr in {lrs}, w in {warmups}: {steps} steps of 16 x 64 tokens, AdamW with "
    "cosine decay, no gradient clipping. Diverged = a non-finite loss, or the mean of the last three logged "
    "losses above the first; failed = diverged, or a last training loss {fail} nats or more above the Pre-Norm run "
    "of the same setting. deepnorm = Wang et al. 2022 (DeepNet): Post-Norm with the residual scaled by "
    "alpha = (2N)^(1/4) and the FFN, value and output projections initialised smaller by beta = (8N)^(-1/4)."
)
HEADERS = ["placement", *(f"grad last/first @ {d}" for d in PROBE_DEPTHS), *(f"step change @ {d}" for d in STEP_DEPTHS)]
SWEEP_HEADERS = ["layers", "lr", "warmup", *SWEEP["placements"]]


def diverged(losses: Sequence[float]) -> bool:
    """A run diverged when a loss is not finite or the loss at the end is above where it started."""
    if not losses or any(not math.isfinite(v) for v in losses):
        return True
    tail = losses[-3:]
    return sum(tail) / len(tail) > losses[0]


def run(ctx: Context) -> Result:
    seeds = PROBE_SEEDS[:1] if ctx.quick else PROBE_SEEDS
    ctx.step("2: gradient norms per layer at initialisation")
    grads = _grad_probe(PROBE_DEPTHS[:1] if ctx.quick else PROBE_DEPTHS, seeds)
    ctx.step("2: output change after one step, by depth")
    steps = _step_probe(STEP_DEPTHS[:2] if ctx.quick else STEP_DEPTHS, seeds)
    sweep = _sweep(ctx)
    growth = {p: {d: curve[-1] / curve[0] for d, curve in by_depth.items()} for p, by_depth in grads.items()}
    rows = [
        [p, *(f"{growth[p][d]:.2f}" if d in growth[p] else "-" for d in PROBE_DEPTHS)]
        + [f"{steps[p][d]:.2e}" if d in steps[p] else "-" for d in STEP_DEPTHS]
        for p in PLACEMENTS
    ]
    agreement, observed = verdict(growth, steps, sweep)
    data = {"grads": grads, "growth": growth, "steps": steps, "sweep": sweep, "seeds": list(seeds)}
    setup = SETUP.format(
        seeds=list(seeds),
        probe_depths=list(PROBE_DEPTHS),
        step_depths=list(STEP_DEPTHS),
        placements=list(SWEEP["placements"]),
        depths=list(SWEEP["depths"]),
        lrs=list(SWEEP["lrs"]),
        warmups=list(SWEEP["warmups"]),
        steps=6 if ctx.quick else 300,
        fail=FAIL_MARGIN,
    )
    return Result(NUMBER, TITLE, CLAIM, setup, HEADERS, rows, figure(ctx, data), observed, agreement, data=data)


def _grad_probe(depths: Sequence[int], seeds: Sequence[int]) -> dict[str, dict[int, list[float]]]:
    """placement -> depth -> the FFN gradient norm of each layer, the mean over seeds."""
    out: dict[str, dict[int, list[float]]] = {}
    for placement in PLACEMENTS:
        out[placement] = {}
        for depth in depths:
            runs = [
                norm_probe.ffn_grad_norms(norm_probe.narrow_decoder(placement, depth, s), norm_probe.batch(s))
                for s in seeds
            ]
            out[placement][depth] = [mean(layer) for layer in zip(*runs, strict=True)]
    return out


def _step_probe(depths: Sequence[int], seeds: Sequence[int]) -> dict[str, dict[int, float]]:
    """placement -> depth -> the logits' mean squared change after one Adam step, the mean over seeds."""
    return {
        placement: {
            depth: mean(
                norm_probe.output_change(norm_probe.narrow_decoder(placement, depth, s), norm_probe.batch(s))
                for s in seeds
            )
            for depth in depths
        }
        for placement in PLACEMENTS
    }


def _sweep(ctx: Context) -> list[dict[str, Any]]:
    """One training run per depth x lr x warmup x placement: its loss curve and whether it diverged."""
    grid = SWEEP if not ctx.quick else {"depths": (2,), "lrs": (1e-2,), "warmups": (0,), "placements": ("pre", "post")}
    runs = []
    for depth in grid["depths"]:
        for lr in grid["lrs"]:
            for warmup in grid["warmups"]:
                for placement in grid["placements"]:
                    ctx.step(f"2: train {placement}-norm, {depth} layers, lr {lr:g}, warmup {warmup}")
                    name = f"{placement}_L{depth}_lr{lr:g}_w{warmup}"
                    overrides = [
                        f"model/norm_placement={placement}",
                        f"model.n_layers={depth}",
                        f"optimizer.lr={lr}",
                        f"scheduler.warmup_steps={warmup}",
                    ]
                    curve = read_metrics(train_run(ctx, "ablation_norm", name, overrides), "train/loss")
                    losses = [v for _, v in curve]
                    runs.append(
                        {"placement": placement, "depth": depth, "lr": lr, "warmup": warmup, "curve": curve}
                        | {"diverged": diverged(losses), "last": losses[-1] if losses else math.nan}
                    )
    return runs


def sweep_table(sweep: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """The sweep as a table: a row per (depth, lr, warmup), a column per placement, each cell the last training
    loss or "diverged"."""
    placements = list(dict.fromkeys(r["placement"] for r in sweep))
    cells = {(r["depth"], r["lr"], r["warmup"], r["placement"]): r for r in sweep}
    rows = []
    for depth, lr, warmup in dict.fromkeys((r["depth"], r["lr"], r["warmup"]) for r in sweep):
        cell = [cells[(depth, lr, warmup, p)] for p in placements]
        rows.append([depth, f"{lr:g}", warmup, *("diverged" if c["diverged"] else f"{c['last']:.2f}" for c in cell)])
    return ["layers", "lr", "warmup", *placements], rows


def page_tables(record: dict[str, Any]) -> list[str]:
    from .page import md_table

    if "sweep" not in record["data"]:  # a record written before the sweep was added
        return []
    headers, rows = sweep_table(record["data"]["sweep"])
    return ["Training sweep (last training loss, or diverged):", "", md_table(headers, rows), ""]


def verdict(
    growth: dict[str, dict[int, float]], steps: dict[str, dict[int, float]], sweep: list[dict[str, Any]]
) -> tuple[str, str]:
    """(agreement, what was seen) from the probes and the sweep. Claims: at the deepest probe Post-Norm's
    gradients grow toward the output more than Pre-Norm's (last/first ratio at least 1.5x Pre-Norm's);
    Post-Norm's step change grows more with depth than Pre-Norm's; in the sweep some Post-Norm run fails
    (diverges, or ends FAIL_MARGIN nats above its Pre-Norm twin) whose Pre-Norm twin trains. All hold:
    agrees; none: does not; else partial."""
    deep = max(growth["post"])
    first, last = min(steps["post"]), max(steps["post"])
    twins = {_key(r): r for r in sweep if r["placement"] == "pre"}

    def failed(r: dict[str, Any]) -> bool:
        twin = twins.get(_key(r))
        return twin is not None and not twin["diverged"] and (r["diverged"] or r["last"] > twin["last"] + FAIL_MARGIN)

    post_only = [r for r in sweep if r["placement"] == "post" and failed(r)]
    fixed = [r for r in sweep if r["placement"] == "deepnorm" and any(_key(r) == _key(p) for p in post_only)]
    checks = {
        f"Post-Norm's gradients grow toward the output more than Pre-Norm's at {deep} layers": growth["post"][deep]
        > 1.5 * growth["pre"][deep],
        "one step moves Post-Norm's output more, the more so with depth": steps["post"][last] / steps["post"][first]
        > steps["pre"][last] / steps["pre"][first],
        "some Post-Norm run fails where Pre-Norm trains": bool(post_only),
    }
    held = sum(checks.values())
    agreement = "agrees" if held == len(checks) else "does not" if held == 0 else "partial"
    seen = (
        "Gradient norm of the last layer over the first at initialisation: "
        + "; ".join(f"{p} " + ", ".join(f"{g:.2f} @ {d}" for d, g in growth[p].items()) for p in growth)
        + ". Logits' change after one step, deepest over shallowest: "
        + ", ".join(f"{p} {s[max(s)] / s[min(s)]:.1f}x" for p, s in steps.items())
        + f". Diverged in the sweep: {', '.join(_name(r) for r in sweep if r['diverged']) or 'none'}. "
        + f"Post-Norm failed where Pre-Norm trained: {', '.join(_name(r) for r in post_only) or 'nowhere'}. "
        + (f"DeepNorm failed too in {sum(map(failed, fixed))} of those {len(fixed)} settings. " if fixed else "")
        + " ".join(f"{claim}: {'yes' if ok else 'no'}." for claim, ok in checks.items())
    )
    return agreement, seen


def _key(r: dict[str, Any]) -> tuple[int, float, int]:
    return r["depth"], r["lr"], r["warmup"]


def _name(r: dict[str, Any]) -> str:
    return f"{r['placement']} {r['depth']} layers lr {r['lr']:g} warmup {r['warmup']}"
