"""KV cache for autoregressive decoding.

Decoding token t without a cache recomputes keys and values for positions 1..t: O(t^2) over a
sequence. The cache keeps them: each step computes q, k, v for the new token only and attends over
the stored keys, O(t) per step. Its size is 2 x layers x kv_heads x head_dim x length x bytes.

Buffers are non-persistent (never in a state_dict) and allocated on the first write, with the
dtype and device of the keys; capacity doubles when a write would overflow.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class KVCache(nn.Module):
    """Keys and values of one attention layer: (B, KV, length, hd)."""

    def __init__(self, capacity: int = 256) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self.register_buffer("k", None, persistent=False)
        self.register_buffer("v", None, persistent=False)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new keys/values (B, KV, T, hd); return all stored so far (B, KV, length, hd)."""
        new_length = self.length + k.shape[2]
        if self.k is None or new_length > self.k.shape[2]:
            self._grow(k, max(new_length, 2 * (0 if self.k is None else self.k.shape[2]), self.capacity))
        self.k[:, :, self.length : new_length] = k
        self.v[:, :, self.length : new_length] = v
        self.length = new_length
        return self.k[:, :, :new_length], self.v[:, :, :new_length]

    def set(self, k: Tensor, v: Tensor) -> None:
        """Hold keys/values that never change (cross-attention over the encoder output)."""
        self.k, self.v, self.length = k, v, k.shape[2]

    def get(self) -> tuple[Tensor, Tensor]:
        return self.k[:, :, : self.length], self.v[:, :, : self.length]

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
            k[:, :, : self.length] = self.k[:, :, : self.length]
            v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v = k, v

    def nbytes(self) -> int:
        return 0 if self.k is None else 2 * self.k[:, :, : self.length].numel() * self.k.element_size()


class Cache(nn.Module):
    """The caches of a whole model: one per self-attention layer, one per cross-attention layer."""

    def __init__(self, n_layers: int, *, cross: bool = False, capacity: int = 256) -> None:
        super().__init__()
        self.self_attn = nn.ModuleList(KVCache(capacity) for _ in range(n_layers))
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
        return f"length={self.length}, bytes={self.nbytes()}"
