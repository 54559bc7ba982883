"""Attention kernels (``attention=<name>``): registered :class:`AttentionKernel` classes that compute
softmax(q k^T * scale + mask) v; zoo.attention's layers ask theirs.

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

Soft-capping (``attn_softcap`` = c, Gemma 2) bends each scaled score s to c * tanh(s / c) before the
mask and position bias are added. SDPA has no hook for it and refuses such a model when it is
composed; ``math`` caps its scores, ``flex`` caps them in its ``score_mod`` (:func:`softcapped`), and
``auto`` runs the forwards it would give to sdpa on ``math`` instead.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.config import ModelConfig
from zoo.registry import ATTENTION, Component, ConfigError
from zoo.rules import ScoreMod

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask


class Scoring(NamedTuple):
    """What a kernel needs besides q, k, v (a tuple: one is made per layer and step)."""

    mask: Tensor | None  # bool (True = attend) or float (added to scores), broadcast to (B, H, Tq, Tk)
    is_causal: bool  # the plain causal mask over Tq == Tk, left to the kernel
    scale: float  # multiplies q k^T
    dropout_p: float  # on the probabilities
    probe: nn.Module  # where kernels that form the probabilities pass them (Attention.probe)
    softcap: float | None = None  # scores -> softcap * tanh(scores / softcap) before the mask (attn_softcap)


class AttentionKernel(Component):
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


def softcapped(score_mod: ScoreMod | None, cap: float) -> ScoreMod:
    """A flex ``score_mod`` that caps the scaled score, cap * tanh(score / cap), then applies ``score_mod``
    (a position bias) to it: the order in which ``math`` caps, then adds the bias and mask."""

    def capped(score: Tensor, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        score = cap * torch.tanh(score / cap)
        return score if score_mod is None else score_mod(score, b, h, q, kv)

    return capped


ATTENTION.bind(AttentionKernel)


@ATTENTION.register("sdpa")
class SDPA(AttentionKernel):
    """``F.scaled_dot_product_attention``: flash / memory-efficient kernels on GPU, flash on the CPU."""

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """SDPA computes softmax(q k^T * scale + mask) and nothing between: no soft-capping."""
        if cfg.attn_softcap is not None:
            raise ConfigError(
                f"attention={cfg.attention} cannot soft-cap attention scores (attn_softcap={cfg.attn_softcap}): "
                "choose attention=math (any device), flex or auto"
            )

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


def run_flex(
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
        if how.softcap is not None:
            score_mod = softcapped(score_mod, how.softcap)
        return run_flex(q, k, v, score_mod, block_mask, scale=how.scale, dropout_p=how.dropout_p)


@ATTENTION.register("auto")
class Auto(SDPA):
    """``sdpa`` for the forwards that :func:`flex_applies` leaves to it; the others come as FlexMods.
    With soft-capped scores (which sdpa cannot compute) the forwards left to sdpa run on ``math``."""

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Auto computes everything: a soft-capped model runs on math where it would have run on sdpa."""

    @staticmethod
    def attend(q: Tensor, k: Tensor, v: Tensor, how: Scoring) -> Tensor:
        return (SDPA if how.softcap is None else Math).attend(q, k, v, how)

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
        if how.softcap is not None:
            scores = how.softcap * torch.tanh(scores / how.softcap)
        mask = how.mask
        if how.is_causal:
            mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        probs = how.probe(scores.softmax(dim=-1))  # (B, H, Tq, Tk)
        probs = F.dropout(probs, p=how.dropout_p)
        return probs.type_as(v) @ v  # (B, H, Tq, hd)
