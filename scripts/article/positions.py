"""Experiment 1: length extrapolation. One decoder per position encoding trained at length L on code,
evaluated past L three ways (non-overlapping blocks, a sliding window, the loss at each position), RoPE
also with the context-extension scalings zoo has; and the same encodings on an induction (copy) task,
where a model either copies past L or does not (induction.py)."""

from __future__ import annotations

import math
from pathlib import Path
from statistics import mean
from typing import Any

import torch

import zoo

from . import induction
from .common import Context, Result, train_run
from .extrapolation import cut_blocks, eval_blocks, loss_by_position, perplexity, rope_scaled, sliding_perplexity
from .positions_figure import figure

__all__ = ["cut_blocks", "perplexity", "run", "verdict"]  # the measurements tests call by this module's name

NUMBER, NAME, TITLE = 1, "positions", "Length extrapolation of position encodings"
TRAINS = True
VARIANTS = {  # name -> zoo-train overrides; sinusoidal as Vaswani et al. use it (embeddings times sqrt(d_model))
    "sinusoidal": ["model/position=sinusoidal", f"model.embed_scale={zoo.get_config('gpt-tiny').d_model ** 0.5}"],
    "learned": ["model/position=learned"],
    "rope": ["model/position=rope"],
    "alibi": ["model/position=alibi"],
    "t5_relative": ["model/position=t5_relative"],
    "none": ["model/position=none"],
}
ABSOLUTE = ("sinusoidal", "learned")
SCALINGS = ("linear", "ntk", "yarn")  # applied to the trained rope model at evaluation: "rope+yarn"...
COPY_SEEDS = (0, 1)
UNITS = 2 * len(VARIANTS) + 1  # train each, evaluate, copy task for each
MARGIN = 0.05  # nats: a rise past L smaller than this counts as flat
CLAIM = (
    "Absolute positions extrapolate badly past the training window; relative biases (T5) better; RoPE works "
    "inside the window but degrades outside it; ALiBi's linear distance penalty extrapolates well (article "
    "section 4, after Press et al. 2022)."
)
SETUP = (
    "Language model: `zoo-train experiment=ablation_positions model/position=<p>` for p in {positions} "
    "(sinusoidal with `model.embed_scale=sqrt(d_model)`, as Vaswani et al.; none = NoPE, order from the causal "
    "mask only): gpt-tiny (2 layers, d_model 128, 4 heads), {steps} steps of 16 x {L}-token blocks of stdlib "
    "source (L = {L}). Evaluated on {tokens} test tokens: perplexity over non-overlapping blocks of L..8L "
    "tokens; with a sliding window of n tokens moved by L, scoring each window's last L tokens (Press et al.'s "
    "evaluation: every scored token has at least n - L tokens of context); and the mean loss at each position "
    "of 8L-token blocks. *Rise past L* = mean loss at positions L..8L minus mean loss at positions L/2..L "
    "(nats; above {margin} the model gets worse where it was never trained). rope+linear / +ntk / +yarn = the "
    "trained rope model with `model.rope_scaling=<s>` for factor n/L at length n, no fine-tuning. "
    "Copy task (induction.py): rows that repeat a random segment of k tokens (vocabulary {vocab}, k from L/8 "
    "to L/4), a 2-layer d_model 128 decoder trained at length L = {copy_L} ({copy_steps} steps, batch 32, "
    "seeds {seeds}) and scored by greedy accuracy on the determined tokens (after the first segment) of rows "
    "of L, 2L and 4L: inside L and past L."
)
HEADERS = [
    "position",
    "ppl @ L",
    "ppl @ 8L blocks",
    "ppl @ 8L sliding",
    "rise past L (nats)",
    "copy acc inside L",
    "copy acc past L (4L rows)",
]


def sizes(quick: bool) -> tuple[int, int, induction.CopySetup, int | None]:
    """(L, LM steps, the copy task's setup, evaluation tokens) for a full or a quick run."""
    if quick:
        return 16, 6, induction.CopySetup(length=16, steps=8, d_model=32), 2048
    return 32, 2000, induction.CopySetup(length=32), 16384


def run(ctx: Context) -> Result:
    """Train every variant on code and on the copy task, evaluate past L, and read the verdict."""
    L, steps, copy_setup, max_tokens = sizes(ctx.quick)
    lengths = [L, 2 * L, 4 * L, 8 * L]
    variants = {k: VARIANTS[k] for k in (("rope", "alibi", "learned") if ctx.quick else VARIANTS)}
    ckpts = {name: _train(ctx, name, overrides, L, steps) for name, overrides in variants.items()}
    ctx.step("1: evaluate past the training length")
    blocks = eval_blocks(next(iter(ckpts.values())), lengths, max_tokens)
    lm = _evaluate(ckpts, blocks, L)
    copy = {name: _copy(ctx, name, copy_setup) for name in variants}
    rows = [_row(name, lm, copy.get(name), L) for name in lm["ppl"]]
    setup = SETUP.format(
        positions=list(variants),
        steps=steps,
        L=L,
        tokens=blocks[L].numel(),
        margin=MARGIN,
        vocab=induction.VOCAB,
        copy_L=copy_setup.length,
        copy_steps=copy_setup.steps,
        seeds=list(COPY_SEEDS),
    )
    seeds = {"zoo-train seed": [0], "copy task": list(COPY_SEEDS[:1] if ctx.quick else COPY_SEEDS)}
    data = {"lengths": lengths, **lm, "copy": copy, "seeds": seeds}
    rise = {name: lm["rise"][name] for name in variants}
    copy_past = {name: copy[name]["past"][str(4 * copy_setup.length)] for name in variants}
    agreement, observed = verdict(rise, copy_past)
    return Result(NUMBER, TITLE, CLAIM, setup, HEADERS, rows, figure(ctx, data, L), observed, agreement, data=data)


