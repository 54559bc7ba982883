"""How each form generates: next-token logits one step at a time, for ``generate`` (zoo.generation).

A form's class names its strategy (``ZooModel.decoding``): a decoder continues a left-padded prompt;
an encoder-decoder encodes a right-padded source once and decodes a target from its start token.
Shapes: B rows (prompts, times beams), T tokens so far, V vocabulary, S source length, D model width.

``caching`` chooses how keys and values are kept: None recomputes every step, "dynamic" grows a KV
cache, "static" allocates one of fixed capacity (zoo.kv_cache) and runs each single-token step
through ``torch.compile``. The static step reads the same shapes every time (the new token, the
cache's slots, a padding mask over all of them) and no Python number that changes, so it compiles
once per model, batch size and capacity; capacities are rounded up to a multiple of
``CAPACITY_STEP`` so that prompts of nearby lengths share a compiled step. The first step (the
prompt, of any length) runs eagerly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

if TYPE_CHECKING:
    from zoo.kv_cache import Cache
    from zoo.models import DecoderModel, EncoderDecoderModel, ZooModel

CAPACITY_STEP = 128  # static caches hold a multiple of this many positions (or the model's limit)


def static_capacity(model: ZooModel, positions: int) -> int:
    """The capacity of a static cache that must hold ``positions``: the next multiple of
    ``CAPACITY_STEP``, but no more than the model's positions can number."""
    rounded = -(-positions // CAPACITY_STEP) * CAPACITY_STEP
    limit = model.max_positions
    return rounded if limit is None else max(positions, min(rounded, limit))


@functools.cache
def compiled(step: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``step`` through ``torch.compile`` (one compiled function per step, shared by every call)."""
    return torch.compile(step, dynamic=False)


class Steps:
    """The decoding loop's view of a model: logits for the first step, then for each chosen token.
    ``ids`` (B, T) holds the output so far; ``reorder`` follows the beams that beam search keeps."""

    left_pad: ClassVar[bool]  # prompts of different lengths are padded on the left (else the right)
    prompt: ClassVar[str]  # what the input is called in messages ("prompt", "source")
    holds: ClassVar[str]  # what the output holds before the new tokens, in messages

    ids: Tensor

    @classmethod
    def held(cls, width: int) -> int:
        """How many tokens the output holds before the new ones, for inputs ``width`` tokens wide."""
        raise NotImplementedError

    def first(self) -> Tensor:
        """Next-token logits (B, V) after the input."""
        raise NotImplementedError

    def next(self, token: Tensor) -> Tensor:
        """Append ``token`` (B,) to ``ids``; next-token logits (B, V) after it."""
        raise NotImplementedError

    def reorder(self, index: Tensor) -> None:
        """Keep the rows ``index`` (B,) of everything held per row."""
        raise NotImplementedError

    def history(self) -> tuple[Tensor, Tensor | None]:
        """What the repeat controls (zoo.logits) read as each row's sequence so far: ids (B, T) and a
        mask (B, T), 1 = token, 0 = padding; None when nothing is padding."""
        raise NotImplementedError

    def output(self) -> Tensor:
        return self.ids


def _decoder_logits(
    model: DecoderModel,
    ids: Tensor,
    mask: Tensor | None,
    positions: Tensor | None,
    prefix_len: int | None,
    cache: Cache | None,
) -> Tensor:
    """Next-token logits (B, V) after ``ids`` (B, T); the decoder's step, compiled for a static cache."""
    hidden = model.features(ids, mask, position_ids=positions, prefix_len=prefix_len, cache=cache)  # (B, T, D)
    return model.logits(hidden[:, -1])


def _decoder_start(
    model: EncoderDecoderModel, ids: Tensor, memory: Tensor, src_mask: Tensor | None, cache: Cache | None
) -> Tensor:
    """Next-token logits (B, V) after the target ``ids`` (B, T); the decoder's step, compiled for a
    static cache (whose cross-attention already holds the encoder's keys and values)."""
    hidden = model.decoder_features(ids, memory, src_mask, cache=cache)  # (B, T, D)
    return model.logits(hidden[:, -1])


class DecoderSteps(Steps):
    """Next-token logits for a decoder-only model, one step at a time: the output is the left-padded
    prompt and its continuation.

    An unpadded batch passes neither mask nor positions, so the stack takes its fast paths (no mask
    tensor, positions from the cache length); only the last position goes through the LM head. With a
    static cache, a padded batch passes one mask over all the cache's slots (the slots after the
    prompt count as tokens: the causal mask hides each until it is written).
    """

    left_pad = True
    prompt = "prompt"
    holds = "the prompt"

    @classmethod
    def held(cls, width: int) -> int:
        return width

    def __init__(self, model: DecoderModel, ids: Tensor, mask: Tensor, caching: str | None, max_new: int) -> None:
        self.model, self.caching = model, caching
        self.ids, self.mask = ids, mask
        self.padded = not bool(mask.all())
        self.prefix_len = ids.shape[1] if model.decoder.mask.needs_prefix_len else None  # the prompt
        self.cache: Cache | None = None
        self.keys_mask = mask if self.padded else None  # (B, keys) padding over what the step attends to
        self.step = _decoder_logits
        if caching == "static":
            capacity = static_capacity(model, ids.shape[1] + max_new)
            self.cache = model.new_cache(capacity, static=True)
            if self.padded:
                self.keys_mask = torch.cat([mask, mask.new_ones(len(mask), capacity - ids.shape[1])], dim=1)
            self.step = compiled(_decoder_logits)
        elif caching == "dynamic":
            self.cache = model.new_cache(ids.shape[1] + max_new)

    def first(self) -> Tensor:
        positions = (self.mask.cumsum(-1) - 1).clamp(min=0) if self.padded else None  # (B, T) over real tokens
        return _decoder_logits(self.model, self.ids, self.keys_mask, positions, self.prefix_len, self.cache)

    def next(self, token: Tensor) -> Tensor:
        self.ids = torch.cat([self.ids, token[:, None]], dim=1)
        if self.padded:
            self.mask = torch.cat([self.mask, self.mask.new_ones(len(token), 1)], dim=1)
            if self.caching != "static":
                self.keys_mask = self.mask
        if self.caching is None:
            return self.first()
        positions = self.mask.sum(-1, keepdim=True) - 1 if self.padded else None  # (B, 1)
        return self.step(self.model, token[:, None], self.keys_mask, positions, self.prefix_len, self.cache)

    def history(self) -> tuple[Tensor, Tensor | None]:
        return self.ids, self.mask if self.padded else None  # the prompt and its continuation, no padding

    def reorder(self, index: Tensor) -> None:
        self.ids, self.mask = self.ids[index], self.mask[index]
        if self.keys_mask is not None:
            self.keys_mask = self.keys_mask[index]
        if self.cache is not None:
            self.cache.reorder(index)


class EncoderDecoderSteps(Steps):
    """Next-token logits for an encoder-decoder: encode the right-padded source once, then decode
    step by step; the output is the target, from ``decoder_start_token_id``."""

    left_pad = False
    prompt = "source"
    holds = "the start token"

    @classmethod
    def held(cls, width: int) -> int:
        return 1

    def __init__(
        self, model: EncoderDecoderModel, src: Tensor, src_mask: Tensor, caching: str | None, max_new: int
    ) -> None:
        self.model, self.caching = model, caching
        self.src_mask = None if bool(src_mask.all()) else src_mask  # None: no padding to mask at any step
        self.memory = model.encode(src, self.src_mask)  # (B, S, D)
        start = model.config.decoder_start_token_id
        self.ids = torch.full((src.shape[0], 1), start, dtype=torch.long, device=src.device)
        self.cache: Cache | None = None
        self.step = _decoder_start
        if caching == "static":
            self.cache = model.new_cache(static_capacity(model, max_new + 1), static=True)
            self.step = compiled(_decoder_start)
        elif caching == "dynamic":
            self.cache = model.new_cache(max_new + 1)

    def first(self) -> Tensor:
        return _decoder_start(self.model, self.ids, self.memory, self.src_mask, self.cache)

    def next(self, token: Tensor) -> Tensor:
        self.ids = torch.cat([self.ids, token[:, None]], dim=1)
        if self.caching is None:
            return _decoder_start(self.model, self.ids, self.memory, self.src_mask, None)
        return self.step(self.model, token[:, None], self.memory, self.src_mask, self.cache)

    def history(self) -> tuple[Tensor, Tensor | None]:
        return self.ids[:, 1:], None  # the target after its start token (often the pad token)

    def reorder(self, index: Tensor) -> None:
        self.ids, self.memory = self.ids[index], self.memory[index]
        if self.src_mask is not None:
            self.src_mask = self.src_mask[index]
        if self.cache is not None:
            self.cache.reorder(index)
