"""Position encodings (``position``).

A position encoding acts at one of three places, so the base class has three hooks, each a no-op:

- ``embed(position_ids)``: a vector added to the token embeddings (``sinusoidal``, ``learned``);
- ``rotary(position_ids)``: (cos, sin) that rotate q and k in every layer (``rope``);
- ``score_mod(device)``: an additive attention bias shared by all layers (``alibi``, ``t5_relative``),
  written once as flex_attention's score_mod: flex computes it inside the kernel from the positions
  of each query and key, so no (H, Tq, Tk) tensor is ever made, and the base class derives the dense
  ``bias(q_pos, k_pos)`` that sdpa and math add by evaluating the same function on broadcast index
  grids (``zoo.rules.index_grids``). A class that writes ``bias`` without its own ``score_mod`` is
  refused when it is defined (flex would drop the bias).

Shapes: B batch, T positions, H heads, Tq/Tk query/key lengths, D model width, hd head width.
Positions are absolute indices; with a KV cache they start at the cache length, so decoding one
token at a time sees the same encodings as a full forward pass.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor, nn

from zoo.config import ModelConfig
from zoo.registry import POSITION, Component, ConfigError
from zoo.rope_scaling import ROPE_SCALINGS, RopeScaling  # noqa: F401  (RopeScaling: named in RoPE's docstring)
from zoo.rules import ScoreMod, index_grids, over_keys, refuse_half_rules


class Position(Component, nn.Module):
    max_len: int | None = None  # longest sequence the encoding can represent (None: unbounded)
    n_heads: int | None = None  # the heads score_mod's h ranges over; a position with a score_mod sets it
    reads: ClassVar[frozenset[str]] = frozenset()  # the component settings it reads (zoo.registry.reads)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        refuse_half_rules(cls, (("bias", "score_mod"),), Position)

    @property
    def has_bias(self) -> bool:
        """Whether ``score_mod`` is overridden (the stack then builds a float mask for every forward)."""
        return type(self).score_mod is not Position.score_mod

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Raise ConfigError for settings this encoding cannot work with (ModelConfig.validate calls it)."""

    @classmethod
    def from_config(cls, cfg: ModelConfig, *, causal: bool) -> Position:
        return cls()

    @classmethod
    def limit(cls, cfg: ModelConfig) -> int | None:
        """The ``max_len`` a model of ``cfg`` will have, known without building it."""
        return None

    def embed(self, position_ids: Tensor) -> Tensor | None:
        return None

    def attention_table_params(self) -> int:
        """Parameters held in nn.Embedding tables that are attention parameters by role (a learned
        bias per head and distance, T5), which zoo.stats does not count as embedding parameters."""
        return 0

    def rotary(self, position_ids: Tensor) -> tuple[Tensor, Tensor] | None:
        return None

    def global_rotary(self, position_ids: Tensor, local: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor] | None:
        """The global (G) layers' ``rotary`` under a ``window_pattern``: ``local`` (the others') unless set apart."""
        return local

    def score_mod(self, device: torch.device) -> ScoreMod | None:
        """The bias, as flex_attention's score_mod (score, b, h, q_idx, kv_idx) -> score plus the bias
        of head h for the query at position q_idx and the key at kv_idx (b: the row; the bias is the
        same for every row). None: no bias."""
        return None

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """``score_mod`` as the (H, Tq, Tk) bias of queries at ``q_pos`` and keys at ``k_pos``
        (with a KV cache: P..P+T-1 and 0..P+T-1). None: no bias."""
        mod = self.score_mod(q_pos.device)
        if mod is None:
            return None
        if self.n_heads is None:
            raise TypeError(
                f"{type(self).__name__} has a score_mod but no n_heads: set n_heads, the heads h ranges over"
            )
        zero = torch.zeros((), device=q_pos.device)  # the score the bias is added to
        biased = over_keys(mod(zero, *index_grids(q_pos, k_pos, heads=self.n_heads)), q_pos.shape[0], k_pos.shape[0])
        return biased if biased.dim() == 3 else biased.expand(self.n_heads, *biased.shape[-2:])  # (H, Tq, Tk)


POSITION.bind(Position)


@POSITION.register("none")
class NoPosition(Position):
    """No position information: an encoder without it is permutation-equivariant."""


