"""KV cache for autoregressive decoding.

Decoding token t without a cache recomputes keys and values for positions 1..t: O(t^2) over a
sequence. The cache keeps them: each step computes q, k, v for the new token only and attends over
the stored keys, O(t) per step. Its size is 2 x layers x kv_heads x head_dim x length x bytes.

Buffers are non-persistent (never in a state_dict) and allocated on the first write, with the
dtype and device of the keys; capacity doubles when a write would overflow.

A mask that lets a query see only the last few keys (``Mask.lookback``: a sliding window's
``window - 1``) bounds the cache: each write attends over the kept keys and the new ones, then
keeps only the last ``keep`` of them, so memory stays ``keep`` positions however long decoding
runs. Kept keys stay in position order, the newest last: the mask's last columns are theirs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class KVCache(nn.Module):
    """Keys and values of one attention layer: (B, KV, held, hd), the last ``held`` of ``length``
    positions written; ``keep`` (None: every position) bounds ``held``."""

    def __init__(self, capacity: int = 256, *, keep: int | None = None) -> None:
        super().__init__()
        self.capacity, self.keep = capacity, keep
        self.length = 0  # positions written so far: the position of the next one
        self.held = 0  # positions stored: the last ``held`` of them (= length without ``keep``)
        self.register_buffer("k", None, persistent=False)
        self.register_buffer("v", None, persistent=False)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new keys/values (B, KV, T, hd); return the keys/values to attend over: those held
        before and the new ones, (B, KV, held + T, hd), oldest first."""
        if self.keep is not None:
            return self._append_bounded(k, v)
        new_length = self.length + k.shape[2]
        if self.k is None or new_length > self.k.shape[2]:
            self._grow(k, max(new_length, 2 * (0 if self.k is None else self.k.shape[2]), self.capacity))
        self.k[:, :, self.length : new_length] = k
        self.v[:, :, self.length : new_length] = v
        self.length = self.held = new_length
        return self.k[:, :, :new_length], self.v[:, :, :new_length]

    def _append_bounded(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """``append`` that keeps only the last ``keep`` positions, in their own storage (a view of the
        joined tensor would keep a long prompt's keys alive)."""
        assert self.keep is not None
        self.length += k.shape[2]
        if self.held:
            k = torch.cat([self.k, k], dim=2)  # (B, KV, held + T, hd)
            v = torch.cat([self.v, v], dim=2)
        self.held = min(self.keep, k.shape[2])
        start = k.shape[2] - self.held
        self.k, self.v = k[:, :, start:].clone(), v[:, :, start:].clone()
        return k, v

    def set(self, k: Tensor, v: Tensor) -> None:
        """Hold keys/values that never change (cross-attention over the encoder output)."""
        self.k, self.v, self.length, self.held = k, v, k.shape[2], k.shape[2]

    def get(self) -> tuple[Tensor, Tensor]:
        return self.k[:, :, : self.held], self.v[:, :, : self.held]

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search keeps the caches of the surviving beams)."""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)

    def _grow(self, like: Tensor, capacity: int) -> None:
        B, KV, _, hd = like.shape
        k = like.new_empty(B, KV, capacity, hd)
        v = like.new_empty(B, KV, capacity, hd)
        if self.k is not None:
            k[:, :, : self.held] = self.k[:, :, : self.held]
            v[:, :, : self.held] = self.v[:, :, : self.held]
        self.k, self.v = k, v

    def nbytes(self) -> int:
        """Bytes of the keys and values held (not of spare capacity)."""
        return 0 if self.k is None else 2 * self.k[:, :, : self.held].numel() * self.k.element_size()


class Cache(nn.Module):
    """The caches of a whole model: one per self-attention layer, one per cross-attention layer.
    ``keep`` bounds the self-attention caches to the last ``keep`` positions (the decoder mask's
    ``lookback``); cross-attention always holds the whole encoder output."""

    def __init__(self, n_layers: int, *, cross: bool = False, capacity: int = 256, keep: int | None = None) -> None:
        super().__init__()
        self.self_attn = nn.ModuleList(KVCache(capacity, keep=keep) for _ in range(n_layers))
        self.cross_attn = nn.ModuleList(KVCache(capacity) for _ in range(n_layers)) if cross else None

    @property
    def length(self) -> int:
        """Number of positions already decoded (the offset of the next token)."""
        return self.self_attn[0].length

    def reorder(self, index: Tensor) -> None:
        for cache in self.modules():
            if isinstance(cache, KVCache):
                cache.reorder(index)

    def nbytes(self) -> int:
        return sum(c.nbytes() for c in self.modules() if isinstance(c, KVCache))

    @torch.no_grad()
    def extra_repr(self) -> str:
        return f"length={self.length}, held={self.self_attn[0].held}, bytes={self.nbytes()}"
