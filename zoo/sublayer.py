"""The declared base of what a block holds in its residual branches (attention, FFN).

Code that changes a model from outside (init, LoRA, a quantizer, tensor parallelism) asks a sublayer
through these hooks instead of testing its class or looking for attributes by name, so a new component
takes part by overriding them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor, nn

from zoo.registry import FFN, Component


@dataclass(frozen=True)
class TensorSplit:
    """How tensor parallelism (``trainer=tp``, tasks.parallel.plan) splits a sublayer over the N ranks of
    a group, as Megatron-LM splits attention and the MLP (Shoeybi et al. 2019,
    https://arxiv.org/abs/1909.08053, section 3): a column-parallel layer feeds a row-parallel one, so
    each rank computes its share of the units between them alone."""

    column_parallel: dict[str, tuple[int, ...]]
    """Linear children (by attribute) cut along their output features, each segment of a fused layer
    apart: attribute -> its segments' sizes in order (``fused_segments``; one segment if not fused)."""
    row_parallel: tuple[str, ...]
    """Linear children cut along their input features, whose partial outputs are summed over the ranks."""
    sizes: dict[str, int]
    """What each rank holds 1/N of, by the ModelConfig field that sets it: N must divide each."""
    sums_own: bool = False
    """Its parameters outside its Linear children (qk_norm, value_residual) are whole on every rank and
    meet only this rank's share, so their gradients are summed over the ranks; False: it has none."""


class Sublayer(Component, nn.Module):
    """A residual branch of a block: :class:`zoo.attention.Attention`, :class:`zoo.ffn.MLP`."""

    score_segments: ClassVar[frozenset[str]] = frozenset({"q", "k"})  # rows that only form attention scores
    # True: forward takes keep=, the (B, T) keep-mask of the new positions (None: nothing padded), as
    # Block.forward passes it from AttentionInputs.keep (an MoE router's losses skip the padding)
    reads_padding: ClassVar[bool] = False
    splits_by_tensor: ClassVar[bool] = False  # True: ``tensor_split`` says how trainer=tp splits it

    def residual_projections(self) -> list[nn.Linear]:
        """The layers that write into the residual stream (init scales them down with depth)."""
        return []

    def mup_matrices(self) -> dict[str, list[Tensor]]:
        """Its weight matrices by muP role (zoo.zoo_model.ZooModel.mup_groups): ``hidden``, both
        dimensions growing with the width (init std and Adam lr times sqrt(base/width) and base/width),
        or ``readout``, the input dimension growing and the output fixed (an MoE's router: std and lr
        times base/width). By default every parameter of two or more dimensions is hidden; vectors
        (biases, norms, value_residual's lambda) have no role: muP leaves them as they are."""
        return {"hidden": [p for p in self.parameters() if p.ndim >= 2]}

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

    def tensor_split(self) -> TensorSplit | None:
        """How tensor parallelism splits this sublayer over its ranks; None (the default): it cannot be
        split (an MoE's stacked experts, a sublayer whose own weights would see one rank's units)."""
        return None

    def linear_split(self, sizes: dict[str, int], *, sums_own: bool = False) -> TensorSplit:
        """The TensorSplit of a sublayer that is its Linear children: the residual projections
        row-parallel, every other one column-parallel by its ``fused_segments``."""
        fused, outputs = self.fused_segments(), {id(m) for m in self.residual_projections()}
        columns: dict[str, tuple[int, ...]] = {}
        rows: list[str] = []
        for attr, child in self.named_children():
            if not isinstance(child, nn.Linear):
                continue
            if id(child) in outputs:
                rows.append(attr)
            else:
                columns[attr] = tuple(size for _, size in fused.get(attr, [(attr, child.out_features)]))
        return TensorSplit(columns, tuple(rows), sizes, sums_own)

    def keep_share(self, degree: int) -> None:
        """Count what this rank holds once tensor parallelism has cut this sublayer's layers to 1/``degree``
        of the ``sizes`` of its TensorSplit (attention: its heads); the default counts nothing."""

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
