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

A static cache (``Cache(..., static=True)``, what ``generate(compile=True)`` uses) allocates every
position up front and counts them in a tensor, so each decoding step has the same shapes and reads
no Python number that changes: a compiled step runs again without recompiling. Every write, and every
reorder of rows (any cache's, for beam search), is in place, so a CUDA graph of that step, which reads
fixed addresses, replays it (zoo.decoding.StaticStep). Its attention reads
all ``capacity`` key slots; the mask hides those after the query (the causal part of every decoder
mask), so the slots not yet written never count. It holds every position, windowed masks included.

``kv_dtype="int8"`` stores keys and values as int8 with one float32 scale per row, head and
position (symmetric absmax: x ~ q * max|x| / 127 over the head's ``hd`` values), about half the bytes
of bf16 (``hd`` + 4 bytes instead of 2 * ``hd``) and a quarter of fp32. Every read dequantises to the
keys' own dtype for the attention step. Each position is quantised alone, so decoding with the cache
equals recomputing the whole sequence through a fresh int8 cache: the error is the rounding, not the
caching.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.registry import Registry

KV_FORMATS: Registry[type[KVFormat]] = Registry("KV-cache format")  # ``kv_dtype`` names one; None: Native


class KVFormat:
    """How a cache stores keys and values: ``pack`` on each write, ``unpack`` on each read, ``value_bytes``
    for the sizes zoo.stats and generate's memory check report. A registered name is a ``kv_dtype``
    (``zoo.quantize(model, kv_cache=...)``, ``zoo-generate kv_cache=...``, ``zoo-info --kv-dtype``)."""

    @staticmethod
    def pack(x: Tensor) -> tuple[Tensor, Tensor | None]:
        """(..., hd) keys or values -> what is stored: the values and their scales (..., 1), or None."""
        return x, None

    @staticmethod
    def unpack(x: Tensor, scale: Tensor | None, dtype: torch.dtype) -> Tensor:
        """What ``pack`` stored -> (..., hd) in ``dtype``, the keys' own dtype."""
        return x

    @staticmethod
    def value_bytes(head_dim: int, element_size: int) -> float:
        """Bytes one key (or value) of one head and position takes, for keys of ``element_size`` bytes."""
        return head_dim * element_size

    @classmethod
    def round_trip(cls, x: Tensor) -> Tensor:
        """``x`` as a cache of this format gives it back: what attention without a cache reads, so that
        a forward computes what cached decoding does (``ZooModel.kv_dtype``)."""
        return cls.unpack(*cls.pack(x), x.dtype)


class Native(KVFormat):
    """Keys and values in their own dtype (``kv_dtype=None``): nothing packed, nothing rounded."""

    @classmethod
    def round_trip(cls, x: Tensor) -> Tensor:
        return x


@KV_FORMATS.register("int8")
class Int8(KVFormat):
    """int8 values with one float32 scale per row, head and position: symmetric absmax over the head's
    ``hd`` values (x ~ q * max|x| / 127), ``hd`` + 4 bytes instead of 2 * ``hd`` (bf16) or 4 * ``hd``."""

    @staticmethod
    def pack(x: Tensor) -> tuple[Tensor, Tensor | None]:
        return quantize_int8(x)

    @staticmethod
    def unpack(x: Tensor, scale: Tensor | None, dtype: torch.dtype) -> Tensor:
        return (x.float() * scale).to(dtype)

    @staticmethod
    def value_bytes(head_dim: int, element_size: int) -> float:
        return head_dim + 4


def kv_format(kv_dtype: str | None, *, field: str = "kv_dtype") -> type[KVFormat]:
    """The format a ``kv_dtype`` names (None: :class:`Native`); a ConfigError naming ``field`` and the
    registered formats for a name that is none of them."""
    return Native if kv_dtype is None else KV_FORMATS.get(kv_dtype, field=field)


def check_kv_dtype(kv_dtype: str | None, *, field: str = "kv_dtype") -> None:
    kv_format(kv_dtype, field=field)


def value_bytes(kv_dtype: str | None, head_dim: int, element_size: int) -> float:
    """Bytes one key (or value) of one head and position takes in a ``kv_dtype`` cache."""
    return kv_format(kv_dtype).value_bytes(head_dim, element_size)


def quantize_int8(x: Tensor) -> tuple[Tensor, Tensor]:
    """(..., hd) -> int8 values (..., hd) and float32 scales (..., 1), x ~ q * scale, |q| <= 127."""
    scale = (x.detach().abs().amax(-1, keepdim=True).float() / 127).clamp(min=torch.finfo(torch.float32).tiny)
    return (x.float() / scale).round().clamp(-127, 127).to(torch.int8), scale


def round_trip(x: Tensor, kv_dtype: str | None) -> Tensor:
    """``x`` (..., hd) as a ``kv_dtype`` cache would give it back (:meth:`KVFormat.round_trip`)."""
    return kv_format(kv_dtype).round_trip(x)


class _Stored(nn.Module):
    """Keys and values kept as ``kv_dtype``: ``k``, ``v`` and, for int8, their scales ``k_scale``,
    ``v_scale`` (B, KV, L, 1). ``dtype`` is what reads give back: the dtype of the first keys written."""

    def __init__(self, kv_dtype: str | None) -> None:
        super().__init__()
        self.format = kv_format(kv_dtype)
        self.kv_dtype, self.dtype = kv_dtype, None
        for name in ("k", "v", "k_scale", "v_scale"):
            self.register_buffer(name, None, persistent=False)

    def _pack(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        if self.dtype is None:  # (an nn.Module attribute write is slow: once per cache, not per step)
            self.dtype = x.dtype
        return self.format.pack(x)

    def _unpack(self, x: Tensor, scale: Tensor | None) -> Tensor:
        return self.format.unpack(x, scale, self.dtype)

    def get(self) -> tuple[Tensor, Tensor]:
        """The keys and values held, (B, KV, held, hd), in the dtype they were written in."""
        n = self.held
        k_scale = None if self.k_scale is None else self.k_scale[:, :, :n]
        v_scale = None if self.v_scale is None else self.v_scale[:, :, :n]
        return self._unpack(self.k[:, :, :n], k_scale), self._unpack(self.v[:, :, :n], v_scale)

    def _stored(self) -> list[Tensor]:
        return [t for t in (self.k, self.v, self.k_scale, self.v_scale) if t is not None]

    def nbytes(self) -> int:
        """Bytes of the keys and values held, scales included (not of spare capacity)."""
        return sum(t[:, :, : self.held].numel() * t.element_size() for t in self._stored())

    def reorder(self, index: Tensor) -> None:
        """Select batch rows ``index`` (B,) in place (beam search keeps the caches of the surviving beams):
        a compiled step, or a CUDA graph replaying it, holds these very tensors."""
        for stored in self._stored():
            stored.copy_(stored.index_select(0, index))


class KVCache(_Stored):
    """Keys and values of one attention layer: (B, KV, held, hd), the last ``held`` of ``length``
    positions written; ``keep`` (None: every position) bounds ``held``; ``kv_dtype`` how they are stored."""

    static = False  # shapes grow with each write; ``offset`` is a Python int

    def __init__(self, capacity: int = 256, *, keep: int | None = None, kv_dtype: str | None = None) -> None:
        super().__init__(kv_dtype)
        self.capacity, self.keep = capacity, keep
        self.length = 0  # positions written so far: the position of the next one

    @property
    def offset(self) -> int:
        """The position of the next key written."""
        return self.length

    @property
    def held(self) -> int:
        """Positions stored: the last ``held`` of ``length`` (all of them without ``keep``)."""
        return self.length if self.keep is None or self.length < self.keep else self.keep

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new keys/values (B, KV, T, hd); return the keys/values to attend over: those held
        before and the new ones, (B, KV, held + T, hd), oldest first."""
        (k, k_scale), (v, v_scale) = self._pack(k), self._pack(v)
        if self.keep is not None:
            return self._append_bounded(k, v, k_scale, v_scale)
        start, stored = self.length, self._stored()  # (buffers read once: each read is an nn.Module lookup)
        end = start + k.shape[2]
        if not stored or end > stored[0].shape[2]:
            self._grow(max(end, 2 * (stored[0].shape[2] if stored else 0), self.capacity), k, k_scale)
            stored = self._stored()
        for buffer, new in zip(stored, (k, v, k_scale, v_scale), strict=False):
            buffer[:, :, start:end] = new
        self.length = end
        held = [t[:, :, :end] for t in stored]  # k, v (, k_scale, v_scale)
        k_scale, v_scale = held[2:] or (None, None)
        return self._unpack(held[0], k_scale), self._unpack(held[1], v_scale)

    def _append_bounded(self, *new: Tensor | None) -> tuple[Tensor, Tensor]:
        """``append`` that keeps only the last ``keep`` positions, in their own storage (a view of the
        joined tensors would keep a long prompt's keys alive)."""
        assert self.keep is not None
        self.length += new[0].shape[2]
        joined = [t for t in new if t is not None]  # k, v (, k_scale, v_scale)
        if self.k is not None:
            joined = [torch.cat([old, t], dim=2) for old, t in zip(self._stored(), joined, strict=True)]
        start = joined[0].shape[2] - self.held  # the last min(keep, length) positions stay
        kept = [t[:, :, start:].clone() for t in joined]
        self.k, self.v, *scales = kept
        if scales:
            self.k_scale, self.v_scale = scales
        k_scale, v_scale = joined[2:] or (None, None)
        return self._unpack(joined[0], k_scale), self._unpack(joined[1], v_scale)

    def set(self, k: Tensor, v: Tensor) -> None:
        """Hold keys/values that never change (cross-attention over the encoder output): in the tensors
        already held when they have the same shapes (a kept static step's CUDA graph reads them there),
        else in new ones."""
        packed = (*self._pack(k), *self._pack(v))  # k, k_scale, v, v_scale
        held = (self.k, self.k_scale, self.v, self.v_scale)
        if all(_same_shape(a, b) for a, b in zip(held, packed, strict=True)) and held[0] is not None:
            for a, b in zip(held, packed, strict=True):
                if a is not None:
                    a.copy_(b)
        else:
            self.k, self.k_scale, self.v, self.v_scale = packed
        self.length = k.shape[2]

    def reset(self) -> None:
        """Hold nothing, keeping the tensors for the next ``set`` or ``append`` of the same shapes."""
        self.length = 0

    def _grow(self, capacity: int, like: Tensor, like_scale: Tensor | None) -> None:
        B, KV, _, hd = like.shape
        old = self._stored()
        self.k, self.v = (like.new_empty(B, KV, capacity, hd) for _ in range(2))
        if like_scale is not None:
            self.k_scale, self.v_scale = (like_scale.new_empty(B, KV, capacity, 1) for _ in range(2))
        for stored, before in zip(self._stored(), old, strict=False):
            stored[:, :, : self.held] = before[:, :, : self.held]


class StaticKVCache(_Stored):
    """Keys and values of one self-attention layer in buffers of ``capacity`` positions, (B, KV,
    capacity, hd), allocated at the first write; ``pos`` (a 0-d tensor) is the next position. Every
    write is in place, so a compiled step keeps seeing the same tensors."""

    static = True

    def __init__(self, capacity: int, *, kv_dtype: str | None = None) -> None:
        super().__init__(kv_dtype)
        self.capacity = capacity
        self.register_buffer("pos", torch.zeros((), dtype=torch.long), persistent=False)

    @property
    def offset(self) -> Tensor:
        """The position of the next key written, as a 0-d tensor (read inside a compiled step)."""
        return self.pos

    @property
    def length(self) -> int:
        return int(self.pos)

    held = length

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write new keys/values (B, KV, T, hd) at ``pos``..``pos`` + T - 1; return every slot,
        (B, KV, capacity, hd): the caller's mask hides the slots after each query."""
        (k, k_scale), (v, v_scale) = self._pack(k), self._pack(v)
        new = [t for t in (k, v, k_scale, v_scale) if t is not None]  # as _stored() orders them
        if self.k is None:
            B, KV = k.shape[:2]
            self.k, self.v, *scales = (t.new_zeros(B, KV, self.capacity, t.shape[-1]) for t in new)
            if scales:
                self.k_scale, self.v_scale = scales
            self.pos = self.pos.to(k.device)
        slots = self.pos + torch.arange(k.shape[2], device=k.device)  # (T,)
        for stored, t in zip(self._stored(), new, strict=True):
            stored.index_copy_(2, slots, t.to(stored.dtype))
        self.pos.add_(k.shape[2])
        return self._unpack(self.k, self.k_scale), self._unpack(self.v, self.v_scale)

    def reset(self) -> None:
        """Hold nothing, as a new cache, in the same tensors (zeroed): the next write is at position 0."""
        self.pos.zero_()
        for stored in self._stored():
            stored.zero_()


def _same_shape(a: Tensor | None, b: Tensor | None) -> bool:
    """Whether ``b`` can be written into ``a`` in place (both None counts)."""
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device


LayerCaches = tuple["KVCache | StaticKVCache", "KVCache | None"]  # one block's self- and cross-attention caches


class Cache(nn.Module):
    """The caches of a whole model: one per self-attention layer, one per cross-attention layer.
    ``keep`` bounds the self-attention caches to the last ``keep`` positions (the decoder mask's
    ``lookback``), or each layer's by a list (``Stack.lookbacks``: a window_pattern's global layers
    keep every position); cross-attention always holds the whole encoder output. ``static`` makes the
    self-attention caches :class:`StaticKVCache` of ``capacity`` positions (``keep`` is then unused:
    the mask, not the cache, drops what a window no longer sees). ``kv_dtype`` ("int8" or None) is
    how every layer stores its keys and values."""

    def __init__(
        self,
        n_layers: int,
        *,
        cross: bool = False,
        capacity: int = 256,
        keep: int | None | list[int | None] = None,
        static: bool = False,
        kv_dtype: str | None = None,
    ) -> None:
        super().__init__()
        self.static, self.capacity = static, capacity
        keeps = keep if isinstance(keep, list) else [keep] * n_layers
        if static:
            self.self_attn = nn.ModuleList(StaticKVCache(capacity, kv_dtype=kv_dtype) for _ in range(n_layers))
        else:
            self.self_attn = nn.ModuleList(KVCache(capacity, keep=k, kv_dtype=kv_dtype) for k in keeps)
        self.cross_attn = (
            nn.ModuleList(KVCache(capacity, kv_dtype=kv_dtype) for _ in range(n_layers)) if cross else None
        )
        crosses = [None] * n_layers if self.cross_attn is None else list(self.cross_attn)
        self.layers: list[LayerCaches] = list(zip(self.self_attn, crosses, strict=True))  # what each block reads

    @property
    def length(self) -> int:
        """Number of positions already decoded (the offset of the next token)."""
        return self.self_attn[0].length

    @property
    def offset(self) -> int | Tensor:
        """The position of the next token: an int, or a 0-d tensor for a static cache."""
        return self.self_attn[0].offset

    def reset(self) -> None:
        """Empty every layer's cache in place, for another ``generate`` call of the same shapes: a kept
        static step (zoo.decoding) and its CUDA graph read these very tensors."""
        for cache in self.modules():
            if isinstance(cache, _Stored):
                cache.reset()

    def reorder(self, index: Tensor) -> None:
        for cache in self.modules():
            if isinstance(cache, _Stored):
                cache.reorder(index)

    def nbytes(self) -> int:
        return sum(c.nbytes() for c in self.modules() if isinstance(c, _Stored))

    @torch.no_grad()
    def extra_repr(self) -> str:
        return f"length={self.length}, held={self.self_attn[0].held}, bytes={self.nbytes()}"
