"""RoPE context extensions (``rope_scaling``, the ROPE_SCALINGS registry): how each changes the
rotary frequencies, the positions and the size of q and k. ``RoPE`` (zoo.position) builds one from
``rope_scaling``, ``rope_scaling_factor`` and ``rope_original_max_len``."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from zoo.config import ModelConfig
from zoo.registry import ConfigError, Registry


class RopeScaling:
    """A RoPE context extension (``rope_scaling``, in ROPE_SCALINGS): how it changes the frequencies,
    the positions and the size of q and k; each hook here is the identity. ``factor``: the extension
    (``rope_scaling_factor``); ``original_max_len``: the context before it (``rope_original_max_len``)."""

    def __init__(self, factor: float = 1.0, original_max_len: int | None = None) -> None:
        self.factor, self.original_max_len = factor, original_max_len

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Raise ConfigError for settings this scaling cannot work with (RoPE.check calls it)."""
        if not cfg.rope_scaling_factor >= 1.0:  # NaN too
            raise ConfigError(f"rope_scaling_factor={cfg.rope_scaling_factor} must be >= 1 (the context extension)")

    def base(self, base: float, head_dim: int) -> float:
        return base

    def inv_freq(self, inv_freq: Tensor, base: float, head_dim: int) -> Tensor:
        """The frequencies (hd/2,) of pairs that turn ``inv_freq`` rad per position without scaling."""
        return inv_freq

    def positions(self, pos: Tensor) -> Tensor:
        return pos

    @property
    def attention_factor(self) -> float:  # multiplies cos and sin, so q.k by its square
        return 1.0


ROPE_SCALINGS: Registry[type[RopeScaling]] = Registry("rope_scaling")


@ROPE_SCALINGS.register("none")
class NoScaling(RopeScaling):
    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """The rotation as trained: nothing to check (``rope_scaling_factor`` is not read)."""


@ROPE_SCALINGS.register("linear")
class LinearScaling(RopeScaling):
    """Chen et al. 2023, position interpolation (https://arxiv.org/abs/2306.15595): positions / factor."""

    def positions(self, pos: Tensor) -> Tensor:
        return pos * (1.0 / self.factor)


@ROPE_SCALINGS.register("ntk")
class NTKScaling(RopeScaling):
    """bloc97's NTK-aware base, base * factor^(hd/(hd-2)): the lowest frequency / factor, the highest kept."""

    def base(self, base: float, head_dim: int) -> float:
        return base * self.factor ** (head_dim / (head_dim - 2))


@ROPE_SCALINGS.register("yarn")
class YaRN(RopeScaling):
    """Peng et al. 2023, "YaRN" (https://arxiv.org/abs/2309.00071), sec. 3.2 and 3.4. NTK-by-parts: a
    pair that turns r = L / wavelength times over the original context L keeps its frequency when
    r > beta_fast, is divided by the factor when r < beta_slow, and in between is blended along a
    linear ramp over the pair index. Attention temperature: cos and sin times 0.1 ln(factor) + 1."""

    beta_fast: ClassVar[float] = 32.0  # the paper's beta for Llama (its alpha is beta_slow)
    beta_slow: ClassVar[float] = 1.0

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        super().check(cfg)
        if cfg.rope_original_max_len is None:
            raise ConfigError("rope_scaling='yarn' needs rope_original_max_len, the context length trained at")

    def _pair(self, rotations: float, base: float, head_dim: int) -> float:
        """The (fractional) pair index i whose wavelength 2 pi base^(2i/hd) fits ``rotations`` times in L."""
        return head_dim * math.log(self.original_max_len / (2 * math.pi * rotations)) / (2 * math.log(base))

    def inv_freq(self, inv_freq: Tensor, base: float, head_dim: int) -> Tensor:
        low = max(math.floor(self._pair(self.beta_fast, base, head_dim)), 0)
        high = min(math.ceil(self._pair(self.beta_slow, base, head_dim)), head_dim - 1)
        i = torch.arange(inv_freq.shape[0], device=inv_freq.device, dtype=torch.float32)
        ramp = ((i - low) / ((high - low) or 1e-3)).clamp(0, 1)  # (hd/2,) 0: kept, 1: interpolated
        return inv_freq * (1 - ramp * (1 - 1 / self.factor))  # = (1 - ramp) * inv_freq + ramp * inv_freq / factor

    @property
    def attention_factor(self) -> float:
        return 0.1 * math.log(self.factor) + 1.0 if self.factor > 1 else 1.0
