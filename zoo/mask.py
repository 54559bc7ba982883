"""Self-attention masks (``mask``). A mask says which keys each query may attend to; padding
(``attention_mask``, 1 = token, 0 = padding) is combined with it by the stack.

- ``causal``: key position <= query position (GPT).
- ``bidirectional``: every key (BERT, the T5 encoder); only padding is masked.
- ``prefix``: bidirectional over the first ``prefix_len`` positions, causal after (Raffel et al.
  2020's prefix LM; UniLM).
- ``sliding_window``: only keys within ``window`` positions (local attention: Beltagy et al. 2020,
  Longformer; Jiang et al. 2023, Mistral 7B). A decoder's query i sees i - window < j <= i, an
  encoder's |i - j| < window. A KV cache then needs only the last ``window - 1`` positions
  (``Mask.lookback``), so memory stays bounded however long generation runs. ``window_pattern``
  interleaves windowed (L) and global (G) layers, repeated over the stack (Gemma 2: LG; Gemma 3:
  LLLLLG; Beltagy et al. 2020): a global layer attends as the mask without its window
  (``Mask.widened``) and its cache keeps every position.
- ``document``: causal within each document of a packed row, nothing across documents (block-diagonal
  causal), driven by ``document_ids`` (B, T) passed to the decoder's forward; positions restart at
  each document (``document_positions``), so a packed row's logits equal each document's run alone.
  Without ``document_ids`` (generation: a prompt is one document) it is ``causal``. With ``window``
  a query sees only the keys of its own document that are also within the window, so a packed
  row's logits equal each document's run alone with ``sliding_window``, and the KV cache keeps
  ``window - 1`` positions as that mask's does.

Each mask writes its rule once, as flex_attention's mask_mod (b, h, q_idx, kv_idx) -> bool: flex
computes it inside the kernel from positions (no (Tq, Tk) tensor), and the base class derives the
boolean (Tq, Tk) tensor that sdpa and math read (``allowed``) by evaluating the same function on
broadcast index grids (:func:`zoo.rules.index_grids`); ``documents_mod`` and ``within_documents`` likewise.
A mod is written with elementwise tensor ops (what flex_attention asks of it anyway), so it means
the same on one (q_idx, kv_idx) pair and on a grid. A subclass may still hand-write a dense fast
path, but only beside its own mod: a class whose dense rule and mod come from different classes
(one half written, the other inherited or derived) is refused when it is defined.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from zoo.config import ModelConfig
from zoo.registry import MASK, Component, ConfigError
from zoo.rules import MaskMod, dense_mask, refuse_half_rules
from zoo.stack_role import LONE, StackRole


class Mask(Component):
    """Class flags say what the mask is; forms and the stack ask them instead of comparing names."""

    causal: ClassVar[bool] = False  # no query sees a key after it (relative position buckets look one way)
    kernel_causal: ClassVar[bool] = False  # exactly the lower triangle: kernels' is_causal can do it
    bidirectional: ClassVar[bool] = False  # every query sees every key: nothing is left to predict
    needs_prefix_len: ClassVar[bool] = False  # forward (and generation) must pass prefix_len
    lookback: int | None = None  # keys before its own position a query may still see (None: all); caches keep that many
    window_pattern: str | None = None  # windowed (L) and global (G) layers, repeated; see ``widened``
    documents: ClassVar[bool] = False  # reads document_ids: a query sees keys of its own document only
    reads: ClassVar[frozenset[str]] = frozenset()  # the component settings it reads (zoo.registry.reads)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        refuse_half_rules(cls, (("allowed", "mask_mod"), ("within_documents", "documents_mod")), Mask)

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Raise ConfigError for settings this mask cannot work with (ModelConfig.validate calls it;
        a ``window`` that the mask does not read is refused there, as every unread setting is)."""

    @classmethod
    def from_config(cls, cfg: ModelConfig, *, role: StackRole = LONE) -> Mask:
        """The mask of a stack of ``cfg``'s model in ``role`` (the stack calls it once, when it is built)."""
        return cls()

    @classmethod
    def one_document(cls, cfg: ModelConfig) -> str:
        """The registered mask this one (``cfg.resolved_mask``) computes on rows that hold one document
        each, i.e. without ``document_ids``: itself, but for the document masks. An exporter to a
        library without document masks (transformers) matches this one."""
        return cfg.resolved_mask

    def widened(self) -> Mask | None:
        """This mask without its window, for the global layers of a ``window_pattern`` (None: it has no
        window to drop)."""
        return None

    def windowed_layers(self, n_layers: int) -> list[bool]:
        """Per layer of a stack of ``n_layers``, whether it attends through this mask's window: none, for
        a mask without one (a windowed mask says which: :meth:`SlidingWindow.windowed_layers`)."""
        return [False] * n_layers

    def mask_mod(self, prefix_len: int | Tensor | None = None) -> MaskMod | None:
        """The rule, as flex_attention's mask_mod: True where query q_idx may attend to key kv_idx, both
        absolute positions; b indexes ``prefix_len`` when it is a (B,) tensor. None: every key."""
        return None

    def allowed(self, q_pos: Tensor, k_pos: Tensor, prefix_len: int | Tensor | None = None) -> Tensor | None:
        """``mask_mod`` as the boolean (Tq, Tk) tensor, or (B, 1, Tq, Tk) for a (B,) ``prefix_len``,
        over queries at ``q_pos`` and keys at ``k_pos`` (with a KV cache: P..P+T-1 and 0..P+T-1).
        None: every key."""
        mod = self.mask_mod(prefix_len)
        if mod is None:
            return None
        rows = prefix_len.shape[0] if isinstance(prefix_len, Tensor) and prefix_len.dim() == 1 else None
        return dense_mask(mod, q_pos, k_pos, rows=rows)

    def documents_mod(self, mask_mod: MaskMod | None, document_ids: Tensor) -> MaskMod:
        """``mask_mod`` narrowed to keys of each query's own document (``document_ids``: (B, T), indexed
        by b and a position); only a mask with ``documents`` set reads ``document_ids``."""
        raise _across_documents(self)

    def within_documents(self, allowed: Tensor | None, document_ids: Tensor) -> Tensor:
        """``allowed`` (None, (T, T) or (B, 1, T, T)) narrowed as ``documents_mod`` narrows a mod: a
        (B, 1, T, T) tensor over the positions of a full forward."""
        positions = torch.arange(document_ids.shape[1], device=document_ids.device)
        same = dense_mask(self.documents_mod(None, document_ids), positions, positions, rows=document_ids.shape[0])
        return same if allowed is None else allowed & same


