"""One place that turns a stack's rules (its mask, its position encoding) and one forward's facts (the
batch's padding and documents, a KV cache) into what an attention kernel reads, in the cheapest form
the kernel accepts: nothing, ``is_causal``, a boolean mask, a float bias with -inf where a key is not
seen, or FlexMods (flex_attention's score_mod and block mask). Pure functions of their arguments: the
stack asks them once per forward (``Stack.prepare``), and a test compares the dense and the flex
answers for every mask and position without building a model.

Notation: B batch, T new positions, P positions already in a cache, H heads.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from zoo.attention import AttentionInputs, FlexMods
from zoo.mask import Mask
from zoo.position import Position
from zoo.rules import MaskMod


def self_attention_inputs(
    mask: Mask,
    position: Position,
    q_pos: Tensor,
    past: int | Tensor = 0,
    keep: Tensor | None = None,
    prefix_len: int | Tensor | None = None,
    document_ids: Tensor | None = None,
    *,
    keys: int | None = None,
    flex: Callable[[bool], bool] = lambda dense: False,
    batch: int = 1,
) -> AttentionInputs:
    """The mask (and bias) of ``mask`` and ``position`` for queries at ``q_pos`` = P..P+T-1 over keys
    0..P+T-1. ``keep``: the (B, P+T) or (B, keys) keep-mask of a padded batch (:func:`keep_mask`), or
    None. ``document_ids`` (B, T) narrow it to each query's own document (``Mask.within_documents``).
    ``keys``: a static cache's capacity; its slots after a query are masked by the mask's causal part,
    so the mask is always built (and ``past`` may be a 0-d tensor). ``flex(dense)``: whether the
    kernels that read these inputs take FlexMods, given whether the rule needs a dense mask; then
    FlexMods are built (:func:`flex_inputs`)."""
    T = q_pos.shape[0]
    plain = keep is None and document_ids is None and keys is None
    dense = not (plain and not position.has_bias and (mask.kernel_causal or mask.bidirectional))
    if flex(dense):
        return flex_inputs(mask, position, q_pos, keep, prefix_len, document_ids, batch=batch)
    if plain and mask.kernel_causal and not position.has_bias:  # no mask tensor needed
        if T == 1:
            return AttentionInputs()  # one new query may see every key so far
        if past == 0:
            return AttentionInputs(is_causal=True)
    k_pos = torch.arange(past + T if keys is None else keys, device=q_pos.device)  # (P+T,) or (keys,)
    bias = position.bias(q_pos, k_pos)  # (H, T, P+T) or None
    allowed = mask.allowed(q_pos, k_pos, prefix_len)  # (T, P+T), (B, 1, T, P+T) or None
    if document_ids is not None:
        allowed = mask.within_documents(allowed, document_ids)  # (B, 1, T, T)
    if allowed is None:
        if bias is None and keep is None:
            return AttentionInputs()
        allowed = torch.ones(T, k_pos.shape[0], dtype=torch.bool, device=q_pos.device)
    if keep is not None:
        # a padded query keeps its own key, so no row is empty (its output is never used)
        allowed = (allowed & keep[:, None, None, :]) | (k_pos[None, :] == q_pos[:, None])
    if bias is None:
        return AttentionInputs(mask=allowed)
    return AttentionInputs(mask=bias.masked_fill(~allowed, float("-inf")))


def flex_inputs(
    mask: Mask,
    position: Position,
    q_pos: Tensor,
    keep: Tensor | None,
    prefix_len: int | Tensor | None,
    document_ids: Tensor | None,
    *,
    batch: int,
) -> AttentionInputs:
    """What :func:`self_attention_inputs` builds, as FlexMods for a full forward (no cache: queries and
    keys are positions 0..T-1, so q_idx and kv_idx are positions). The block mask is made here, once
    per forward, for every layer. On CUDA ``create_block_mask`` is compiled (torch's advice for long
    sequences: the mask_mod is evaluated block by block); on the CPU it runs eagerly."""
    from torch.nn.attention.flex_attention import create_block_mask

    T, device = q_pos.shape[0], q_pos.device
    mask_mod = mask.mask_mod(prefix_len)
    if document_ids is not None:
        mask_mod = mask.documents_mod(mask_mod, document_ids)
    if keep is not None:
        mask_mod = _with_padding(mask_mod, keep)
    block_mask = None
    if mask_mod is not None:
        per_row = (
            keep is not None or document_ids is not None or (isinstance(prefix_len, Tensor) and prefix_len.dim() == 1)
        )
        block_mask = create_block_mask(
            mask_mod, batch if per_row else None, None, T, T, device=device, _compile=device.type == "cuda"
        )
    return AttentionInputs(flex=FlexMods(position.score_mod(device), block_mask))


def memory_inputs(memory_mask: Tensor | None) -> AttentionInputs:
    """Cross-attention's inputs: every source position but the padded ones of ``memory_mask`` (B, S)."""
    keep = keep_mask(memory_mask)
    return AttentionInputs(mask=None if keep is None else keep[:, None, None, :])


def _with_padding(mask_mod: MaskMod | None, keep: Tensor) -> MaskMod:
    """``mask_mod`` and the (B, T) keep-mask, as the dense path combines them: a padded query keeps
    its own key, so no row is empty (its output is never used)."""

    def padded(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        seen = keep[b, kv_idx] if mask_mod is None else mask_mod(b, h, q_idx, kv_idx) & keep[b, kv_idx]
        return seen | (kv_idx == q_idx)

    return padded


def keep_mask(mask: Tensor | None) -> Tensor | None:
    """A (B, L) padding mask (1 = token) as a bool keep-mask, or None when none is given.

    It never reads the mask's values: a branch on them would make the host wait for the device at
    every forward (twice for an encoder-decoder). A caller whose batch pads nothing passes None and
    gets the kernels' unmasked paths: the collates decide it on the host, where the lengths are
    (``tasks.base.padding_mask``), and decoding once per call (``zoo.decoding``). An all-ones mask
    that is passed anyway is applied, with the same result."""
    return None if mask is None else mask.bool()