@POSITION.register("sinusoidal")
class Sinusoidal(Position):
    """Vaswani et al. 2017, sec. 3.5: PE(p, 2i) = sin(p / 10000^(2i/D)), PE(p, 2i+1) = cos(same)."""

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.dim = dim
        self.base = base

    @classmethod
    def from_config(cls, cfg: ModelConfig, *, causal: bool) -> Sinusoidal:
        return cls(cfg.d_model)

    def embed(self, position_ids: Tensor) -> Tensor:
        i = torch.arange(0, self.dim, 2, device=position_ids.device, dtype=torch.float32)
        angles = position_ids.float()[..., None] * self.base ** (-i / self.dim)  # (..., T, ceil(D/2))
        pe = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (..., T, 2*ceil(D/2)) interleaved
        return pe[..., : self.dim]


@POSITION.register("learned")
class Learned(Position):
    """A trained table of absolute position vectors (GPT-2, BERT); cannot go past ``max_seq_len``."""

    def __init__(self, max_len: int, dim: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, dim)

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        if cfg.max_seq_len is None:
            raise ConfigError(f"position={cfg.position!r} needs max_seq_len (the size of the position table)")

    @classmethod
    def from_config(cls, cfg: ModelConfig, *, causal: bool) -> Learned:
        assert cfg.max_seq_len is not None  # check (called by ModelConfig.validate) guarantees it
        return cls(cfg.max_seq_len, cfg.d_model)

    @classmethod
    def limit(cls, cfg: ModelConfig) -> int | None:
        return cfg.max_seq_len

    def embed(self, position_ids: Tensor) -> Tensor:
        return self.table(position_ids)


