"""Multi-head attention (``attention`` names the kernel path).

Notation: B batch, Tq/Tk query/key lengths, H query heads, KV key/value heads, hd head width,
D model width. H == KV is multi-head attention, 1 < KV < H grouped-query (Ainslie et al. 2023),
KV == 1 multi-query (Shazeer 2019); each key/value head serves H/KV query heads.

Attention(Q, K, V) = softmax(Q K^T * scale + bias) V, scale = 1/sqrt(hd) (Vaswani et al. 2017).
:class:`SelfAttention` takes Q, K and V from one sequence (one fused ``qkv`` projection);
:class:`CrossAttention` takes Q from it and K, V from the encoder output (``q`` and a fused ``kv``).
The kernels (``attention=sdpa|flex|auto|math``) are zoo.kernels.

Options every layer may carry (``ModelConfig``):

- ``qk_norm``: a norm (any registered one, over hd) on each head's queries and keys before RoPE, so
  the scores stay bounded however large the projections grow (Dehghani et al. 2023; Qwen3, OLMo 2).
- ``attn_softcap`` c: scaled scores s become c * tanh(s / c) before the mask (Gemma 2; zoo.kernels).
- ``value_residual``: every self-attention layer after the first mixes its values with the first
  layer's, v_n <- v_n + lambda_n (v_1 - v_n), lambda_n learnable from 0.5 (Zhou et al. 2024,
  "Value Residual Learning", https://arxiv.org/abs/2410.17897; :class:`ValueResidual`). Per position,
  before the KV cache: cached decoding stores mixed values and equals the full forward.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from zoo.config import ModelConfig
from zoo.kernels import AttentionKernel, Scoring, run_flex, softcapped
from zoo.kv_cache import KVCache, round_trip
from zoo.position import apply_rotary
from zoo.registry import ATTENTION, NORM
from zoo.rules import ScoreMod
from zoo.sublayer import Sublayer, TensorSplit

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
    carried: dict[str, Tensor] = dataclasses.field(default_factory=dict)  # what a layer leaves for later ones
    keep: Tensor | None = None  # (B, T) bool, False: a padded new position; None: no padding (for reads_padding)

    def for_last_keys(self, n_keys: int) -> AttentionInputs:
        """These inputs over the last ``n_keys`` keys only: the mask's columns are the positions
        0..P+T-1, and a bounded KV cache (zoo.kv_cache) returns only the newest ones."""
        if self.mask is None or self.mask.shape[-1] <= n_keys:
            return self
        return dataclasses.replace(self, mask=self.mask[..., -n_keys:])  # (..., Tq, n_keys)


class ValueResidual(nn.Module):
    """v_n + lambda (v_1 - v_n) with one learnable lambda, starting at 0.5 (the paper's plain average)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((1,), 0.5))

    def reset_parameters(self) -> None:
        nn.init.constant_(self.weight, 0.5)

    def forward(self, v: Tensor, first: Tensor) -> Tensor:
        return torch.lerp(v, first.to(v.dtype), self.weight.to(v.dtype))


class Attention(Sublayer):
    """What self- and cross-attention share: the head sizes, the kernel and the output projection.

    Each subclass makes its input projections in ``_input_projections`` (called before ``out`` is
    made, so parameters keep the order of the state_dict and of the seeded init).
    """

    splits_by_tensor = True

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
        qk_norm: nn.Module | None = None,
        qk_norm_all: bool = False,
        softcap: float | None = None,
        width_scale: float = 1.0,
    ) -> None:
        """``qk_norm``: a norm over hd, copied for the keys (None: none), or with ``qk_norm_all`` a
        callable that makes one over a given width, used for the queries' H*hd and the keys' KV*hd;
        ``softcap``: attn_softcap; ``width_scale``: muP's factor on the score scale (:func:`mup_score_factor`)."""
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.width_scale = width_scale
        self.scale = (head_dim**-0.5 if scale is None else scale) * width_scale
        self.dropout = dropout
        self.softcap = softcap
        self.kv_dtype: str | None = None  # "int8": keys and values rounded as an int8 KV cache stores them
        self.kernel = kernel  # resolved to its function once, here and whenever it is reassigned
        self._input_projections(d_model, n_heads * head_dim, n_kv_heads * head_dim, bias=qkv_bias)
        self.qk_norm_all = qk_norm_all  # the norms act on the whole projections, before the split into heads
        if qk_norm_all:
            self.q_norm, self.k_norm = qk_norm(n_heads * head_dim), qk_norm(n_kv_heads * head_dim)
        else:
            self.q_norm, self.k_norm = qk_norm, None if qk_norm is None else copy.deepcopy(qk_norm)
        self.out = nn.Linear(n_heads * head_dim, d_model, bias=out_bias)
        self.probe = nn.Identity()

    def _input_projections(self, d_model: int, q_dim: int, kv_dim: int, *, bias: bool) -> None:
        raise NotImplementedError

    def query_weight(self) -> Tensor:
        """The rows of the input projection that make the queries, (H * hd, D): a view, for init."""
        raise NotImplementedError

    def residual_projections(self) -> list[nn.Linear]:
        return [self.out]

    def tensor_split(self) -> TensorSplit:
        """The input projections column-parallel: rank r its query heads r*H/N .. (r+1)*H/N - 1 and the
        KV/N key/value heads they read (GQA keeps its groups); ``out`` row-parallel. qk_norm's and
        value_residual's weights meet this rank's heads alone."""
        return self.linear_split({"n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads}, sums_own=True)

    def keep_share(self, degree: int) -> None:
        self.n_heads, self.n_kv_heads = self.n_heads // degree, self.n_kv_heads // degree

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
            qk_norm=_qk_norm(cfg),
            qk_norm_all=cfg.qk_norm_scope == "all",
            softcap=cfg.attn_softcap,
            width_scale=mup_score_factor(cfg),
        )

    def fold_width_scale(self) -> None:
        """Move muP's factor on the scores into the queries (export: a runtime that scales scores by
        1/sqrt(hd) then computes the same ones). A scalar commutes with RoPE; with qk_norm the queries
        are normalised after the projection, so the factor goes on the query norm's output."""
        factor, self.width_scale = self.width_scale, 1.0
        self.scale /= factor
        if self.q_norm is not None:
            self.q_norm.scale_output_(factor)
            return
        self.query_weight().mul_(factor)
        bias = self.query_bias()
        if bias is not None:
            bias.mul_(factor)

    def query_bias(self) -> Tensor | None:
        """The query rows of the input projection's bias (a view), or None without a bias."""
        raise NotImplementedError

    def reads_flex_mods(self, device_type: str, *, cached: bool, dense: bool) -> bool:
        """Whether this forward's kernel takes FlexMods (see :func:`flex_applies`) rather than a dense mask."""
        dropout_p = self.dropout if self.training else 0.0
        return self._kernel_cls.reads_flex_mods(device_type, cached=cached, dense=dense, dropout_p=dropout_p)

    def _heads(self, x: Tensor, n: int, norm: nn.Module | None = None) -> Tensor:
        """(B, T, n * hd) -> (B, n, T, hd), normalised by ``norm`` where there is one: over all n heads at
        once (``qk_norm_all``) or each head apart."""
        B, T, _ = x.shape
        if norm is not None and self.qk_norm_all:
            x, norm = norm(x), None
        x = x.view(B, T, n, self.head_dim)
        return (x if norm is None else norm(x)).transpose(1, 2)  # (B, n, T, hd)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, inputs: AttentionInputs) -> Tensor:
        """q: (B, H, Tq, hd); k, v: (B, KV, Tk, hd). Returns the projected output (B, Tq, D)."""
        B, _, T, _ = q.shape
        dropout_p = self.dropout if self.training else 0.0
        if inputs.flex is not None:  # the stack asked reads_flex_mods: only flex-capable kernels get here
            score_mod = inputs.flex.score_mod
            if self.softcap is not None:
                score_mod = softcapped(score_mod, self.softcap)
            y = run_flex(q, k, v, score_mod, inputs.flex.block_mask, scale=self.scale, dropout_p=dropout_p)
            return self.out(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))
        mask = inputs.mask
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.to(q.dtype)
        how = Scoring(mask, inputs.is_causal, self.scale, dropout_p, self.probe, self.softcap)
        y = self._kernel_cls.attend(q, k, v, how)  # (B, H, Tq, hd)
        return self.out(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


def mup_score_factor(cfg: ModelConfig) -> float:
    """muP's factor on the attention scores: sqrt(hd_base / hd), so the scale, sqrt(hd_base) / hd, is
    1/sqrt(hd_base) at the base width and falls as 1/hd beyond it (Yang et al. 2022,
    https://arxiv.org/abs/2203.03466, sec. 4: q and k become correlated as they train, and q.k grows
    as hd, not sqrt(hd)). hd_base is this config's
    head size at d_model = mup_base_d_model: with ``head_dim`` null the head grows with the width
    (hd = d_model / n_heads) and the factor is sqrt(base / d_model); with ``head_dim`` set, the heads
    multiply and each stays hd wide, where 1/sqrt(hd) is already width-independent: factor 1. 1
    without muP."""
    if cfg.mup_base_d_model is None or cfg.head_dim is not None:
        return 1.0
    return math.sqrt(cfg.mup_base_d_model / cfg.d_model)


def _qk_norm(cfg: ModelConfig) -> nn.Module | Callable[[int], nn.Module] | None:
    """What ``Attention`` takes as ``qk_norm``: one norm over a head (qk_norm_scope=head) or a maker of
    norms of a given width (all)."""
    if cfg.qk_norm == "none":
        return None
    norm = NORM.get(cfg.qk_norm, field="qk_norm")
    return (
        partial(norm.from_config, cfg) if cfg.qk_norm_scope == "all" else norm.from_config(cfg, cfg.resolved_head_dim)
    )


class SelfAttention(Attention):
    """Queries, keys and values from the same sequence, by one fused projection ``qkv`` = [q; k; v]."""

    def _input_projections(self, d_model: int, q_dim: int, kv_dim: int, *, bias: bool) -> None:
        self.qkv = nn.Linear(d_model, q_dim + 2 * kv_dim, bias=bias)
        self.value_residual: ValueResidual | None = None  # set by the stack on layers after the first
        self.values_first = False  # value_residual: this is the first layer, whose values the others mix in

    def query_weight(self) -> Tensor:
        return self.qkv.weight[: self.n_heads * self.head_dim]

    def query_bias(self) -> Tensor | None:
        return None if self.qkv.bias is None else self.qkv.bias[: self.n_heads * self.head_dim]

    def fused_segments(self) -> dict[str, list[tuple[str, int]]]:
        q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        return {"qkv": [("q", q), ("k", kv), ("v", kv)]}

    def forward(self, x: Tensor, inputs: AttentionInputs, *, cache: KVCache | None = None) -> Tensor:
        """x: (B, T, D); with a cache, its keys and values come first. Returns (B, T, D)."""
        q_dim, kv_dim = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        q, k, v = self.qkv(x).split((q_dim, kv_dim, kv_dim), dim=-1)
        q, k = self._heads(q, self.n_heads, self.q_norm), self._heads(k, self.n_kv_heads, self.k_norm)
        v = self._heads(v, self.n_kv_heads)
        if self.values_first:
            inputs.carried["first_values"] = v  # (B, KV, T, hd)
        elif self.value_residual is not None:
            v = self.value_residual(v, inputs.carried["first_values"])
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

    def query_bias(self) -> Tensor | None:
        return self.q.bias

    def fused_segments(self) -> dict[str, list[tuple[str, int]]]:
        kv = self.n_kv_heads * self.head_dim
        return {"kv": [("k", kv), ("v", kv)]}

    def forward(
        self, x: Tensor, inputs: AttentionInputs, *, cache: KVCache | None = None, memory: Tensor | None = None
    ) -> Tensor:
        """x: (B, Tq, D); memory: (B, Tk, D), needed unless the cache holds its keys and values.
        Returns (B, Tq, D)."""
        q = self._heads(self.q(x), self.n_heads, self.q_norm)
        if cache is not None and cache.length:  # encoder keys/values were computed at the first step
            k, v = cache.get()
        else:
            assert memory is not None, "cross-attention needs the encoder output (memory)"
            kv_dim = self.n_kv_heads * self.head_dim
            k, v = self.kv(memory).split(kv_dim, dim=-1)
            k, v = self._heads(k, self.n_kv_heads, self.k_norm), self._heads(v, self.n_kv_heads)
            if cache is not None:
                cache.set(k, v)
                k, v = cache.get()  # as every later step reads them (an int8 cache rounds them)
            else:
                k, v = round_trip(k, self.kv_dtype), round_trip(v, self.kv_dtype)
        return self._attend(q, k, v, inputs)
