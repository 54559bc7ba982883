"""Self-attention masks (``mask``). A mask says which keys each query may attend to; padding
(``attention_mask``, 1 = token, 0 = padding) is combined with it by the stack.

- ``causal``: key position <= query position (GPT).
- ``bidirectional``: every key (BERT, the T5 encoder); only padding is masked.
- ``prefix``: bidirectional over the first ``prefix_len`` positions, causal after (Raffel et al.
  2020's prefix LM; UniLM).
- ``sliding_window``: only keys within ``window`` positions (local attention: Beltagy et al. 2020,
  Longformer; Jiang et al. 2023, Mistral 7B). A decoder's query i sees i - window < j <= i, an
  encoder's |i - j| < window. A KV cache then needs only the last ``window - 1`` positions
  (``Mask.lookback``), so memory stays bounded however long generation runs.
- ``document``: causal within each document of a packed row, nothing across documents (block-diagonal
  causal), driven by ``document_ids`` (B, T) passed to the decoder's forward; positions restart at
  each document (``document_positions``), so a packed row's logits equal each document's run alone.
  Without ``document_ids`` (generation: a prompt is one document) it is ``causal``. With ``window``
  a query sees only the keys of its own document that are also within the window, so a packed
  row's logits equal each document's run alone with ``sliding_window``, and the KV cache keeps
  ``window - 1`` positions as that mask's does.

Each mask says which keys a query sees twice: ``allowed`` builds the boolean (Tq, Tk) tensor that
sdpa and math read, and ``mask_mod`` the same rule as flex_attention's mask_mod
(b, h, q_idx, kv_idx) -> bool, computed inside the kernel from positions (no (Tq, Tk) tensor).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor

from zoo.config import ModelConfig
from zoo.registry import MASK, ConfigError

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]  # (b, h, q_idx, kv_idx) -> bool, True = attend


class Mask:
    """Class flags say what the mask is; forms and the stack ask them instead of comparing names."""

    causal: ClassVar[bool] = False  # no query sees a key after it (relative position buckets look one way)
    kernel_causal: ClassVar[bool] = False  # exactly the lower triangle: kernels' is_causal can do it
    bidirectional: ClassVar[bool] = False  # every query sees every key: nothing is left to predict
    needs_prefix_len: ClassVar[bool] = False  # forward (and generation) must pass prefix_len
    lookback: int | None = None  # keys before its own position a query may still see (None: all); caches keep that many
    documents: ClassVar[bool] = False  # reads document_ids: a query sees keys of its own document only

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Raise ConfigError for settings this mask cannot work with (ModelConfig.validate calls it)."""
        if cfg.window is not None:
            raise ConfigError(f"window={cfg.window} is read by mask='sliding_window' or 'document' only; set one of "
                              f"those or leave window unset (mask={cfg.resolved_mask!r} ignores it)")

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> Mask:
        """The mask of a stack of ``cfg``'s model (the stack calls it once, when it is built)."""
        return cls()

    @classmethod
    def one_document(cls, cfg: ModelConfig) -> str:
        """The registered mask this one (``cfg.resolved_mask``) computes on rows that hold one document
        each, i.e. without ``document_ids``: itself, but for the document masks. An exporter to a
        library without document masks (transformers) matches this one."""
        return cfg.resolved_mask

    def allowed(self, q_pos: Tensor, k_pos: Tensor, prefix_len: int | Tensor | None = None) -> Tensor | None:
        """A boolean (Tq, Tk) or (B, 1, Tq, Tk) tensor, True where attention is allowed; None: all."""
        return None

    def mask_mod(self, prefix_len: int | Tensor | None = None) -> MaskMod | None:
        """``allowed`` as flex_attention's mask_mod: q_idx and kv_idx are absolute positions (a full
        forward: no KV cache), b indexes ``prefix_len`` when it is a (B,) tensor. None: all."""
        return None

    def within_documents(self, allowed: Tensor | None, document_ids: Tensor) -> Tensor:
        """``allowed`` (None, (T, T) or (B, 1, T, T)) narrowed to keys of each query's own document;
        only a mask with ``documents`` set reads ``document_ids``."""
        raise _across_documents(self)

    def documents_mod(self, mask_mod: MaskMod | None, document_ids: Tensor) -> MaskMod:
        """``within_documents`` for a ``mask_mod``: it also asks that both positions lie in one document."""
        raise _across_documents(self)


def _across_documents(mask: Mask) -> ValueError:
    return ValueError(f"document_ids were given, but mask {type(mask).__name__} would attend across documents; "
                      "build the model with mask='document'")


def _causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    return kv_idx <= q_idx


@MASK.register("bidirectional")
class Bidirectional(Mask):
    bidirectional = True


@MASK.register("causal")
class Causal(Mask):
    causal = True
    kernel_causal = True

    def allowed(self, q_pos: Tensor, k_pos: Tensor, prefix_len: int | Tensor | None = None) -> Tensor:
        return k_pos[None, :] <= q_pos[:, None]  # (Tq, Tk)

    def mask_mod(self, prefix_len: int | Tensor | None = None) -> MaskMod:
        return _causal


