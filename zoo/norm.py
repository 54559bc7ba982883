"""Normalisation layers (``norm``) and where they sit around each sublayer (``norm_placement``).

A placement wraps one sublayer ``f`` with its residual connection:

- ``pre``      x + f(norm(x))                      GPT-2, Llama, T5 (final norm after the stack)
- ``post``     norm(x + f(x))                      Vaswani et al., BERT (norm after the embeddings)
- ``sandwich`` x + norm_out(f(norm_in(x)))         Ding et al. 2021 (CogView), Gemma 2
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.config import ModelConfig
from zoo.registry import NORM, NORM_PLACEMENT


@NORM.register("layernorm")
class LayerNorm(nn.LayerNorm):
    """Ba et al. 2016: (x - mean) / std * weight + bias; the bias follows ``cfg.bias``."""

    @classmethod
    def from_config(cls, cfg: ModelConfig, dim: int) -> LayerNorm:
        return cls(dim, eps=cfg.norm_eps, bias=cfg.bias)


@NORM.register("rmsnorm")
class RMSNorm(nn.Module):
    """Zhang & Sennrich 2019: x / sqrt(mean(x^2) + eps) * weight, computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    @classmethod
    def from_config(cls, cfg: ModelConfig, dim: int) -> RMSNorm:
        return cls(dim, eps=cfg.norm_eps)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x.float(), self.weight.shape, eps=self.eps).type_as(x) * self.weight


def build_norm(cfg: ModelConfig, dim: int | None = None) -> nn.Module:
    return NORM.get(cfg.norm, field="norm").from_config(cfg, cfg.d_model if dim is None else dim)


Sublayer = Callable[[Tensor], Tensor]


class Placement(nn.Module):
    """Base of the residual wrappers. Class flags say where the stack needs extra norms."""

    embedding_norm: ClassVar[bool] = False  # normalise the embeddings before the first block
    final_norm: ClassVar[bool] = False  # normalise the output of the last block
    reads: ClassVar[frozenset[str]] = frozenset()  # the component settings it reads (zoo.registry.reads)

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Raise ConfigError for settings this placement cannot work with (ModelConfig.validate calls it)."""

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> Placement:
        return cls(build_norm(cfg))


@NORM_PLACEMENT.register("pre")
class PreNorm(Placement):
    final_norm = True

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        return x + f(self.norm(x))


@NORM_PLACEMENT.register("post")
class PostNorm(Placement):
    embedding_norm = True

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        return self.norm(x + f(x))


@NORM_PLACEMENT.register("sandwich")
class SandwichNorm(Placement):
    final_norm = True

    def __init__(self, norm: nn.Module, norm_out: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.norm_out = norm_out

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> SandwichNorm:
        return cls(build_norm(cfg), build_norm(cfg))

    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        return x + self.norm_out(f(self.norm(x)))
