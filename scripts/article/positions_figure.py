"""Experiment 1's figure: loss at each position past the training length, perplexity against the
evaluation length (non-overlapping blocks and a sliding window), and the copy task's accuracy."""

from __future__ import annotations

from typing import Any

from .common import Context, plain_log_x, pyplot, save_figure


def figure(ctx: Context, data: dict[str, Any], L: int) -> str:
    fig, (by_pos, ppl, copy) = pyplot().subplots(1, 3, figsize=(17, 4.8))
    _by_position(by_pos, data, L)
    _perplexity(ppl, data, L)
    _copy(copy, data["copy"])
    fig.suptitle(f"Length extrapolation: decoders trained at L = {L} tokens (dotted line: L)")
    return save_figure(ctx.out / "1_positions.png", fig)


def _style(name: str) -> str:
    return "--" if "+" in name else "-"


def _by_position(ax: Any, data: dict[str, Any], L: int) -> None:
    bin_size = data["bin"]
    for name, curve in data["by_position"].items():
        ax.plot([(i + 0.5) * bin_size for i in range(len(curve))], curve, _style(name), label=name)
    ax.axvline(L, color="grey", linestyle=":")
    ax.set(
        xlabel="position in an 8L-token block",
        ylabel=f"test loss (nats, mean over {bin_size}-position bins)",
        title="Loss at each position",
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)


def _perplexity(ax: Any, data: dict[str, Any], L: int) -> None:
    lengths = data["lengths"]
    for name in data["ppl"]:
        (line,) = ax.plot(lengths, [data["ppl"][name][str(n)] for n in lengths], _style(name) + "o", label=name)
        ax.plot(lengths, [data["sliding"][name][str(n)] for n in lengths], ":", color=line.get_color())
    ax.axvline(L, color="grey", linestyle=":")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="evaluation length n (tokens)",
        ylabel="test perplexity (log)",
        title="Perplexity: blocks of n (markers), sliding window (dotted)",
    )
    plain_log_x(ax, lengths)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)


def _copy(ax: Any, copy: dict[str, Any]) -> None:
    names = list(copy)
    lengths = sorted({int(n) for c in copy.values() for n in c["inside"]})
    width = 0.8 / len(lengths)
    for j, n in enumerate(lengths):
        inside = [copy[name]["inside"][str(n)] for name in names]
        past = [copy[name]["past"][str(n)] for name in names]
        xs = [i + (j - (len(lengths) - 1) / 2) * width for i in range(len(names))]
        ax.bar(xs, inside, width * 0.45, label=f"rows of {n}: inside L", alpha=0.5, color=f"C{j}")
        ax.bar([x + width * 0.45 for x in xs], past, width * 0.45, label=f"rows of {n}: past L", color=f"C{j}")
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set(ylabel="greedy accuracy on the copied tokens", ylim=(0, 1.05), title="Copy task (mean of the seeds)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
