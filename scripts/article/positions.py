"""Experiment 1: one decoder per position encoding, trained at length L, test perplexity at L..8L."""

from __future__ import annotations

import math
from pathlib import Path

import torch

import zoo

from .common import Context, Result, plain_log_x, pyplot, save_figure, train_run

NUMBER, NAME, TITLE = 1, "positions", "Length extrapolation of position encodings"
TRAINS = True
POSITIONS = ("sinusoidal", "learned", "rope", "alibi", "t5_relative")
SCALED_SINUSOIDAL = "sinusoidal x sqrt(d)"  # the same encoding with model.embed_scale=sqrt(d_model)
UNITS = len(POSITIONS) + 2  # the five, sinusoidal x sqrt(d), the evaluation
CLAIM = (
    "Absolute positions extrapolate badly past the training window; relative biases (T5) better; RoPE works "
    "inside the window but degrades outside it; ALiBi's linear distance penalty extrapolates well (article "
    "section 4, after Press et al. 2022)."
)
SETUP = (
    "`zoo-train experiment=ablation_positions model/position=<p>` for p in {positions}, and sinusoidal with "
    "`model.embed_scale=sqrt(d_model)` ({scaled!r}): gpt-tiny (2 layers, d_model 128, 4 heads), 200 steps on "
    "16 x {L}-token blocks of stdlib source; test perplexity on {tokens} test tokens cut into blocks of L, 2L, "
    "4L, 8L (every position of a block counts). rope+PI = the trained rope model with `rope_scaling=linear`, "
    "`rope_scaling_factor=n/L`, no fine-tuning."
)


@torch.no_grad()
def perplexity(model: zoo.ZooModel, blocks: torch.Tensor, batch_size: int = 8) -> float:
    """exp(mean next-token cross-entropy) over (N, T+1) token blocks, every position counted."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(blocks), batch_size):
        chunk = blocks[start : start + batch_size]
        logits = model(chunk[:, :-1])  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), chunk[:, 1:].flatten(), reduction="sum")
        total, count = total + float(loss), count + chunk[:, 1:].numel()
    return math.exp(total / count)


def eval_blocks(ckpt: Path, lengths: list[int], max_tokens: int | None = None) -> dict[int, torch.Tensor]:
    """cut_blocks of the test split of the checkpoint's own data module, rebuilt at the longest length."""
    from tasks.cli.loading import data_module, load_task

    task, info = load_task(ckpt)
    dm = data_module(info, task, seq_len=max(lengths))
    dm.setup("test")
    return cut_blocks(dm.datasets["test"].items, lengths, max_tokens)


