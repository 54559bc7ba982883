"""The prompts ``generate`` (zoo.generation) reads: token-id sequences of different lengths padded
into one (B, T) batch with a mask, left-padded for a decoder, right-padded for an encoder's source.
A batch with no prompt, or a prompt with no token, is a PromptError."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

Prompts = Tensor | Sequence[Sequence[int]] | Sequence[Tensor]


class PromptError(ValueError):
    """Prompts the model cannot read: none, one without tokens, or one longer than its positions."""


def pad_sequences(
    seqs: Prompts, pad_id: int, *, left: bool, device: torch.device | None = None
) -> tuple[Tensor, Tensor]:
    """Lists of token ids -> (ids, mask), both (B, T_max); mask is 1 on tokens, 0 on padding."""
    if isinstance(seqs, Tensor):
        return seqs, torch.ones_like(seqs)
    rows = [torch.as_tensor(s, dtype=torch.long) for s in seqs]
    if not rows:
        raise PromptError("input_ids holds no prompts; pass at least one sequence of token ids")
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        span = slice(T - len(r), T) if left else slice(0, len(r))
        ids[i, span], mask[i, span] = r, 1
    return ids.to(device), mask.to(device)


def padded_prompts(
    input_ids: Prompts, attention_mask: Tensor | None, pad: int, left: bool, device: torch.device
) -> tuple[Tensor, Tensor]:
    """The prompts as (ids, mask), both (B, T), padded on the ``left`` or the right; a given
    ``attention_mask`` replaces the mask. A PromptError for none or one without tokens."""
    ids, mask = pad_sequences(input_ids, pad, left=left, device=device)
    if attention_mask is not None:
        mask = attention_mask.to(device)
    _check_prompts(mask)
    return ids, mask


def _check_prompts(mask: Tensor) -> None:
    """Every prompt has at least one token. mask: (B, T), 1 = token."""
    if mask.shape[0] == 0:
        raise PromptError("input_ids holds no prompts; pass at least one sequence of token ids")
    empty = (mask.sum(-1) == 0).nonzero()[:, 0].tolist()
    if empty:
        raise PromptError(
            f"prompt {empty[0]} of input_ids has no tokens ({len(empty)} empty in all); give "
            f"every prompt at least one token"
        )
