"""Position-wise feed-forward networks (``ffn``).

- ``relu``, ``gelu``: W2 act(W1 x + b1) + b2, hidden 4*d_model (Vaswani et al.; Hendrycks & Gimpel).
- ``relu2``: the same MLP with act(x) = relu(x)^2 (So et al. 2021, "Primer",
  https://arxiv.org/abs/2109.08668).
- ``swiglu``, ``geglu``: W2 (act(W_gate x) * W_up x) (Shazeer 2020, "GLU Variants Improve
  Transformer"); hidden 2/3 * 4 * d_model rounded up to ``ffn_multiple_of`` so the parameter count
  matches the plain MLP. Gate and up projections are one fused matmul.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import ClassVar

import torch.nn.functional as F
from torch import Tensor, nn

from zoo.config import ModelConfig
from zoo.registry import FFN
from zoo.sublayer import FeedForward, TensorSplit

Activation = Callable[[Tensor], Tensor]


class MLP(FeedForward):
    reads: ClassVar[frozenset[str]] = frozenset()  # the component settings it reads (zoo.registry.reads)
    splits_by_tensor = True

    def __init__(self, d_model: int, d_ff: int, *, act: Activation, bias: bool) -> None:
        super().__init__()
        self.act = act
        self.fc = nn.Linear(d_model, d_ff, bias=bias)
        self.proj = nn.Linear(d_ff, d_model, bias=bias)

    activation: ClassVar[Callable[[ModelConfig], Activation]]  # set by each registered subclass

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Raise ConfigError for settings this FFN cannot work with (ModelConfig.validate calls it)."""

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> MLP:
        return cls(cfg.d_model, cfg.resolved_d_ff, act=cls.activation(cfg), bias=cfg.bias)

    def residual_projections(self) -> list[nn.Linear]:
        return [self.proj]

    def tensor_split(self) -> TensorSplit:
        """``fc`` column-parallel (a GLU's gate and up rows cut alike, so each rank's units keep their
        pairs), ``proj`` row-parallel: each rank its d_ff/N units."""
        return self.linear_split({"d_ff": self.proj.in_features})

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(x)))


class GLU(MLP):
    gated = True

    def __init__(self, d_model: int, d_ff: int, *, act: Activation, bias: bool) -> None:
        super().__init__(d_model, d_ff, act=act, bias=bias)
        self.fc = nn.Linear(d_model, 2 * d_ff, bias=bias)  # [gate; up]

    def fused_segments(self) -> dict[str, list[tuple[str, int]]]:
        half = self.fc.out_features // 2
        return {"fc": [("gate", half), ("up", half)]}

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.fc(x).chunk(2, dim=-1)  # (B, T, d_ff) each
        return self.proj(self.act(gate) * up)


def _gelu(cfg: ModelConfig) -> Activation:
    return partial(F.gelu, approximate=cfg.gelu_approximate)


def relu2(x: Tensor) -> Tensor:
    """Squared ReLU, relu(x)^2 (So et al. 2021, "Primer", https://arxiv.org/abs/2109.08668)."""
    return F.relu(x).square()


@FFN.register("relu")
class ReLUMLP(MLP):
    activation = staticmethod(lambda cfg: F.relu)


@FFN.register("gelu")
class GELUMLP(MLP):
    activation = staticmethod(_gelu)
    reads = frozenset({"gelu_approximate"})


@FFN.register("relu2")
class ReLU2MLP(MLP):
    activation = staticmethod(lambda cfg: relu2)


@FFN.register("swiglu")
class SwiGLU(GLU):
    activation = staticmethod(lambda cfg: F.silu)


@FFN.register("geglu")
class GeGLU(GLU):
    activation = staticmethod(_gelu)
    reads = frozenset({"gelu_approximate"})
