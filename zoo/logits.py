"""Logits processors that read the sequence so far, for ``generate`` (zoo.generation): the repetition
penalty and the no-repeat n-gram ban. ``generate`` runs them on the raw logits before temperature,
top-k and top-p (and, in beam search, on each beam's log-probabilities), in the order HF transformers'
processors run.

A row's history is ``ids`` (B, T) where ``mask`` (B, T) is 1; padding (mask 0) is no part of it.
Shapes: B rows (prompts, times beams), T tokens so far, V vocabulary, n the n-gram size,
W = T - n + 1 windows of n consecutive tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def penalize_repetition(logits: Tensor, ids: Tensor, penalty: float, mask: Tensor | None = None) -> Tensor:
    """The CTRL repetition penalty (Keskar et al. 2019, https://arxiv.org/abs/1909.05858, section 4.1):
    for every token in the row's history, a positive logit is divided by ``penalty`` and a negative one
    multiplied by it, so ``penalty`` > 1 makes the token less likely. (B, V) -> (B, V)."""
    seen = _mark(ids, _real(ids, mask), logits.shape[-1])  # (B, V)
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalized, logits)


def ban_repeated_ngrams(logits: Tensor, ids: Tensor, size: int, mask: Tensor | None = None) -> Tensor:
    """-inf for every token that would make the row's last ``size`` - 1 tokens and itself an n-gram its
    history already holds (Paulus et al. 2017, https://arxiv.org/abs/1705.04304). An n-gram with
    padding inside is no n-gram. ``size`` 1 bans every token seen. (B, V) -> (B, V)."""
    length = ids.shape[1]
    if length < size:  # no whole n-gram yet
        return logits
    real = _real(ids, mask)
    windows = ids.unfold(1, size, 1)  # (B, W, n): windows[:, w] = ids[:, w : w + n]
    whole = real.unfold(1, size, 1).all(-1)  # (B, W): no padding inside the window
    tail = ids[:, length - size + 1 :]  # (B, n - 1): what the next token would complete
    tail_real = real[:, length - size + 1 :].all(-1, keepdim=True)  # (B, 1)
    repeats = (windows[..., :-1] == tail[:, None, :]).all(-1) & whole & tail_real  # (B, W)
    banned = _mark(windows[..., -1], repeats, logits.shape[-1])  # (B, V)
    return logits.masked_fill(banned, float("-inf"))


def _real(ids: Tensor, mask: Tensor | None) -> Tensor:
    """(B, T) bool: True on the tokens of the history, False on padding."""
    return torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()


def _mark(tokens: Tensor, keep: Tensor, V: int) -> Tensor:
    """(B, V) bool: True for each token id of ``tokens`` (B, N) where ``keep`` (B, N) is True.
    Dropped entries are written to a spare column V, which is cut off."""
    index = torch.where(keep, tokens, V)  # (B, N)
    hit = torch.zeros(tokens.shape[0], V + 1, dtype=torch.bool, device=tokens.device)
    return hit.scatter_(1, index, True)[:, :V]


@dataclass(frozen=True)
class RepeatControls:
    """The settings of ``generate`` that read each row's history. The defaults change nothing.

    Attributes:
        repetition_penalty: > 0; 1 is off (``penalize_repetition``).
        no_repeat_ngram_size: >= 0; 0 is off (``ban_repeated_ngrams``).
    """

    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0

    def __call__(self, logits: Tensor, ids: Tensor, mask: Tensor | None = None) -> Tensor:
        """Logits (B, V) processed for histories ``ids`` (B, T) with ``mask`` (B, T; None: no padding).
        The same tensor when both controls are off; else float32, as samplers and beam scores read it."""
        if self.repetition_penalty != 1.0:
            logits = penalize_repetition(logits.float(), ids, self.repetition_penalty, mask)
        if self.no_repeat_ngram_size > 0:
            logits = ban_repeated_ngrams(logits.float(), ids, self.no_repeat_ngram_size, mask)
        return logits
