"""Normalisation layers (``norm``) and where they sit around each sublayer (``norm_placement``).

A placement wraps one sublayer ``f`` with its residual connection:

- ``pre``      x + f(norm(x))                      GPT-2, Llama, T5 (final norm after the stack)
- ``post``     norm(x + f(x))                      Vaswani et al., BERT (norm after the embeddings)
- ``sandwich`` x + norm_out(f(norm_in(x)))         Ding et al. 2021 (CogView), Gemma 2
- ``deepnorm`` norm(alpha * x + f(x)), beta-scaled init  Wang et al. 2022 (DeepNet)
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
    def from_config(cls, cfg: ModelConfig, *, cross: bool = False) -> Placement:
        """``cross``: the block attends over an encoder's output too, i.e. it is in the decoder of an
        encoder-decoder; with ``cfg.form`` it tells which stack the placement serves."""
        return cls(build_norm(cfg))

    def init_gain(self) -> float | None:
        """The factor init multiplies the wrapped sublayer's value weights by (``Sublayer.value_weights``),
        or None: init scales its residual projections down with depth instead (GPT-2)."""
        return None


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
    def from_config(cls, cfg: ModelConfig, *, cross: bool = False) -> SandwichNorm:
        return cls(build_norm(cfg), build_norm(cfg))

    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        return x + self.norm_out(f(self.norm(x)))


@NORM_PLACEMENT.register("deepnorm")
class DeepNorm(PostNorm):
    """Post-Norm with the residual up-weighted, x_{l+1} = norm(alpha * x_l + f(x_l)), and each
    sublayer's value weights (the FFN, attention's v rows and output projection; not q, k) scaled by
    beta at init in place of GPT-2's depth scaling (Wang et al. 2022, "DeepNet: Scaling Transformers to
    1,000 Layers", https://arxiv.org/abs/2203.00555). The paper's Xavier-normal init with gain beta
    becomes zoo's Normal(0, init_std) times beta. As ``post``, the embeddings are normalised too."""

    def __init__(self, norm: nn.Module, *, alpha: float, beta: float) -> None:
        super().__init__(norm)
        self.alpha, self.beta = alpha, beta

    @classmethod
    def from_config(cls, cfg: ModelConfig, *, cross: bool = False) -> DeepNorm:
        alpha, beta = deepnorm_constants(cfg, cross=cross)
        return cls(build_norm(cfg), alpha=alpha, beta=beta)

    def init_gain(self) -> float:
        return self.beta

    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        return self.norm(self.alpha * x + f(x))

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:.4g}, beta={self.beta:.4g}"


def deepnorm_constants(cfg: ModelConfig, *, cross: bool = False) -> tuple[float, float]:
    """DeepNorm's (alpha, beta) for one stack, by the paper's Figure 2 (https://arxiv.org/abs/2203.00555).
    Encoder-only or decoder-only with N layers: alpha = (2N)^(1/4), beta = (8N)^(-1/4). Encoder-decoder
    with N encoder and M decoder layers: encoder alpha = 0.81 (N^4 M)^(1/16), beta = 0.87 (N^4 M)^(-1/16);
    decoder (``cross``: its blocks attend over the encoder) alpha = (3M)^(1/4), beta = (12M)^(-1/4)."""
    if not cfg.form.cross_attention:
        return (2 * cfg.n_layers) ** 0.25, (8 * cfg.n_layers) ** -0.25
    n, m = cfg.resolved_n_encoder_layers, cfg.resolved_n_decoder_layers
    if cross:
        return (3 * m) ** 0.25, (12 * m) ** -0.25
    depth = (n**4 * m) ** (1 / 16)
    return 0.81 * depth, 0.87 / depth
