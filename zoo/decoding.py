"""How each form generates: next-token logits one step at a time, for ``generate`` (zoo.generation).

A form's class names its strategy (``ZooModel.decoding``): a decoder continues a left-padded prompt;
an encoder-decoder encodes a right-padded source once and decodes a target from its start token.
Shapes: B rows (prompts, times beams), T tokens so far, V vocabulary, S source length, D model width.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

if TYPE_CHECKING:
    from zoo.kv_cache import Cache
    from zoo.models import DecoderModel, EncoderDecoderModel


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


class DecoderSteps(Steps):
    """Next-token logits for a decoder-only model, one step at a time: the output is the left-padded
    prompt and its continuation.

    An unpadded batch passes neither mask nor positions, so the stack takes its fast paths (no mask
    tensor, positions from the cache length); only the last position goes through the LM head.
    """

    left_pad = True
    prompt = "prompt"
    holds = "the prompt"

    @classmethod
    def held(cls, width: int) -> int:
        return width

    def __init__(self, model: DecoderModel, ids: Tensor, mask: Tensor, use_cache: bool, max_new: int) -> None:
        self.model, self.use_cache = model, use_cache
        self.ids, self.mask = ids, mask
        self.padded = not bool(mask.all())
        self.prefix_len = ids.shape[1] if model.decoder.mask.needs_prefix_len else None  # the prompt
        self.cache: Cache | None = model.new_cache(ids.shape[1] + max_new) if use_cache else None

    def _logits(self, ids: Tensor, positions: Tensor | None) -> Tensor:
        hidden = self.model.features(ids, self.mask if self.padded else None, position_ids=positions,
                                     prefix_len=self.prefix_len, cache=self.cache)  # (B, T, D)
        return self.model.logits(hidden[:, -1])  # (B, V)

    def first(self) -> Tensor:
        positions = (self.mask.cumsum(-1) - 1).clamp(min=0) if self.padded else None  # (B, T) over real tokens
        return self._logits(self.ids, positions)

    def next(self, token: Tensor) -> Tensor:
        self.ids = torch.cat([self.ids, token[:, None]], dim=1)
        if self.padded:
            self.mask = torch.cat([self.mask, self.mask.new_ones(len(token), 1)], dim=1)
        if not self.use_cache:
            return self.first()
        positions = self.mask.sum(-1, keepdim=True) - 1 if self.padded else None  # (B, 1)
        return self._logits(token[:, None], positions)

    def history(self) -> tuple[Tensor, Tensor | None]:
        return self.ids, self.mask if self.padded else None  # the prompt and its continuation, no padding

    def reorder(self, index: Tensor) -> None:
        self.ids, self.mask = self.ids[index], self.mask[index]
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

    def __init__(self, model: EncoderDecoderModel, src: Tensor, src_mask: Tensor, use_cache: bool,
                 max_new: int) -> None:
        self.model, self.use_cache = model, use_cache
        self.src_mask = None if bool(src_mask.all()) else src_mask  # None: no padding to mask at any step
        self.memory = model.encode(src, self.src_mask)  # (B, S, D)
        start = model.config.decoder_start_token_id
        self.ids = torch.full((src.shape[0], 1), start, dtype=torch.long, device=src.device)
        self.cache: Cache | None = model.new_cache(max_new + 1) if use_cache else None

    def _logits(self, ids: Tensor) -> Tensor:
        hidden = self.model.decoder_features(ids, self.memory, self.src_mask, cache=self.cache)  # (B, T, D)
        return self.model.logits(hidden[:, -1])  # (B, V)

    def first(self) -> Tensor:
        return self._logits(self.ids)

    def next(self, token: Tensor) -> Tensor:
        self.ids = torch.cat([self.ids, token[:, None]], dim=1)
        return self._logits(token[:, None] if self.use_cache else self.ids)

    def history(self) -> tuple[Tensor, Tensor | None]:
        return self.ids[:, 1:], None  # the target after its start token (often the pad token)

    def reorder(self, index: Tensor) -> None:
        self.ids, self.memory = self.ids[index], self.memory[index]
        if self.src_mask is not None:
            self.src_mask = self.src_mask[index]
        if self.cache is not None:
            self.cache.reorder(index)