def cut_blocks(longest: torch.Tensor, lengths: list[int], max_tokens: int | None) -> dict[int, torch.Tensor]:
    """Blocks of ``n + 1`` tokens for each n in ``lengths`` from the first ``max_tokens`` tokens (None: all) of the
    stream that ``longest``, an LM data module's blocks at the longest length, flatten to (as it would cut them)."""
    stream = longest.flatten()
    max_tokens = len(stream) if max_tokens is None else max_tokens
    if len(stream) < max_tokens:
        raise ValueError(f"the test split has {len(stream)} tokens, fewer than max_tokens={max_tokens}")
    return {n: stream[: max_tokens // (n + 1) * (n + 1)].view(-1, n + 1) for n in lengths}


def run(ctx: Context) -> Result:
    """Train one decoder per position encoding at length L, evaluate perplexity at L..8L."""
    L = 16 if ctx.quick else 64
    lengths = [L, 2 * L, 4 * L, 8 * L]
    ckpts = _train(ctx, L)
    ctx.step("1: evaluate at 1x-8x the training length")
    blocks = eval_blocks(ckpts["alibi"], lengths, 2048 if ctx.quick else None)  # None: the whole test split
    ppl = _perplexities(ckpts, blocks, L)
    ratio = {name: ppl[name][8 * L] / ppl[name][L] for name in ppl}
    rows = [[name, *(f"{ppl[name][n]:.1f}" for n in lengths), f"{ratio[name]:.2f}"] for name in ppl]
    setup = SETUP.format(positions=list(POSITIONS), scaled=SCALED_SINUSOIDAL, L=L, tokens=blocks[L].numel())
    return Result(
        NUMBER,
        TITLE,
        CLAIM,
        setup,
        ["position", *(f"ppl @ {n}" for n in lengths), "ppl 8L / L"],
        rows,
        _figure(ctx, ppl, lengths),
        _observed(ppl, ratio, L),
        _agreement(ratio),
        data={"lengths": lengths, "ppl": {k: {str(n): v for n, v in d.items()} for k, d in ppl.items()}},
    )


def _train(ctx: Context, L: int) -> dict[str, Path]:
    """The last checkpoint of one training run per position variant (two in quick mode)."""
    overrides = [f"data.seq_len={L}", f"model.max_seq_len={8 * L}"] if ctx.quick else []
    variants = {pos: [f"model/position={pos}"] for pos in (("rope", "alibi") if ctx.quick else POSITIONS)}
    if not ctx.quick:  # sinusoidal as Vaswani et al. use it: token embeddings times sqrt(d_model)
        scale = zoo.get_config("gpt-tiny").d_model ** 0.5
        variants[SCALED_SINUSOIDAL] = ["model/position=sinusoidal", f"model.embed_scale={scale}"]
    ckpts = {}
    for pos, choice in variants.items():
        ctx.step(f"1: train {pos} at length {L}")
        ckpts[pos] = train_run(ctx, "ablation_positions", pos, [*choice, *overrides]) / "checkpoints" / "last.ckpt"
    return ckpts


def _perplexities(ckpts: dict[str, Path], blocks: dict[int, torch.Tensor], L: int) -> dict[str, dict[int, float]]:
    """Perplexities, and rope+PI's: the rope model, positions divided by n / L (Chen et al. 2023), no fine-tuning."""
    from tasks.cli.loading import load_task

    models = {pos: load_task(ckpt)[0].model for pos, ckpt in ckpts.items()}
    ppl = {pos: {n: perplexity(model, b) for n, b in blocks.items()} for pos, model in models.items()}
    rope, ppl["rope+PI"] = models["rope"], {}
    for n, b in blocks.items():
        cfg = rope.config.replace(rope_scaling="linear" if n > L else "none", rope_scaling_factor=n / L)
        scaled = zoo.build_model(cfg)
        scaled.load_state_dict(rope.state_dict())
        ppl["rope+PI"][n] = perplexity(scaled, b)
    return ppl


def _figure(ctx: Context, ppl: dict[str, dict[int, float]], lengths: list[int]) -> str:
    fig, ax = pyplot().subplots(figsize=(7, 4.5))
    for name, values in ppl.items():
        ax.plot(lengths, [values[n] for n in lengths], "--o" if name == "rope+PI" else "-o", label=name)
    ax.axvline(lengths[0], color="grey", linewidth=0.8, linestyle=":")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="evaluation length (tokens)",
        ylabel="test perplexity (log)",
        title=f"Length extrapolation: trained at {lengths[0]} tokens",
    )
    plain_log_x(ax, lengths)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return save_figure(ctx.out / "1_positions.png", fig)


def _observed(ppl: dict[str, dict[int, float]], ratio: dict[str, float], L: int) -> str:
    good = sorted(ratio, key=ratio.get)
    text = (
        "Perplexity at 8L over perplexity at L: "
        + ", ".join(f"{n} {ratio[n]:.2f}" for n in good)
        + f". Best extrapolation: {good[0]}; worst: {good[-1]}. Learned positions were built with "
        f"max_seq_len={8 * L} (rows past {L} exist but are never trained), not reported as N/A. "
        "Position interpolation is applied without fine-tuning."
    )
    at_L = sorted(values[L] for name, values in ppl.items() if name != "rope+PI")
    median = at_L[len(at_L) // 2]
    if "sinusoidal" in ppl and ppl["sinusoidal"][L] > 2 * median:
        text += (
            f" Sinusoidal barely trained (perplexity {ppl['sinusoidal'][L]:.0f} at L against a median of "
            f"{median:.1f}): unit-amplitude sines added to token embeddings of std 0.02 swamp the content at "
            "the start; its ratio says little."
        )
    if SCALED_SINUSOIDAL in ppl:
        text += (
            f" With the token embeddings scaled by sqrt(d_model) (`model.embed_scale`, as Vaswani et al. do) "
            f"sinusoidal reaches perplexity {ppl[SCALED_SINUSOIDAL][L]:.1f} at L and "
            f"{ppl[SCALED_SINUSOIDAL][8 * L]:.1f} at 8L (ratio {ratio[SCALED_SINUSOIDAL]:.2f})."
        )
    if "learned" in ratio and ratio["learned"] < 1.1:
        text += (
            " Learned positions did not collapse past their trained rows: those rows keep their small random "
            "initialisation (std 0.02), so beyond L the model runs almost without position input, which a "
            "causal decoder tolerates (it can infer order from the mask)."
        )
    return text


def _agreement(ratio: dict[str, float]) -> str:
    trained = {k: v for k, v in ratio.items() if k != "rope+PI"}
    absolute = [trained[k] for k in ("learned", "sinusoidal", SCALED_SINUSOIDAL) if k in trained]
    claims = [
        trained["alibi"] <= 1.05 * min(trained.values()),  # ALiBi extrapolates best (within 5%)
        all(a > trained["alibi"] for a in absolute),  # absolute positions worse than ALiBi
        trained["rope"] > trained["alibi"],  # RoPE degrades outside the window
        "t5_relative" not in trained or trained["t5_relative"] < min(absolute),
    ]  # relative beats absolute
    return "yes" if all(claims) else "partial" if claims[1] else "no"