def _train(ctx: Context, name: str, overrides: list[str], L: int, steps: int) -> Path:
    ctx.step(f"1: train {name} at length {L}")
    sizes_ = [f"data.seq_len={L}", f"model.max_seq_len={8 * L}", f"trainer.max_steps={steps}"]
    return train_run(ctx, "ablation_positions", name, [*overrides, *sizes_]) / "checkpoints" / "last.ckpt"


def _evaluate(ckpts: dict[str, Path], blocks: dict[int, torch.Tensor], L: int) -> dict[str, Any]:
    """Perplexities (blocks and sliding window), loss by position and its rise past L, for each trained model
    and for the rope model under each scaling."""
    from tasks.cli.loading import load_task

    models = {name: load_task(ckpt)[0].model.eval() for name, ckpt in ckpts.items()}
    longest = max(blocks)
    stream = blocks[L].flatten()
    bin_size = max(1, L // 4)
    out: dict[str, Any] = {"ppl": {}, "sliding": {}, "by_position": {}, "rise": {}, "bin": bin_size}
    at_length = {name: (lambda n, m=model: m) for name, model in models.items()}  # name -> (length -> model)
    if "rope" in models:
        for s in SCALINGS:
            at_length[f"rope+{s}"] = lambda n, s=s: rope_scaled(models["rope"], s, n / L, L)
    for name, at in at_length.items():
        out["ppl"][name] = {str(n): perplexity(at(n), b) for n, b in blocks.items()}
        out["sliding"][name] = {str(n): sliding_perplexity(at(n), stream, n, L) for n in blocks}
        curve = loss_by_position(at(longest), blocks[longest], bin_size)
        out["by_position"][name] = curve
        per_bin = L // bin_size
        out["rise"][name] = mean(curve[per_bin:]) - mean(curve[per_bin // 2 : per_bin])
    return out


def _copy(ctx: Context, name: str, setup: induction.CopySetup) -> dict[str, Any]:
    """The copy task for one position encoding, each seed: training curve, accuracy at L, 2L and 4L."""
    ctx.step(f"1: copy task, {name}")
    position = VARIANTS[name][0].split("=")[1]
    lengths = [setup.length, 2 * setup.length, 4 * setup.length]
    seeds = COPY_SEEDS[:1] if ctx.quick else COPY_SEEDS
    runs = []
    for seed in seeds:
        model = induction.decoder(position, setup, max(lengths), seed)
        curve = induction.train_copy(model, setup, seed)
        rows = 16 if ctx.quick else 128
        accuracy = {str(n): induction.copy_accuracy(model, n, setup.length, rows=rows, seed=seed) for n in lengths}
        runs.append({"curve": curve, "accuracy": accuracy})
    lengths_ = runs[0]["accuracy"]
    return {
        "runs": runs,
        **{k: {n: mean(r["accuracy"][n][k] for r in runs) for n in lengths_} for k in ("inside", "past")},
    }


def _row(name: str, lm: dict[str, Any], copy: dict[str, Any] | None, L: int) -> list[Any]:
    ppl, sliding = lm["ppl"][name], lm["sliding"][name]

    def acc(key: str, n: int) -> str:
        if copy is None:
            return "-"
        value = copy[key][str(n)]
        return "-" if math.isnan(value) else f"{value:.2f}"

    copy_L = int(min(copy["inside"], key=int)) if copy else L
    return [
        name,
        f"{ppl[str(L)]:.1f}",
        f"{ppl[str(8 * L)]:.1f}",
        f"{sliding[str(8 * L)]:.1f}",
        f"{lm['rise'][name]:+.3f}",
        acc("inside", copy_L),
        acc("past", 4 * copy_L),
    ]


def verdict(rise: dict[str, float], copy_past: dict[str, float]) -> tuple[str, str]:
    """(agreement, what was seen) from each trained encoding's rise in loss past L (nats) and its copy accuracy
    past L. Each claim of the article is one comparison; all hold: agrees, none: does not, else partial."""
    absolute = [rise[k] for k in ABSOLUTE if k in rise]
    checks = {
        "ALiBi's loss does not rise past L": rise["alibi"] <= MARGIN,
        "absolute positions rise more than ALiBi": bool(absolute) and min(absolute) > rise["alibi"] + MARGIN,
        "RoPE rises more than ALiBi": rise["rope"] > rise["alibi"] + MARGIN,
        "T5 buckets rise less than absolute positions": "t5_relative" not in rise
        or (bool(absolute) and rise["t5_relative"] < min(absolute)),
        "ALiBi copies past L better than absolute positions": not any(k in copy_past for k in ABSOLUTE)
        or copy_past["alibi"] > max(copy_past[k] for k in ABSOLUTE if k in copy_past) + 0.1,
    }
    held = sum(checks.values())
    agreement = "agrees" if held == len(checks) else "does not" if held == 0 else "partial"
    seen = (
        "Rise in loss past L (nats): "
        + ", ".join(f"{k} {v:+.3f}" for k, v in sorted(rise.items(), key=lambda kv: kv[1]))
        + ". Copy accuracy past L on 4L rows: "
        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(copy_past.items(), key=lambda kv: -kv[1]))
        + ". "
        + " ".join(f"{claim}: {'yes' if ok else 'no'}." for claim, ok in checks.items())
    )
    return agreement, seen
