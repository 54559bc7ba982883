"""The output-layer loss in chunks of rows, so that a training step never holds the whole (N, V) logits.

A language model's last matrix multiply makes logits over the whole vocabulary for every token, and
cross-entropy's backward keeps three tensors of that size alive at once (the logits, their softmax, the
gradient): at GPT-2's vocabulary and 2,048 tokens, 3 x 393 MiB in fp32, more than a 12-layer d-512 stack
keeps with activation checkpointing. ``chunked_cross_entropy`` computes the loss of ``chunk`` rows at a time,
each chunk under non-reentrant activation checkpointing: its forward keeps only the chunk's hidden states
(a view) and its labels, and its backward recomputes that chunk's logits, so only one chunk's (C, V)
tensors live at a time. The cost is one more multiply by the output matrix (the recompute).
The same idea as the "cut cross-entropy" / "fused linear cross-entropy" kernels (Wijmans et al. 2024,
https://arxiv.org/abs/2411.09009), here in plain PyTorch for any ``head``.

Shapes: N rows (tokens, B * T flattened), D model width, V vocabulary, C rows per chunk.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def chunked_cross_entropy(
    hidden: Tensor,
    head: Callable[[Tensor], Tensor],
    labels: Tensor,
    *,
    chunk: int,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> Tensor:
    """``F.cross_entropy(head(hidden).float(), labels, ignore_index=..., label_smoothing=...)`` (mean over
    the labels that are not ``ignore_index``), with the logits made ``chunk`` rows at a time.

    Args:
        hidden: (..., D) final hidden states, e.g. (B, T, D).
        head: (C, D) -> (C, V) logits, e.g. a zoo model's ``logits`` (tied embeddings, ``logit_scale`` and
            all); it may return bf16 logits (under autocast), which are taken to fp32 a chunk at a time.
        labels: (...) target ids, the leading shape of ``hidden``; ``ignore_index`` rows count nowhere.
        chunk: rows per chunk (C); the last chunk may be shorter.

    Returns the scalar mean loss in fp32, equal to the whole-logits loss in value and gradients up to fp32
    rounding (the sum runs in another order). NaN when every label is ignored, as for ``F.cross_entropy``.
    Without gradients (validation) the chunks run plainly, one after another.
    """
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be >= 1 (rows per chunk)")
    hidden = hidden.reshape(-1, hidden.shape[-1])  # (N, D)
    labels = labels.reshape(-1)  # (N,)
    if hidden.shape[0] != labels.shape[0]:
        raise ValueError(f"hidden has {hidden.shape[0]} rows but labels has {labels.shape[0]}")

    def chunk_loss(h: Tensor, y: Tensor) -> Tensor:  # (C, D), (C,) -> summed loss of the chunk
        return F.cross_entropy(
            head(h).float(), y, ignore_index=ignore_index, reduction="sum", label_smoothing=label_smoothing
        )

    keep_graph = torch.is_grad_enabled()
    total = hidden.new_zeros((), dtype=torch.float32)
    for h, y in zip(hidden.split(chunk), labels.split(chunk), strict=True):  # (C, D), (C,)
        total = total + (checkpoint(chunk_loss, h, y, use_reentrant=False) if keep_graph else chunk_loss(h, y))
    return total / (labels != ignore_index).sum()
