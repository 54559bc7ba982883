"""Multi-head attention (``attention`` names the kernel path).

Notation: B batch, Tq/Tk query/key lengths, H query heads, KV key/value heads, hd head width,
D model width. H == KV is multi-head attention, 1 < KV < H grouped-query (Ainslie et al. 2023),
KV == 1 multi-query (Shazeer 2019); each key/value head serves H/KV query heads.

Attention(Q, K, V) = softmax(Q K^T * scale + bias) V, scale = 1/sqrt(hd) (Vaswani et al. 2017).
:class:`SelfAttention` takes Q, K and V from one sequence (one fused ``qkv`` projection);
:class:`CrossAttention` takes Q from it and K, V from the encoder output (``q`` and a fused ``kv``).

- ``sdpa``: ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels on GPU). Position
  biases (ALiBi, T5) and masks go in as its ``attn_mask``, so every position type runs on it.
- ``flex``: ``torch.nn.attention.flex_attention`` (PyTorch 2.5+), for what SDPA cannot fuse. In a
  full forward (no KV cache) the stack hands it :class:`FlexMods`: the position's ``score_mod``
  (ALiBi, T5) and the mask's ``mask_mod`` (with padding and documents) as one block mask, made once
  per forward; both are computed inside the kernel from positions, so no (Tq, Tk) mask or bias
  exists and memory grows as O(T). With a KV cache the stack's dense mask becomes a block mask and a
  float bias a ``score_mod`` that reads it. On CUDA the call is compiled into one fused kernel; on
  the CPU it runs eagerly (torch supports its forward only there: no backward, no dropout).
- ``auto``: ``sdpa``, except where :func:`flex_applies`: on CUDA, a full forward whose mask or bias
  sdpa would need as a (Tq, Tk) tensor, with no attention dropout; that forward runs ``flex`` on
  :class:`FlexMods`.
- ``math``: the explicit reference. Its probabilities pass through ``Attention.probe`` (an
  identity module), where forward hooks can read them; see ``zoo.capture_attention``.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.config import ModelConfig
from zoo.kv_cache import KVCache, round_trip
from zoo.position import ScoreMod, apply_rotary
from zoo.registry import ATTENTION, ConfigError
from zoo.sublayer import Sublayer

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask


@dataclass
class FlexMods:
    """A full forward's mask and bias as flex_attention computes them from positions inside the kernel."""

    score_mod: ScoreMod | None = None  # the position's bias (Position.score_mod); None: none
    block_mask: BlockMask | None = None  # mask, padding and documents (Mask.mask_mod); None: every key


@dataclass
class AttentionInputs:
    """What a stack computes once per forward and hands to each of its attention layers."""

    mask: Tensor | None = None  # bool (True = attend) or float (added to scores), broadcast to (B, H, Tq, Tk)
    is_causal: bool = False  # plain causal mask over Tq == Tk positions, left to the kernel
    rotary: tuple[Tensor, Tensor] | None = None  # (cos, sin) for q and k
    flex: FlexMods | None = None  # set instead of mask / is_causal for layers that read them (reads_flex_mods)

    def for_last_keys(self, n_keys: int) -> AttentionInputs:
        """These inputs over the last ``n_keys`` keys only: the mask's columns are the positions
        0..P+T-1, and a bounded KV cache (zoo.kv_cache) returns only the newest ones."""
        if self.mask is None or self.mask.shape[-1] <= n_keys:
            return self
        return dataclasses.replace(self, mask=self.mask[..., -n_keys:])  # (..., Tq, n_keys)


class Scoring(NamedTuple):
    """What a kernel needs besides q, k, v (a tuple: one is made per layer and step)."""

    mask: Tensor | None  # bool (True = attend) or float (added to scores), broadcast to (B, H, Tq, Tk)
    is_causal: bool  # the plain causal mask over Tq == Tk, left to the kernel
    scale: float  # multiplies q k^T
    dropout_p: float  # on the probabilities
    probe: nn.Module  # where kernels that form the probabilities pass them (Attention.probe)