@POSITION.register("rope")
class RoPE(Position):
    """Su et al. 2021 (RoFormer): rotate each pair of q/k dimensions by the angle p * theta_i,
    theta_i = base^(-2i/hd), so that <R_m q, R_n k> depends on m - n only.

    Pairs are (i, i + hd/2) ("rotate half", the layout of GPT-NeoX and HF Llama). Context extension:
    ``rope_scaling``, a :class:`RopeScaling` of ROPE_SCALINGS (none, linear, ntk, yarn), by ``rope_scaling_factor``.
    ``rope_base_global``: the base of a ``window_pattern``'s global layers, ``wide`` (ModernBERT), scaled alike.
    """

    reads = frozenset({"rope_base", "rope_scaling", "rope_scaling_factor", "rope_original_max_len", "rope_base_global"})

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        scaling: str = "none",
        factor: float = 1.0,
        original_max_len: int | None = None,
        global_base: float | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.scaling = ROPE_SCALINGS.get(scaling, field="rope_scaling")(factor, original_max_len)
        self.base = self.scaling.base(base, head_dim)
        self.wide = None if global_base is None else RoPE(head_dim, global_base, scaling, factor, original_max_len)

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        if cfg.resolved_head_dim % 2:
            raise ConfigError(
                f"position={cfg.position!r} rotates pairs of dimensions: head_dim={cfg.resolved_head_dim} must be even"
            )
        if cfg.rope_base_global is not None and "G" not in (cfg.window_pattern or ""):
            raise ConfigError(
                f"rope_base_global={cfg.rope_base_global} is the base of a window_pattern's global (G) layers and "
                f"window_pattern={cfg.window_pattern!r} has none: set one (e.g. GLL) or drop rope_base_global"
            )
        ROPE_SCALINGS.get(cfg.rope_scaling, field="rope_scaling").check(cfg)

    @classmethod
    def from_config(cls, cfg: ModelConfig, *, causal: bool) -> RoPE:
        dim, scaling = cfg.resolved_head_dim, (cfg.rope_scaling, cfg.rope_scaling_factor, cfg.rope_original_max_len)
        return cls(dim, cfg.rope_base, *scaling, cfg.rope_base_global)

    def inv_freq(self, device: torch.device | None = None) -> Tensor:
        i = torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float32)
        return self.scaling.inv_freq(self.base ** (-i / self.head_dim), self.base, self.head_dim)  # (hd/2,)

    def rotary(self, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        pos = self.scaling.positions(position_ids.float())
        angles = pos[..., None] * self.inv_freq(position_ids.device)  # (..., T, hd/2)
        angles = torch.cat((angles, angles), dim=-1)  # (..., T, hd)
        if angles.dim() == 3:  # per-sequence positions (left padding): (B, 1, T, hd)
            angles = angles[:, None]
        scale = self.scaling.attention_factor
        return (angles.cos(), angles.sin()) if scale == 1.0 else (angles.cos() * scale, angles.sin() * scale)

    def global_rotary(self, position_ids: Tensor, local: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor] | None:
        return local if self.wide is None else self.wide.rotary(position_ids)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` (B, H, T, hd) by the angles behind ``cos``/``sin`` (T, hd) or (B, 1, T, hd)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x.float() * cos + rotated * sin).type_as(x)


def alibi_slopes(n_heads: int) -> Tensor:
    """Press et al. 2022: the geometric sequence 2^(-8/n), 2^(-16/n), ... for n a power of two;
    otherwise the slopes of the closest smaller power of two followed by every other slope of
    the next power of two (the paper's recipe)."""

    def power_of_two(n: int) -> list[float]:
        return [2 ** (-8 * (i + 1) / n) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_two(n_heads))
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(power_of_two(closest) + extra)


@POSITION.register("alibi")
class ALiBi(Position):
    """Press et al. 2022, "Train Short, Test Long": score(q, k) -= slope_h * |q - k|. No parameters."""

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads

    @classmethod
    def from_config(cls, cfg: ModelConfig, *, causal: bool) -> ALiBi:
        return cls(cfg.n_heads)

    def score_mod(self, device: torch.device) -> ScoreMod:
        slopes = alibi_slopes(self.n_heads).to(device)  # (H,)

        def alibi(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score - slopes[h] * (q_idx - kv_idx).abs()

        return alibi


def t5_relative_bucket(relative: Tensor, *, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """Raffel et al. 2020: map key - query offsets to buckets; exact for small distances,
    logarithmic up to ``max_distance``, one shared bucket beyond. Bidirectional buckets spend half
    the buckets on keys after the query; causal ones only see keys at or before it. Elementwise and
    without in-place ops, so it also maps one (q_idx, kv_idx) pair inside a flex_attention score_mod."""
    if bidirectional:
        num_buckets //= 2
        buckets = (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        buckets = torch.zeros_like(relative, dtype=torch.long)
        distance = (-relative).clamp(min=0)
    max_exact = num_buckets // 2
    log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    far = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < max_exact, distance, far)


@POSITION.register("t5_relative")
class T5Relative(Position):
    """A learned scalar per (bucket of k - q, head), added to the scores of every layer of a stack."""

    reads = frozenset({"rel_buckets", "rel_max_distance"})

    def __init__(self, n_heads: int, *, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.bidirectional = bidirectional
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.table = nn.Embedding(num_buckets, n_heads)

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        if cfg.rel_buckets % 2 or cfg.rel_buckets < 4:
            raise ConfigError(f"rel_buckets={cfg.rel_buckets} must be even and >= 4")
        if cfg.rel_max_distance <= cfg.rel_buckets // 2:
            raise ConfigError(
                f"rel_max_distance={cfg.rel_max_distance} must exceed rel_buckets/2={cfg.rel_buckets // 2}"
            )

    @classmethod
    def from_config(cls, cfg: ModelConfig, *, causal: bool) -> T5Relative:
        return cls(
            cfg.n_heads, bidirectional=not causal, num_buckets=cfg.rel_buckets, max_distance=cfg.rel_max_distance
        )

    def attention_table_params(self) -> int:
        return self.table.weight.numel()  # a bias per head and bucket: attention by role

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The dense fast path of ``score_mod`` (whole rows of the table per bucket, where the derived
        form gathers one scalar per head and pair: ~9x slower on the CPU at T=512); tests check that they agree."""
        relative = k_pos[None, :] - q_pos[:, None]  # (Tq, Tk)
        buckets = t5_relative_bucket(
            relative, bidirectional=self.bidirectional, num_buckets=self.num_buckets, max_distance=self.max_distance
        )
        return self.table(buckets).permute(2, 0, 1)  # (H, Tq, Tk)

    def score_mod(self, device: torch.device) -> ScoreMod:
        table = self.table.weight  # (buckets, H), read inside the kernel (its gradient flows on CUDA)
        buckets = dict(bidirectional=self.bidirectional, num_buckets=self.num_buckets, max_distance=self.max_distance)

        def t5_relative(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + table[t5_relative_bucket(kv_idx - q_idx, **buckets), h].to(score.dtype)

        return t5_relative


def position_limit(cfg: ModelConfig) -> int | None:
    """The most positions a model of ``cfg`` can take (None: its positions are unbounded)."""
    return POSITION.get(cfg.position, field="position").limit(cfg)
