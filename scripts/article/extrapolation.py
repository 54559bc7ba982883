"""Experiment 1's measurements of a trained language model past its training length: perplexity over
non-overlapping blocks, perplexity with a sliding window, and the loss at each position of long blocks."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

import zoo


@torch.no_grad()
def token_losses(model: zoo.ZooModel, blocks: torch.Tensor, batch_size: int = 8) -> torch.Tensor:
    """Next-token cross-entropy (nats) at every position of (N, T+1) token blocks: (N, T)."""
    model.eval()
    out = []
    for chunk in blocks.split(batch_size):
        logits = model(chunk[:, :-1]).float()  # (B, T, V)
        out.append(F.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none"))  # (B, T)
    return torch.cat(out)


def perplexity(model: zoo.ZooModel, blocks: torch.Tensor, batch_size: int = 8) -> float:
    """exp(mean next-token cross-entropy) over (N, T+1) token blocks, every position counted."""
    return math.exp(float(token_losses(model, blocks, batch_size).mean()))


def sliding_perplexity(model: zoo.ZooModel, stream: torch.Tensor, window: int, stride: int) -> float:
    """Press et al. 2022's sliding-window evaluation: windows of ``window`` tokens moved by ``stride``,
    each scoring only its last ``stride`` predictions (the first window scores all of its own), so every
    scored token but the first window's sees at least ``window - stride`` tokens of context."""
    windows = stream.unfold(0, window + 1, stride)  # (W, window + 1)
    losses = token_losses(model, windows)  # (W, window)
    scored = torch.cat([losses[0], losses[1:, window - stride :].flatten()])
    return math.exp(float(scored.mean()))


def loss_by_position(model: zoo.ZooModel, blocks: torch.Tensor, bin_size: int) -> list[float]:
    """Mean loss at each position of the blocks, averaged over bins of ``bin_size`` positions."""
    per_position = token_losses(model, blocks).mean(0)  # (T,)
    return per_position.view(-1, bin_size).mean(1).tolist()


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


def rope_scaled(model: zoo.ZooModel, scaling: str, factor: float, trained_length: int) -> zoo.ZooModel:
    """The trained RoPE model with a context-extension ``scaling`` (zoo's ``rope_scaling``) for ``factor``
    times its training length, the same weights, no fine-tuning; factor 1 gives the model back."""
    if factor <= 1:
        return model
    extra = {"rope_original_max_len": trained_length} if scaling == "yarn" else {}
    scaled = zoo.build_model(model.config.replace(rope_scaling=scaling, rope_scaling_factor=factor, **extra))
    scaled.load_state_dict(model.state_dict())
    return scaled.eval()
