"""The plan of tensor parallelism (``trainer=tp``): per block, which Linear layers of each sublayer are
cut by column and which by row, what each rank holds 1/N of (heads, FFN width), and which whole
parameters meet only this rank's share and so have their gradients summed over the group. It is read
from what the sublayers declare (``zoo.sublayer.Sublayer.tensor_split``), once per model, by both the
split (tasks.parallel.layers) and its checks, which refuse what cannot be split in one line that names
the field and the fix. The layers and the communication: tasks.parallel.layers."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

import zoo
from zoo.registry import FFN
from zoo.sublayer import Sublayer, TensorSplit


def whole_parameters(sublayer: nn.Module) -> list[nn.Parameter]:
    """The parameters of ``sublayer`` outside its Linear children (sharded or not)."""
    linear = {id(p) for m in sublayer.children() if isinstance(m, nn.Linear) for p in m.parameters()}
    return [p for p in sublayer.parameters() if id(p) not in linear]


@dataclass(frozen=True, eq=False)
class SublayerPlan:
    """One residual branch and its declaration (``split``: None when it cannot be split)."""

    sublayer: Sublayer
    split: TensorSplit | None

    def row_biases(self) -> list[nn.Parameter]:
        """The biases of its row-parallel layers (whole on every rank: added after the sum)."""
        layers = [self.sublayer.get_submodule(name) for name in self.split.row_parallel] if self.split else []
        return [layer.bias for layer in layers if layer.bias is not None]

    def summed_own(self) -> list[nn.Parameter]:
        """Its whole parameters that meet this rank's share alone (``TensorSplit.sums_own``)."""
        return whole_parameters(self.sublayer) if self.split is not None and self.split.sums_own else []

    def refusal(self, cfg: zoo.ModelConfig) -> str | None:
        """Why it cannot be split, in one line naming the field and the fix; None when it can."""
        for name, child in self.sublayer.named_children():
            if isinstance(child, nn.Linear) and type(child) is not nn.Linear:
                return (
                    f"adapter: layer {name} is a {type(child).__name__}, which trainer=tp cannot split; train "
                    f"without an adapter (adapter=none), or with trainer=ddp"
                )
        if self.split is None or (whole_parameters(self.sublayer) and not self.split.sums_own):
            dense = ", ".join(n for n in FFN.names() if FFN.get(n).splits_by_tensor)
            return (
                f"model.ffn={cfg.ffn!r} ({type(self.sublayer).__name__}) cannot be split by trainer=tp, which "
                f"splits the dense FFNs ({dense}); choose one of them, or trainer=ddp"
            )
        return None


@dataclass(frozen=True, eq=False)
class BlockPlan:
    """A block's residual branches, in forward order."""

    block: nn.Module
    sublayers: tuple[SublayerPlan, ...]

    def placement_parameters(self) -> list[nn.Parameter]:
        """The parameters of the block outside its sublayers: its placements' norms."""
        inside = {id(p) for entry in self.sublayers for p in entry.sublayer.parameters()}
        return [p for p in self.block.parameters() if id(p) not in inside and p.requires_grad]


@dataclass(frozen=True, eq=False)
class TensorPlan:
    """How every block of ``model`` splits (embeddings, norms, the head and a task's own modules stay
    whole on every rank)."""

    model: zoo.ZooModel
    blocks: tuple[BlockPlan, ...]

    @classmethod
    def of(cls, model: zoo.ZooModel, degree: int) -> TensorPlan:
        """The plan of ``model`` over ``degree`` ranks; ConfigError in one line for what they cannot split."""
        plan = cls.read(model)
        plan.check(degree)
        return plan

    @classmethod
    def read(cls, model: zoo.ZooModel) -> TensorPlan:
        """What the sublayers of ``model`` declare, unchecked: of a whole model, or of one split already
        (the split keeps every parameter's name, so ``group_summed`` names the same ones)."""
        blocks = [
            BlockPlan(block, tuple(SublayerPlan(sublayer, sublayer.tensor_split()) for sublayer, _ in block.branches()))
            for stack in model.stacks()
            for block in stack.blocks
        ]
        return cls(model, tuple(blocks))

    def sublayers(self) -> list[SublayerPlan]:
        return [entry for block in self.blocks for entry in block.sublayers]

    def check(self, degree: int) -> None:
        """Raise ConfigError for what ``degree`` ranks cannot split: a declared size they do not divide,
        what the model shares across heads (qk_norm over all of them, a bias per head), a sublayer
        that cannot be split."""
        cfg = self.model.config
        for entry in self.sublayers():
            for field, size in (entry.split.sizes if entry.split else {}).items():
                if size % degree:
                    raise zoo.ConfigError(
                        f"model.{field}={size} does not split over {degree} tensor-parallel ranks (trainer=tp: "
                        f"trainer.strategy.tensor_parallel_size, all trainer.devices unless set); choose a "
                        f"multiple of {degree}, or another tensor_parallel_size"
                    )
        if cfg.qk_norm != "none" and cfg.qk_norm_scope == "all":
            raise zoo.ConfigError(
                "model.qk_norm_scope='all' normalises across every head, which trainer=tp splits; "
                "use qk_norm_scope=head, or trainer=ddp"
            )
        if any(stack.position.has_bias for stack in self.model.stacks()):
            raise zoo.ConfigError(
                f"model.position={cfg.position!r} adds a bias per head, which trainer=tp does not split; "
                f"choose a position without one (e.g. rope), or trainer=ddp"
            )
        refusal = next((r for entry in self.sublayers() if (r := entry.refusal(cfg)) is not None), None)
        if refusal is not None:
            raise zoo.ConfigError(refusal)

    def group_summed(self, *, sequence_parallel: bool) -> dict[str, nn.Parameter]:
        """The whole parameters that meet this rank's share alone, by name: the sublayers' own that their
        split sums (attention's qk_norm and value_residual: this rank's heads) and, with
        ``sequence_parallel``, the placements' norms and the row-parallel biases (this rank's positions).
        Their gradients are summed over the group."""
        chosen: list[nn.Parameter] = []
        for block in self.blocks:
            chosen += [p for entry in block.sublayers for p in entry.summed_own()]
            if sequence_parallel:
                chosen += block.placement_parameters() + [p for entry in block.sublayers for p in entry.row_biases()]
        ids = {id(p) for p in chosen if p.requires_grad}
        return {name: p for name, p in self.model.named_parameters() if id(p) in ids}