class AttentionKernel:
    """Base of the registered attention kernels (``attention=<name>``): softmax(q k^T * scale + mask) v
    over q (B, H, Tq, hd) and k, v (B, KV, Tk, hd), H a multiple of KV; returns (B, H, Tq, hd).

    A kernel is a class of hooks, never instantiated: ``attend`` computes; ``check`` refuses, at
    composition, a model it cannot run (ModelConfig.validate asks each chosen component);
    ``reads_flex_mods`` says which forwards the stack hands it as :class:`FlexMods` instead of a
    dense mask (Attention.reads_flex_mods asks it once per forward)."""

    reads: ClassVar[frozenset[str]] = frozenset()  # ModelConfig settings of its own (zoo.registry.reads)

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Raise ConfigError for settings this kernel cannot compute; by default it computes them all."""

    @classmethod
    def reads_flex_mods(cls, device_type: str, *, cached: bool, dense: bool, dropout_p: float) -> bool:
        """Whether a forward on ``device_type`` (with a KV cache or not; ``dense``: sdpa would need a
        (Tq, Tk) mask or bias) comes as FlexMods rather than a dense mask. Dense kernels: never."""
        return False

    @staticmethod
    def attend(q: Tensor, k: Tensor, v: Tensor, how: Scoring) -> Tensor:
        """Attention over (B, H, Tq, hd) queries and (B, KV, Tk, hd) keys and values, scored as ``how`` says."""
        raise NotImplementedError


@ATTENTION.register("sdpa")
class SDPA(AttentionKernel):
    """``F.scaled_dot_product_attention``: flash / memory-efficient kernels on GPU, flash on the CPU."""

    @staticmethod
    def attend(q: Tensor, k: Tensor, v: Tensor, how: Scoring) -> Tensor:
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=how.mask,
            dropout_p=how.dropout_p,
            is_causal=how.is_causal,
            scale=how.scale,
            enable_gqa=bool(k.shape[1] != q.shape[1]),
        )


def _at(t: Tensor, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    """t[b, h, q, kv] of a 4-d ``t`` whose batch or head dimension may be 1 (broadcast)."""
    return t[b if t.shape[0] > 1 else 0, h if t.shape[1] > 1 else 0, q, kv]


def _flex_mods(
    mask: Tensor | None, is_causal: bool, shape: tuple[int, int, int, int], device: torch.device
) -> tuple[Callable | None, object | None]:
    """(score_mod, block_mask) for ``flex_attention`` that compute what ``mask`` (as ``math`` reads
    it) or ``is_causal`` would; None where nothing is masked or added. shape: (B, H, Tq, Tk)."""
    from torch.nn.attention.flex_attention import create_block_mask

    _, _, Tq, Tk = shape
    if mask is None and not is_causal:
        return None, None
    if is_causal:

        def causal(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
            return kv <= q

        return None, create_block_mask(causal, None, None, Tq, Tk, device=device)
    full = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # (B or 1, H or 1, Tq or 1, Tk)
    full = full.expand(*full.shape[:2], Tq, Tk)
    allowed = full if full.dtype == torch.bool else torch.isfinite(full[:, :1])  # -inf marks a masked key
    bias = None if full.dtype == torch.bool else full.masked_fill(~allowed, 0.0)

    def keep(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return _at(allowed, b, h, q, kv)

    def add_bias(score: Tensor, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return score + _at(bias, b, h, q, kv).to(score.dtype)

    block_mask = create_block_mask(keep, allowed.shape[0], allowed.shape[1], Tq, Tk, device=device)
    return (None if bias is None else add_bias), block_mask


@functools.cache
def _compiled_flex() -> Callable[..., Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _run_flex(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    score_mod: ScoreMod | None,
    block_mask: BlockMask | None,
    *,
    scale: float,
    dropout_p: float,
) -> Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    if dropout_p:
        raise ValueError(
            f"attention='flex' has no attention dropout (got p={dropout_p}); set attn_dropout=0 or use attention='sdpa'"
        )
    gqa = bool(k.shape[1] != q.shape[1])
    if q.is_cuda and not torch.compiler.is_compiling():
        return _compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa)
    with warnings.catch_warnings():  # the CPU runs the unfused reference on purpose (torch has no CPU kernel)
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa)


def flex_applies(device_type: str, *, cached: bool, dense: bool, dropout_p: float) -> bool:
    """Whether attention='auto' runs a forward on flex_attention with FlexMods instead of sdpa: on CUDA
    (where flex is one compiled kernel), a full forward (no KV cache: a decoding step's rows are short),
    where sdpa would need a (Tq, Tk) mask or bias tensor (``dense``: a position bias, padding,
    documents, or a mask that is neither none nor is_causal) and no attention dropout (flex has none)."""
    return device_type == "cuda" and not cached and dense and not dropout_p


@ATTENTION.register("flex")
class Flex(AttentionKernel):
    """``flex_attention``: a full forward comes as FlexMods (no (Tq, Tk) tensor); the dense inputs of
    a cached forward are converted to a block mask and a score_mod."""

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """flex_attention has no dropout: a model that asks for attention dropout is refused when
        composed, not at its first training step."""
        dropout = cfg.dropout if cfg.attn_dropout is None else cfg.attn_dropout
        if dropout:
            raise ConfigError(
                f"attention=flex has no attention dropout (attn_dropout={dropout}); set "
                "model.attn_dropout=0 (dropout elsewhere stays) or choose attention=sdpa"
            )

    @classmethod
    def reads_flex_mods(cls, device_type: str, *, cached: bool, dense: bool, dropout_p: float) -> bool:
        return not cached  # FlexMods whenever there is no cache (dropout is refused by check)

    @staticmethod
    def attend(q: Tensor, k: Tensor, v: Tensor, how: Scoring) -> Tensor:
        shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        score_mod, block_mask = _flex_mods(how.mask, how.is_causal, shape, q.device)
        return _run_flex(q, k, v, score_mod, block_mask, scale=how.scale, dropout_p=how.dropout_p)


@ATTENTION.register("auto")
class Auto(SDPA):
    """``sdpa`` for the forwards that :func:`flex_applies` leaves to it; the others come as FlexMods."""

    @classmethod
    def reads_flex_mods(cls, device_type: str, *, cached: bool, dense: bool, dropout_p: float) -> bool:
        return flex_applies(device_type, cached=cached, dense=dense, dropout_p=dropout_p)


@ATTENTION.register("math")
class Math(AttentionKernel):
    """The explicit reference; its probabilities pass through ``probe`` (zoo.capture_attention)."""

    @staticmethod
    def attend(q: Tensor, k: Tensor, v: Tensor, how: Scoring) -> Tensor:
        groups = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(groups, dim=1)  # (B, H, Tk, hd)
        v = v.repeat_interleave(groups, dim=1)
        scores = (q @ k.transpose(-2, -1)).float() * how.scale  # (B, H, Tq, Tk)
        mask = how.mask
        if how.is_causal:
            mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        probs = how.probe(scores.softmax(dim=-1))  # (B, H, Tq, Tk)
        probs = F.dropout(probs, p=how.dropout_p)
        return probs.type_as(v) @ v  # (B, H, Tq, hd)


class Attention(Sublayer):
    """What self- and cross-attention share: the head sizes, the kernel and the output projection.

    Each subclass makes its input projections in ``_input_projections`` (called before ``out`` is
    made, so parameters keep the order of the state_dict and of the seeded init).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        *,
        qkv_bias: bool,
        out_bias: bool,
        dropout: float = 0.0,
        scale: float | None = None,
        kernel: str = "sdpa",
    ) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.scale = head_dim**-0.5 if scale is None else scale
        self.dropout = dropout
        self.kv_dtype: str | None = None  # "int8": keys and values rounded as an int8 KV cache stores them
        self.kernel = kernel  # resolved to its function once, here and whenever it is reassigned
        self._input_projections(d_model, n_heads * head_dim, n_kv_heads * head_dim, bias=qkv_bias)
        self.out = nn.Linear(n_heads * head_dim, d_model, bias=out_bias)
        self.probe = nn.Identity()

    def _input_projections(self, d_model: int, q_dim: int, kv_dim: int, *, bias: bool) -> None:
        raise NotImplementedError

    def query_weight(self) -> Tensor:
        """The rows of the input projection that make the queries, (H * hd, D): a view, for init."""
        raise NotImplementedError

    def residual_projections(self) -> list[nn.Linear]:
        return [self.out]

    @property
    def kernel(self) -> str:
        return self._kernel

    @kernel.setter
    def kernel(self, name: str) -> None:
        self._kernel_cls: type[AttentionKernel] = ATTENTION.get(name, field="attention")
        self._kernel = name

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> Attention:
        return cls(
            cfg.d_model,
            cfg.n_heads,
            cfg.resolved_n_kv_heads,
            cfg.resolved_head_dim,
            qkv_bias=cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias,
            out_bias=cfg.bias,
            dropout=cfg.dropout if cfg.attn_dropout is None else cfg.attn_dropout,
            scale=cfg.attn_scale,
            kernel=cfg.attention,
        )

    def reads_flex_mods(self, device_type: str, *, cached: bool, dense: bool) -> bool:
        """Whether this forward's kernel takes FlexMods (see :func:`flex_applies`) rather than a dense mask."""
        dropout_p = self.dropout if self.training else 0.0
        return self._kernel_cls.reads_flex_mods(device_type, cached=cached, dense=dense, dropout_p=dropout_p)

    def _heads(self, x: Tensor, n: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)  # (B, n, T, hd)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, inputs: AttentionInputs) -> Tensor:
        """q: (B, H, Tq, hd); k, v: (B, KV, Tk, hd). Returns the projected output (B, Tq, D)."""
        B, _, T, _ = q.shape
        dropout_p = self.dropout if self.training else 0.0
        if inputs.flex is not None:  # the stack asked reads_flex_mods: only flex-capable kernels get here
            y = _run_flex(
                q, k, v, inputs.flex.score_mod, inputs.flex.block_mask, scale=self.scale, dropout_p=dropout_p
            )  # (B, H, Tq, hd)
            return self.out(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))
        mask = inputs.mask
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.to(q.dtype)
        how = Scoring(mask, inputs.is_causal, self.scale, dropout_p, self.probe)
        y = self._kernel_cls.attend(q, k, v, how)  # (B, H, Tq, hd)
        return self.out(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class SelfAttention(Attention):
    """Queries, keys and values from the same sequence, by one fused projection ``qkv`` = [q; k; v]."""

    def _input_projections(self, d_model: int, q_dim: int, kv_dim: int, *, bias: bool) -> None:
        self.qkv = nn.Linear(d_model, q_dim + 2 * kv_dim, bias=bias)

    def query_weight(self) -> Tensor:
        return self.qkv.weight[: self.n_heads * self.head_dim]

    def fused_segments(self) -> dict[str, list[tuple[str, int]]]:
        q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        return {"qkv": [("q", q), ("k", kv), ("v", kv)]}

    def forward(self, x: Tensor, inputs: AttentionInputs, *, cache: KVCache | None = None) -> Tensor:
        """x: (B, T, D); with a cache, its keys and values come first. Returns (B, T, D)."""
        q_dim, kv_dim = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        q, k, v = self.qkv(x).split((q_dim, kv_dim, kv_dim), dim=-1)
        q, k, v = self._heads(q, self.n_heads), self._heads(k, self.n_kv_heads), self._heads(v, self.n_kv_heads)
        if inputs.rotary is not None:
            q, k = apply_rotary(q, *inputs.rotary), apply_rotary(k, *inputs.rotary)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, KV, held + T, hd); a bounded cache holds only the last positions
            inputs = inputs.for_last_keys(k.shape[2])
        else:
            k, v = round_trip(k, self.kv_dtype), round_trip(v, self.kv_dtype)
        return self._attend(q, k, v, inputs)