@MASK.register("prefix")
class Prefix(Mask):
    # the prefix sees its own future, so relative position buckets must be bidirectional
    causal = False
    needs_prefix_len = True

    def allowed(self, q_pos: Tensor, k_pos: Tensor, prefix_len: int | Tensor | None = None) -> Tensor:
        if prefix_len is None:
            raise ValueError("mask='prefix' needs prefix_len (an int, or a (B,) tensor) in forward")
        causal = k_pos[None, :] <= q_pos[:, None]  # (Tq, Tk)
        if isinstance(prefix_len, Tensor) and prefix_len.dim() == 1:
            in_prefix = k_pos[None, :] < prefix_len[:, None]  # (B, Tk)
            return causal[None, None] | in_prefix[:, None, None, :]  # (B, 1, Tq, Tk)
        return causal | (k_pos < prefix_len)[None, :]

    def mask_mod(self, prefix_len: int | Tensor | None = None) -> MaskMod:
        if prefix_len is None:
            raise ValueError("mask='prefix' needs prefix_len (an int, or a (B,) tensor) in forward")
        if isinstance(prefix_len, Tensor) and prefix_len.dim() == 1:
            per_row = prefix_len

            def prefix_rows(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
                return (kv_idx <= q_idx) | (kv_idx < per_row[b])

            return prefix_rows
        shared = prefix_len

        def prefix(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return (kv_idx <= q_idx) | (kv_idx < shared)

        return prefix


@MASK.register("sliding_window")
class SlidingWindow(Mask):
    """Each query sees the keys less than ``window`` positions away: |i - j| < window, the band of an
    encoder. In a form whose own mask is causal, ``from_config`` makes a :class:`CausalSlidingWindow`.
    Positions are indices in the (left-padded) sequence, so padding never shifts a real token's window."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.lookback = window - 1

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        if cfg.window is None:
            raise ConfigError("mask='sliding_window' needs window, the positions a query sees (itself included), "
                              "e.g. window=4096")

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> SlidingWindow:
        assert cfg.window is not None  # check (called by ModelConfig.validate) guarantees it
        causal = MASK.get(cfg.form.natural_mask, field="mask").causal
        return (CausalSlidingWindow if causal else SlidingWindow)(cfg.window)

    def allowed(self, q_pos: Tensor, k_pos: Tensor, prefix_len: int | Tensor | None = None) -> Tensor:
        return (q_pos[:, None] - k_pos[None, :]).abs() < self.window  # (Tq, Tk)

    def mask_mod(self, prefix_len: int | Tensor | None = None) -> MaskMod:
        window = self.window

        def band(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return (q_idx - kv_idx).abs() < window

        return band


class CausalSlidingWindow(SlidingWindow):
    """A decoder's window: the query itself and the ``window - 1`` keys before it, i - window < j <= i."""

    causal = True

    def allowed(self, q_pos: Tensor, k_pos: Tensor, prefix_len: int | Tensor | None = None) -> Tensor:
        behind = q_pos[:, None] - k_pos[None, :]  # (Tq, Tk): how far each key lies before its query
        return (behind >= 0) & (behind < self.window)

    def mask_mod(self, prefix_len: int | Tensor | None = None) -> MaskMod:
        window = self.window

        def causal_band(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            behind = q_idx - kv_idx
            return (behind >= 0) & (behind < window)

        return causal_band


@MASK.register("document")
class Document(Causal):
    """Causal attention inside each document of a packed row and none across documents: query i
    sees key j when j <= i and both lie in one document (Krell et al. 2021, packing without
    cross-contamination). Without ``document_ids`` it is :class:`Causal`; with ``window``,
    ``from_config`` makes a :class:`DocumentWindow`."""

    documents = True

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Any window or none: the mask reads it (see :class:`DocumentWindow`)."""

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> Document | DocumentWindow:
        return cls() if cfg.window is None else DocumentWindow(cfg.window)

    @classmethod
    def one_document(cls, cfg: ModelConfig) -> str:
        return "causal" if cfg.window is None else "sliding_window"

    def within_documents(self, allowed: Tensor | None, document_ids: Tensor) -> Tensor:
        return _same_document(allowed, document_ids)

    def documents_mod(self, mask_mod: MaskMod | None, document_ids: Tensor) -> MaskMod:
        return _same_document_mod(mask_mod, document_ids)


class DocumentWindow(CausalSlidingWindow):
    """:class:`Document` with a window: query i sees key j when i - window < j <= i and both lie in
    one document. Documents are contiguous, so inside one the window counts the document's own
    positions: each document computes what it computes alone with mask='sliding_window'. Without
    ``document_ids`` (one document: generation) it is :class:`CausalSlidingWindow`, and so is its
    bounded KV cache (``lookback = window - 1``)."""

    documents = True

    def within_documents(self, allowed: Tensor | None, document_ids: Tensor) -> Tensor:
        return _same_document(allowed, document_ids)

    def documents_mod(self, mask_mod: MaskMod | None, document_ids: Tensor) -> MaskMod:
        return _same_document_mod(mask_mod, document_ids)


def _same_document(allowed: Tensor | None, document_ids: Tensor) -> Tensor:
    """``allowed`` (None, (T, T) or (B, 1, T, T)) narrowed to the keys of each query's own document."""
    same = document_ids[:, :, None] == document_ids[:, None, :]  # (B, T, T)
    return same[:, None] if allowed is None else allowed & same[:, None]  # (B, 1, T, T)


def _same_document_mod(mask_mod: MaskMod | None, document_ids: Tensor) -> MaskMod:
    """``mask_mod`` narrowed to keys of each query's own document (``document_ids``: (B, T))."""

    def same_document(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        same = document_ids[b, q_idx] == document_ids[b, kv_idx]
        return same if mask_mod is None else same & mask_mod(b, h, q_idx, kv_idx)

    return same_document


def document_positions(document_ids: Tensor) -> Tensor:
    """(B, T) document ids (non-decreasing along a row) -> (B, T) offsets within each document, so
    that every document's positions start at 0 as if it were run alone."""
    T = document_ids.shape[1]
    index = torch.arange(T, device=document_ids.device).expand_as(document_ids)  # (B, T)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]  # True at a document's first position
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values  # (B, T)
    return index - first
