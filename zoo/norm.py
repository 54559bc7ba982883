"""Normalisation layers (``norm``) and where they sit around each sublayer (``norm_placement``).

A placement wraps one sublayer ``f`` with its residual connection:

- ``pre``      x + f(norm(x))                      GPT-2, Llama, T5 (final norm after the stack)
- ``post``     norm(x + f(x))                      Vaswani et al., BERT (norm after the embeddings)
- ``sandwich`` x + norm_out(f(norm_in(x)))         Ding et al. 2021 (CogView), Gemma 2
- ``res_post`` x + norm_out(f(x))                   Liu et al. 2022 (Swin V2's res-post-norm), OLMo 2
- ``deepnorm`` norm(alpha * x + f(x)), beta-scaled init  Wang et al. 2022 (DeepNet)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.config import ModelConfig
from zoo.registry import NORM, NORM_PLACEMENT, Component, ConfigError
from zoo.stack_role import LONE, StackRole


class Norm(Component, nn.Module):
    """The base of every registered norm (the ``norm`` registry takes its subclasses only): made by
    ``from_config(cfg, dim)`` over the last dimension, ``dim`` wide."""

    @classmethod
    def from_config(cls, cfg: ModelConfig, dim: int) -> Norm:
        raise NotImplementedError(f"{cls.__name__} must define from_config(cfg, dim)")

    @torch.no_grad()
    def scale_output_(self, factor: float) -> None:
        """Change the parameters so the output is ``factor`` times what it was: how an export folds a
        multiplier that follows this norm (muP's logit and attention factors) into weights. A norm
        whose output is not linear in its parameters cannot, and says so (a ConfigError)."""
        raise ConfigError(
            f"norm {type(self).__name__} cannot fold a multiplier into its weights (it defines no "
            "scale_output_); export this model with format=safetensors"
        )


NORM.bind(Norm)


@NORM.register("layernorm")
class LayerNorm(Norm, nn.LayerNorm):
    """Ba et al. 2016: (x - mean) / std * weight + bias; the bias follows ``cfg.bias``."""

    @classmethod
    def from_config(cls, cfg: ModelConfig, dim: int) -> LayerNorm:
        return cls(dim, eps=cfg.norm_eps, bias=cfg.bias)

    @torch.no_grad()
    def scale_output_(self, factor: float) -> None:
        self.weight.mul_(factor)
        if self.bias is not None:
            self.bias.mul_(factor)


@NORM.register("rmsnorm")
class RMSNorm(Norm):
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

    @torch.no_grad()
    def scale_output_(self, factor: float) -> None:
        self.weight.mul_(factor)

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x.float(), self.weight.shape, eps=self.eps).type_as(x) * self.weight


@NORM.register("rmsnorm_1p")
class RMSNorm1P(RMSNorm):
    """RMSNorm whose gain is stored as an offset from one: x / rms(x) * (1 + weight), weight starting
    at zero, all in float32 (Gemma; Megatron's "1p" norms), so weight decay pulls the gain toward one,
    not zero. It computes what ``rmsnorm`` does with weight + 1."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__(dim, eps)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)

    @torch.no_grad()
    def scale_output_(self, factor: float) -> None:
        self.weight.copy_((1.0 + self.weight.float()) * factor - 1.0)

    def forward(self, x: Tensor) -> Tensor:
        return (F.rms_norm(x.float(), self.weight.shape, eps=self.eps) * (1.0 + self.weight.float())).type_as(x)


@NORM.register("dyt")
class DyT(Norm):
    """Dynamic Tanh, weight * tanh(alpha * x) + bias, in place of a norm: element-wise, no statistics
    over the features; alpha is one learnable scalar that starts at ``cfg.dyt_alpha`` (Zhu et al. 2025,
    "Transformers without Normalization", https://arxiv.org/abs/2503.10622, Algorithm 1). The bias
    follows ``cfg.bias``, as LayerNorm's; ``norm_eps`` has nothing to act on."""

    reads: ClassVar[frozenset[str]] = frozenset({"dyt_alpha"})  # zoo.registry.reads

    def __init__(self, dim: int, *, alpha: float = 0.5, bias: bool = True) -> None:
        super().__init__()
        self.alpha_init = alpha
        self.alpha = nn.Parameter(torch.empty(1))
        self.weight = nn.Parameter(torch.empty(dim))
        self.bias = nn.Parameter(torch.empty(dim)) if bias else None
        self.reset_parameters()

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Raise ConfigError for a starting slope that is not positive (ModelConfig.validate calls it)."""
        if not cfg.dyt_alpha > 0:
            raise ConfigError(f"dyt_alpha={cfg.dyt_alpha} must be > 0 (the paper starts alpha at 0.5)")

    @classmethod
    def from_config(cls, cfg: ModelConfig, dim: int) -> DyT:
        return cls(dim, alpha=cfg.dyt_alpha, bias=cfg.bias)

    def reset_parameters(self) -> None:
        """The paper's init: alpha = its starting value, weight 1, bias 0 (zoo's init_weights calls it)."""
        nn.init.constant_(self.alpha, self.alpha_init)
        nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    @torch.no_grad()
    def scale_output_(self, factor: float) -> None:
        self.weight.mul_(factor)
        if self.bias is not None:
            self.bias.mul_(factor)

    def forward(self, x: Tensor) -> Tensor:
        y = torch.tanh(self.alpha * x) * self.weight
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, alpha_init={self.alpha_init:g}, bias={self.bias is not None}"


def build_norm(cfg: ModelConfig, dim: int | None = None) -> nn.Module:
    return NORM.get(cfg.norm, field="norm").from_config(cfg, cfg.d_model if dim is None else dim)


Sublayer = Callable[[Tensor], Tensor]


class Placement(Component, nn.Module):
    """Base of the residual wrappers. Class flags say where the stack needs extra norms."""

    embedding_norm: ClassVar[bool] = False  # normalise the embeddings before the first block
    final_norm: ClassVar[bool] = False  # normalise the output of the last block
    reads: ClassVar[frozenset[str]] = frozenset()  # the component settings it reads (zoo.registry.reads)

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Raise ConfigError for settings this placement cannot work with (ModelConfig.validate calls it)."""

    @classmethod
    def from_config(cls, cfg: ModelConfig, *, role: StackRole = LONE) -> Placement:
        """The placement of one sublayer of a block in a stack in ``role`` (which of a form's stacks it is)."""
        return cls(build_norm(cfg))

    @classmethod
    def normalises_embeddings(cls, cfg: ModelConfig) -> bool:
        """Whether the stack normalises the embeddings before the first block (the class's ``embedding_norm``)."""
        return cls.embedding_norm

    @classmethod
    def first_attention(cls, cfg: ModelConfig, *, role: StackRole = LONE) -> Placement:
        """The placement of the first block's self-attention: ``from_config``'s, unless a setting sets it apart."""
        return cls.from_config(cfg, role=role)

    def init_gain(self) -> float | None:
        """The factor init multiplies the wrapped sublayer's value weights by (``Sublayer.value_weights``),
        or None: init scales its residual projections down with depth instead (GPT-2)."""
        return None


NORM_PLACEMENT.bind(Placement)


@NORM_PLACEMENT.register("pre")
class PreNorm(Placement):
    """x + f(norm(x)). With ``embedding_norm`` the embeddings are normalised before the first block,
    which the residual stream then carries, and the first attention takes them as they are, x + f(x)
    (ModernBERT, Warner et al. 2024, https://arxiv.org/abs/2412.13663: its first ``attn_norm`` is an Identity)."""

    final_norm = True
    reads = frozenset({"embedding_norm"})

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    @classmethod
    def normalises_embeddings(cls, cfg: ModelConfig) -> bool:
        return cfg.embedding_norm

    @classmethod
    def first_attention(cls, cfg: ModelConfig, *, role: StackRole = LONE) -> PreNorm:
        return cls(nn.Identity()) if cfg.embedding_norm else cls.from_config(cfg, role=role)

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
    def from_config(cls, cfg: ModelConfig, *, role: StackRole = LONE) -> SandwichNorm:
        return cls(build_norm(cfg), build_norm(cfg))

    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        return x + self.norm_out(f(self.norm(x)))


@NORM_PLACEMENT.register("res_post")
class ResPostNorm(Placement):
    """The sublayer's output normalised before it joins the residual stream, which itself is never
    normalised until the final norm: x + norm_out(f(x)) (Liu et al. 2022, "Swin Transformer V2",
    https://arxiv.org/abs/2111.09883, res-post-norm; OLMo 2's reordered norm)."""

    final_norm = True

    def __init__(self, norm_out: nn.Module) -> None:
        super().__init__()
        self.norm_out = norm_out

    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        return x + self.norm_out(f(x))


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
    def from_config(cls, cfg: ModelConfig, *, role: StackRole = LONE) -> DeepNorm:
        alpha, beta = deepnorm_constants(cfg, role)
        return cls(build_norm(cfg), alpha=alpha, beta=beta)

    def init_gain(self) -> float:
        return self.beta

    def forward(self, x: Tensor, f: Sublayer) -> Tensor:
        return self.norm(self.alpha * x + f(x))

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:.4g}, beta={self.beta:.4g}"


def deepnorm_constants(cfg: ModelConfig, role: StackRole) -> tuple[float, float]:
    """DeepNorm's (alpha, beta) for one stack, by the paper's Figure 2 (https://arxiv.org/abs/2203.00555).
    Encoder-only or decoder-only with N layers: alpha = (2N)^(1/4), beta = (8N)^(-1/4). Encoder-decoder
    with N encoder and M decoder layers: encoder alpha = 0.81 (N^4 M)^(1/16), beta = 0.87 (N^4 M)^(-1/16);
    decoder alpha = (3M)^(1/4), beta = (12M)^(-1/4). ``role`` says which stack (zoo.stack_role)."""
    if not role.paired:
        return (2 * cfg.n_layers) ** 0.25, (8 * cfg.n_layers) ** -0.25
    n, m = cfg.resolved_n_encoder_layers, cfg.resolved_n_decoder_layers
    if role.cross:
        return (3 * m) ** 0.25, (12 * m) ** -0.25
    depth = (n**4 * m) ** (1 / 16)
    return 0.81 * depth, 0.87 / depth
