"""The declared base of what a block holds in its residual branches (attention, FFN).

Code that changes a model from outside (init, LoRA, a quantizer) asks a sublayer through these hooks
instead of testing its class or looking for attributes by name, so a new component takes part by
overriding them.
"""

from __future__ import annotations

from torch import nn


class Sublayer(nn.Module):
    """A residual branch of a block: :class:`zoo.attention.Attention`, :class:`zoo.ffn.MLP`."""

    def residual_projections(self) -> list[nn.Linear]:
        """The layers that write into the residual stream (init scales them down with depth)."""
        return []

    def fused_segments(self) -> dict[str, list[tuple[str, int]]]:
        """Linear layers (by attribute) that compute several projections in one matmul -> their named
        row blocks in order, e.g. ``{"qkv": [("q", 512), ("k", 128), ("v", 128)]}``. An adapter adapts
        each block alone (LoRA's ``targets=[q, v]``); a layer not named here is one segment."""
        return {}
