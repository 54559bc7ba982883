"""Reading attention probabilities out of a model, and what to compute from them.

- :func:`capture_attention`: every layer's probabilities (B, H, Tq, Tk), by module name.
- :func:`attention_rollout`: how much each input token flows into each position through a stack
  (Abnar & Zuidema 2020, https://arxiv.org/abs/2005.00928).
- :func:`row_entropy`: entropy of each row, normalised by what the row may see (causal masks!).
- :func:`head_stats`: per-head entropy and where the mass goes (first token, own position, previous
  position), with :meth:`HeadStats.flags` naming "flat", "sink", "diagonal" and "previous" heads.

Notation: B batch, H heads, Tq/Tk query/key lengths, T = Tq = Tk for self-attention, L layers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.attention import Attention

KINDS = ("encoder self", "decoder self", "cross")


@contextmanager
def capture_attention(model: nn.Module) -> Iterator[dict[str, Tensor]]:
    """Run ``model`` on the reference ``math`` kernel and collect every layer's probabilities.

    Yields a dict filled during forward passes inside the block: module name (e.g.
    ``decoder.blocks.0.attn``) -> probabilities (B, H, Tq, Tk), detached. Kernels are restored after.
    """
    captured: dict[str, Tensor] = {}
    layers = {name: m for name, m in model.named_modules() if isinstance(m, Attention)}
    kernels = {name: m.kernel for name, m in layers.items()}
    handles = []
    for name, layer in layers.items():
        layer.kernel = "math"
        handles.append(
            layer.probe.register_forward_hook(lambda _m, _inp, out, name=name: captured.__setitem__(name, out.detach()))
        )
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()
        for name, layer in layers.items():
            layer.kernel = kernels[name]


def attention_kind(name: str) -> str:
    """The kind of an attention module by its name in a zoo model: "encoder self" for
    ``encoder.blocks.i.attn``, "decoder self" for ``decoder.blocks.i.attn``, "cross" for
    ``decoder.blocks.i.cross_attn``."""
    if name.endswith("cross_attn"):
        return "cross"
    if name.startswith("encoder."):
        return "encoder self"
    if name.startswith("decoder."):
        return "decoder self"
    raise ValueError(f"{name!r} is not an attention module name of a zoo model")


def layers_by_kind(captured: Mapping[str, Tensor]) -> dict[str, list[str]]:
    """Module names grouped by :func:`attention_kind`, each group in layer order (blocks.2 before
    blocks.10); kinds absent from ``captured`` are left out."""

    def layer(name: str) -> int:
        found = re.search(r"\.blocks\.(\d+)\.", name)
        return int(found.group(1)) if found else -1

    groups: dict[str, list[str]] = {}
    for name in sorted(captured, key=layer):
        groups.setdefault(attention_kind(name), []).append(name)
    return {kind: groups[kind] for kind in KINDS if kind in groups}


def attention_rollout(layers: Sequence[Tensor], *, residual: bool = True) -> Tensor:
    """Attention rollout through a stack of self-attention layers (Abnar & Zuidema 2020).

    Each layer's heads are averaged; with ``residual`` the identity is added for the skip connection
    and rows renormalised (A' = (A + I) / 2, the paper's 0.5 W_att + 0.5 I); the layers are then
    multiplied from the first up: R = A'_L ... A'_1. Row i of R says how much position i at the top
    of the stack draws from each input token; rows sum to 1, and a causal stack gives a lower
    triangular R.

    Only square (self-attention) maps make sense here. Cross-attention mixes in a different
    sequence, so callers roll out each stack's self-attention on its own (encoder; decoder self)
    and look at cross-attention per layer.

    Args:
        layers: per layer, first to last, probabilities (B, H, T, T) or (H, T, T).
        residual: add the identity for the residual stream (the paper's choice); False multiplies
            the raw head-averaged maps.

    Returns:
        (B, T, T), or (T, T) for unbatched input.
    """
    if not layers:
        raise ValueError("attention_rollout needs at least one layer")
    rollout: Tensor | None = None
    for probs in layers:
        if probs.shape[-1] != probs.shape[-2]:
            raise ValueError(f"rollout needs square self-attention maps; got {tuple(probs.shape)}")
        a = probs.float().mean(dim=-3)  # (B, T, T): heads averaged
        if residual:
            a = a + torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
            a = a / a.sum(dim=-1, keepdim=True)
        rollout = a if rollout is None else a @ rollout  # (B, T, T)
    assert rollout is not None
    return rollout


@dataclass
class HeadStats:
    """Per-head summaries of one attention layer, each (H,), averaged over the batch and over
    query rows (rows where a summary is undefined are left out, see :func:`head_stats`)."""

    entropy: Tensor  # mean row entropy, nats (rows that see one key left out)
    norm_entropy: Tensor  # mean of entropy / log(visible keys): 1 = uniform over what the row may see
    first_mass: Tensor  # mean probability on key 0 (the first token)
    self_mass: Tensor  # mean probability on the query's own position; NaN for cross-attention
    prev_mass: Tensor  # mean probability on the previous position; NaN for cross-attention

    def flags(self, *, flat: float = 0.9, sink: float = 0.5, diagonal: float = 0.5) -> list[list[str]]:
        """Names for notable heads, one list per head.

        - "flat": ``norm_entropy > flat`` — near-uniform attention, a symptom of too little
          training or of inputs past the trained length.
        - "sink": ``first_mass > sink`` — most mass parked on the first token.
        - "diagonal" / "previous": ``self_mass`` / ``prev_mass > diagonal`` — the head mostly
          looks at the query's own / the previous position.
        """
        out = []
        for h in range(len(self.entropy)):
            names = []
            if self.norm_entropy[h] > flat:
                names.append("flat")
            if self.first_mass[h] > sink:
                names.append("sink")
            if self.self_mass[h] > diagonal:
                names.append("diagonal")
            if self.prev_mass[h] > diagonal:
                names.append("previous")
            out.append(names)
        return out


def row_entropy(probs: Tensor, visible: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Entropy of each attention row, in nats and normalised by the largest it can be.

    The largest is log(number of keys the row may see): under a causal mask row i sees i + 1 keys,
    so uniform causal attention has normalised entropy 1 on every row and one-hot attention 0. A
    row that sees a single key has no choice to make; its normalised entropy is NaN.

    Args:
        probs: (B, H, Tq, Tk) probabilities, rows summing to 1.
        visible: bool, broadcastable to (B, 1, Tq, Tk): which keys each query may see. Default: a key
            is visible where any head gives it nonzero probability (masked keys get exactly 0
            from the softmax; an underflow in every head at once is not expected).

    Returns:
        entropy, normalised entropy: each (B, H, Tq).
    """
    B, H, Tq, Tk = probs.shape
    if visible is None:
        visible = (probs > 0).any(dim=1, keepdim=True)  # (B, 1, Tq, Tk)
    n_visible = visible.expand(B, 1, Tq, Tk).sum(dim=-1).float()  # (B, 1, Tq)
    probs = probs.float()
    entropy = -torch.xlogy(probs, probs).sum(dim=-1)  # (B, H, Tq); 0 log 0 = 0
    normalised = (entropy / n_visible.log()).masked_fill(n_visible <= 1, math.nan)  # (B, H, Tq)
    return entropy, normalised


def head_stats(probs: Tensor, *, visible: Tensor | None = None, self_attention: bool = True) -> HeadStats:
    """Entropy and mass placement of each head of one layer (see :class:`HeadStats`).

    Rows that see a single key (the first one under a causal mask) are left out of the entropy
    and first-token means: they put everything on key 0 by force. Row 0 is left out of
    ``prev_mass``.

    Args:
        probs: (B, H, Tq, Tk) or (H, Tq, Tk) probabilities, rows summing to 1.
        visible: which keys each query may see, as in :func:`row_entropy`.
        self_attention: False for cross-attention (no own / previous position: those are NaN).
    """
    if probs.dim() == 3:
        probs = probs.unsqueeze(0)  # (1, H, Tq, Tk)
    probs = probs.float()
    B, H, Tq, Tk = probs.shape
    entropy, normalised = row_entropy(probs, visible)  # (B, H, Tq) each
    informative = ~normalised.isnan()  # (B, H, Tq): rows with a choice to make

    def mean_over_rows(x: Tensor, keep: Tensor) -> Tensor:  # (B, H, Tq) -> (H,), NaN when no row kept
        keep = keep.float()
        return (x.nan_to_num() * keep).sum(dim=(0, 2)) / keep.sum(dim=(0, 2))

    nan = torch.full((H,), math.nan)
    if self_attention and Tq == Tk:
        diag = probs.diagonal(dim1=-2, dim2=-1)  # (B, H, T)
        prev = F.pad(probs.diagonal(offset=-1, dim1=-2, dim2=-1), (1, 0))  # (B, H, T); row 0 has none
        has_prev = torch.ones_like(prev, dtype=torch.bool)
        has_prev[..., 0] = False
        self_mass = mean_over_rows(diag, torch.ones_like(has_prev))
        prev_mass = mean_over_rows(prev, has_prev)
    else:
        self_mass, prev_mass = nan, nan.clone()
    return HeadStats(
        entropy=mean_over_rows(entropy, informative),
        norm_entropy=mean_over_rows(normalised, informative),
        first_mass=mean_over_rows(probs[..., 0], informative),
        self_mass=self_mass,
        prev_mass=prev_mass,
    )