class CrossAttention(Attention):
    """Queries from x, keys and values from the encoder output (``memory``) by a fused ``kv`` = [k; v]."""

    def _input_projections(self, d_model: int, q_dim: int, kv_dim: int, *, bias: bool) -> None:
        self.q = nn.Linear(d_model, q_dim, bias=bias)
        self.kv = nn.Linear(d_model, 2 * kv_dim, bias=bias)

    def query_weight(self) -> Tensor:
        return self.q.weight

    def fused_segments(self) -> dict[str, list[tuple[str, int]]]:
        kv = self.n_kv_heads * self.head_dim
        return {"kv": [("k", kv), ("v", kv)]}

    def forward(
        self, x: Tensor, inputs: AttentionInputs, *, cache: KVCache | None = None, memory: Tensor | None = None
    ) -> Tensor:
        """x: (B, Tq, D); memory: (B, Tk, D), needed unless the cache holds its keys and values.
        Returns (B, Tq, D)."""
        q = self._heads(self.q(x), self.n_heads)
        if cache is not None and cache.length:  # encoder keys/values were computed at the first step
            k, v = cache.get()
        else:
            assert memory is not None, "cross-attention needs the encoder output (memory)"
            kv_dim = self.n_kv_heads * self.head_dim
            k, v = (self._heads(t, self.n_kv_heads) for t in self.kv(memory).split(kv_dim, dim=-1))
            if cache is not None:
                cache.set(k, v)
                k, v = cache.get()  # as every later step reads them (an int8 cache rounds them)
            else:
                k, v = round_trip(k, self.kv_dtype), round_trip(v, self.kv_dtype)
        return self._attend(q, k, v, inputs)
