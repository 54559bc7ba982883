"""The declared base of what a block holds in its residual branches (attention, FFN).

Code that changes a model from outside (init, LoRA, a quantizer) asks a sublayer through these hooks
instead of testing its class or looking for attributes by name, so a new component takes part by
overriding them.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn

from zoo.registry import FFN, Component


class Sublayer(Component, nn.Module):
    """A residual branch of a block: :class:`zoo.attention.Attention`, :class:`zoo.ffn.MLP`."""

    score_segments: ClassVar[frozenset[str]] = frozenset({"q", "k"})  # rows that only form attention scores
    # True: forward takes keep=, the (B, T) keep-mask of the new positions (None: nothing padded), as
    # Block.forward passes it from AttentionInputs.keep (an MoE router's losses skip the padding)
    reads_padding: ClassVar[bool] = False

    def residual_projections(self) -> list[nn.Linear]:
        """The layers that write into the residual stream (init scales them down with depth)."""
        return []

    def inactive_parameters(self) -> int:
        """Parameters that one token does not use (an MoE's unchosen experts); ``zoo.stats`` counts
        the rest as active."""
        return 0

    def adapter_note(self) -> str:
        """What an adapter's refusal adds when a target selects no layer: how to reach this sublayer's
        weights that are not ``nn.Linear`` layers (an MoE's stacked experts), or "" when all are."""
        return ""

    def aux_losses(self) -> dict[str, Tensor]:
        """Auxiliary training losses of this sublayer's last forward, already weighted, by name (an MoE
        router's load-balancing and z-losses); ``ZooModel.aux_losses`` sums them over the layers."""
        return {}

    def fused_segments(self) -> dict[str, list[tuple[str, int]]]:
        """Linear layers (by attribute) that compute several projections in one matmul -> their named
        row blocks in order, e.g. ``{"qkv": [("q", 512), ("k", 128), ("v", 128)]}``. An adapter adapts
        each block alone (LoRA's ``targets=[q, v]``); a layer not named here is one segment."""
        return {}

    def value_weights(self) -> list[Tensor]:
        """The weights that carry values into the residual stream, as views of row blocks: every
        Linear child's rows except the segments named in ``score_segments`` (a layer that
        ``fused_segments`` does not name is one segment, named by its attribute: cross-attention's
        ``q``). For attention that is v and the output projection; for an FFN, all of it. DeepNorm
        scales them at init (zoo.norm.DeepNorm)."""
        fused = self.fused_segments()
        weights = []
        for attr, child in self.named_children():
            if not isinstance(child, nn.Linear):
                continue
            start = 0
            for name, rows in fused.get(attr, [(attr, child.out_features)]):
                if name not in self.score_segments:
                    weights.append(child.weight[start : start + rows])  # (rows, in)
                start += rows
        return weights


class FeedForward(Sublayer):
    """The base of every registered FFN (the ``ffn`` registry takes its subclasses only): a dense MLP or
    GLU (zoo.ffn), or a mixture of experts (zoo.moe)."""

    gated: ClassVar[bool] = False  # a GLU: its default width is 2/3 of the plain MLP's (resolved_d_ff)


FFN.bind(FeedForward)