def _across_documents(mask: Mask) -> ValueError:
    return ValueError(
        f"document_ids were given, but mask {type(mask).__name__} would attend across documents; "
        "build the model with mask='document'"
    )


def _causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    return kv_idx <= q_idx


MASK.bind(Mask)


@MASK.register("bidirectional")
class Bidirectional(Mask):
    bidirectional = True


@MASK.register("causal")
class Causal(Mask):
    causal = True
    kernel_causal = True

    def mask_mod(self, prefix_len: int | Tensor | None = None) -> MaskMod:
        return _causal


@MASK.register("prefix")
class Prefix(Mask):
    # the prefix sees its own future, so relative position buckets must be bidirectional
    causal = False
    needs_prefix_len = True

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
    encoder. In a stack whose form's own mask is causal (``StackRole.causal``), ``from_config`` makes a
    :class:`CausalSlidingWindow`.
    Positions are indices in the (left-padded) sequence, so padding never shifts a real token's window."""

    reads = frozenset({"window", "window_pattern"})

    def __init__(self, window: int) -> None:
        self.window = window
        self.lookback = window - 1

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        if cfg.window is None:
            raise ConfigError(
                "mask='sliding_window' needs window, the positions a query sees (itself included), e.g. window=4096"
            )
        check_pattern(cfg)

    def widened(self) -> Mask:
        return Bidirectional()

    def windowed_layers(self, n_layers: int) -> list[bool]:
        """The L layers of ``window_pattern`` repeated over the stack (every layer without a pattern); the
        G layers attend as :meth:`widened`. The one reading of the pattern: the stack, the HF families
        and GGUF ask it (through :func:`windowed_layers`)."""
        pattern = self.window_pattern or "L"
        return [pattern[i % len(pattern)] == "L" for i in range(n_layers)]

    @classmethod
    def from_config(cls, cfg: ModelConfig, *, role: StackRole = LONE) -> SlidingWindow:
        assert cfg.window is not None  # check (called by ModelConfig.validate) guarantees it
        mask = (CausalSlidingWindow if role.causal else SlidingWindow)(cfg.window)
        mask.window_pattern = cfg.window_pattern
        return mask

    def mask_mod(self, prefix_len: int | Tensor | None = None) -> MaskMod:
        window = self.window

        def band(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return (q_idx - kv_idx).abs() < window

        return band


class CausalSlidingWindow(SlidingWindow):
    """A decoder's window: the query itself and the ``window - 1`` keys before it, i - window < j <= i."""

    causal = True

    def widened(self) -> Mask:
        return Causal()

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
    reads = frozenset({"window", "window_pattern"})  # any window or none (see :class:`DocumentWindow`)

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        if cfg.window_pattern is not None and cfg.window is None:
            raise ConfigError(
                f"window_pattern={cfg.window_pattern!r} interleaves windowed and global layers, but mask='document' "
                "has no window: set window=<positions> or drop window_pattern"
            )
        check_pattern(cfg)

    @classmethod
    def from_config(cls, cfg: ModelConfig, *, role: StackRole = LONE) -> Document | DocumentWindow:
        if cfg.window is None:
            return cls()
        mask = DocumentWindow(cfg.window)
        mask.window_pattern = cfg.window_pattern
        return mask

    @classmethod
    def one_document(cls, cfg: ModelConfig) -> str:
        return "causal" if cfg.window is None else "sliding_window"

    def documents_mod(self, mask_mod: MaskMod | None, document_ids: Tensor) -> MaskMod:
        return _same_document_mod(mask_mod, document_ids)


class DocumentWindow(CausalSlidingWindow):
    """:class:`Document` with a window: query i sees key j when i - window < j <= i and both lie in
    one document. Documents are contiguous, so inside one the window counts the document's own
    positions: each document computes what it computes alone with mask='sliding_window'. Without
    ``document_ids`` (one document: generation) it is :class:`CausalSlidingWindow`, and so is its
    bounded KV cache (``lookback = window - 1``)."""

    documents = True

    def widened(self) -> Mask:
        return Document()

    def documents_mod(self, mask_mod: MaskMod | None, document_ids: Tensor) -> MaskMod:
        return _same_document_mod(mask_mod, document_ids)


def check_pattern(cfg: ModelConfig) -> None:
    """``window_pattern``: letters L (windowed) and G (global), at least one L."""
    pattern = cfg.window_pattern
    if pattern is not None and (not pattern or set(pattern) - {"L", "G"} or "L" not in pattern):
        raise ConfigError(
            f"window_pattern={pattern!r} must be letters L (a windowed layer) and G (a global one), repeated over "
            "the layers, with at least one L, e.g. LG (Gemma 2) or LLLLLG; for no window use mask=causal"
        )


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


def windowed_layers(cfg: ModelConfig) -> list[bool]:
    """Per layer of ``cfg``'s model, whether it attends through its mask's window (``Mask.windowed_layers``)."""
    return MASK.get(cfg.resolved_mask, field="mask").from_config(cfg).windowed_layers(cfg.n_layers)
