"""The layers of tensor parallelism (``trainer=tp``, tasks.parallel.tensor): every block's attention heads and
FFN width split over the ranks of one tensor-parallel group, as Megatron-LM splits them (Shoeybi et al.
2019, https://arxiv.org/abs/1909.08053, section 3), and, on request, the activations between them split
along the sequence (Korthikanti et al. 2022, https://arxiv.org/abs/2205.05198, section 4.2.2).

Notation: N ranks (the tensor-parallel degree), r this rank; B batch, T positions, D model width; H, KV as
in zoo.attention. The plan, per block (``split_model``; each sublayer declares its part,
``Sublayer.tensor_split``, read into a ``TensorPlan``: tasks.parallel.plan):

- attention: the input projections (self-attention's fused ``qkv``, cross-attention's ``q`` and fused
  ``kv``) are column-parallel: rank r holds query heads r*H/N .. (r+1)*H/N - 1 and the KV/N key/value
  heads they read (GQA keeps its groups), and attends over them alone; ``out`` is row-parallel: each rank
  multiplies its heads' columns and the partial outputs are summed over the ranks.
- FFN (the dense MLPs and GLUs): ``fc`` column-parallel (a GLU's gate and up rows cut alike, so each
  rank's units keep their pairs), ``proj`` row-parallel.
- embeddings, norms, the head and the task's own modules: whole on every rank.

That costs two all-reduces per sublayer and pass: the sum after a row-parallel layer (forward, Megatron's
g) and the sum of the input's gradient before the column-parallel layers (backward, Megatron's f).

Sequence parallelism (``sequence_parallel``, in training only): between the sublayers each rank keeps
positions r*T/N .. (r+1)*T/N - 1 of the residual stream (B, T/N, D), so the norms, the residual sums and
the dropout after each sublayer run on T/N positions. A column-parallel layer all-gathers its input along
T (its gradient is reduce-scattered) and a row-parallel one reduce-scatters its partial sums (its gradient
is all-gathered): the same bytes as the all-reduce each replaces. The first block's input is cut along T
and the last block's output gathered whole. The norms' weights and the row-parallel layers' biases meet
T/N positions on each rank, so their gradients are summed over the ranks.

Design. Zoo's fused layers keep their rows segment by segment ([q; k; v], [gate; up]), so a contiguous
share of the rows would give a rank some q rows and some k rows. Each rank holds instead its slice of
*every* segment ([q_r; k_r; v_r]) as a plain tensor under zoo's own parameter name, in a layer that knows
its segments (``ShardedLinear``); attention is told its local head counts (``Sublayer.keep_share``).
The strategy gathers the slices into zoo's full layout when it saves (weights and optimizer state) and
cuts its slices out of a full checkpoint when it loads, so one file resumes under any number of ranks,
one process included, and every tool that reads checkpoints reads these.

Why not DTensor parameters (torch.distributed.tensor.parallel's ColwiseParallel and RowwiseParallel)?
A DTensor's global tensor is its shards in rank order, here [q_0; k_0; v_0; q_1; ...], so checkpoints
would need the same conversion; and the replicated parameters must stay plain tensors (the tied head
reads ``embed.weight`` outside any module's forward), while lists mixing DTensors and tensors stop every
foreach and fused kernel: fused AdamW, clip_grad_norm_, get_total_norm in StopOnNonFinite.

What is whole on every rank but meets only this rank's heads (qk_norm's weights, value_residual's
lambda) has its gradient summed over the ranks; clipping by norm sums the slices' squares over the ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed import ProcessGroup

import zoo
from tasks.parallel.checks import check_sequence_parallel
from tasks.parallel.plan import SublayerPlan, TensorPlan
from zoo.blocks import Block


def cut(whole: Tensor, segments: Sequence[int], dim: int, rank: int, degree: int) -> Tensor:
    """Rank ``rank``'s slice of each segment of ``whole`` along ``dim``, in segment order: [q_r; k_r; v_r]."""
    return torch.cat([part.chunk(degree, dim)[rank] for part in whole.split(list(segments), dim)], dim)


def join(slices: Sequence[Tensor], segments: Sequence[int], dim: int) -> Tensor:
    """The inverse of ``cut``: every rank's slices (in rank order) back in zoo's layout [q; k; v]."""
    local = [size // len(slices) for size in segments]
    pieces = [s.split(local, dim) for s in slices]  # [rank][segment]
    return torch.cat([torch.cat([ranks[i] for ranks in pieces], dim) for i in range(len(segments))], dim)


def summed(x: Tensor, group: ProcessGroup) -> Tensor:
    """A copy of ``x`` summed over the ranks of ``group``."""
    total = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(total, group=group)
    return total


def gathered(x: Tensor, group: ProcessGroup) -> Tensor:
    """(B, T/N, ...) on each rank -> (B, T, ...): every rank's positions, in rank order."""
    parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=1)


def scattered(x: Tensor, group: ProcessGroup) -> Tensor:
    """(B, T, ...) partial sums on each rank -> (B, T/N, ...): this rank's positions, summed over the ranks."""
    parts = [part.contiguous() for part in x.chunk(dist.get_world_size(group), dim=1)]
    mine = torch.empty_like(parts[0])
    dist.reduce_scatter(mine, parts, group=group)
    return mine


def own_positions(x: Tensor, group: ProcessGroup) -> Tensor:
    """(B, T, ...) the same on every rank -> (B, T/N, ...): this rank's positions, no communication."""
    return x.chunk(dist.get_world_size(group), dim=1)[dist.get_rank(group)].contiguous()


class _Collective(torch.autograd.Function):
    """``forward`` applied to x, ``backward`` to its gradient, each a function of (tensor, group)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: ProcessGroup, forward: Any, backward: Any) -> Tensor:
        ctx.group, ctx.backward = group, backward
        return forward(x, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        return ctx.backward(grad, ctx.group), None, None, None


def _as_is(x: Tensor, group: ProcessGroup) -> Tensor:
    return x.view_as(x)


def to_ranks(x: Tensor, group: ProcessGroup) -> Tensor:
    """Megatron's f, before a column-parallel layer: the input as it is; its gradient summed over the ranks."""
    return _Collective.apply(x, group, _as_is, summed)


def from_ranks(x: Tensor, group: ProcessGroup) -> Tensor:
    """Megatron's g, after a row-parallel layer: the ranks' partial outputs summed; the gradient as it is."""
    return _Collective.apply(x, group, summed, _as_is)


class ShardedLinear(nn.Linear):
    """A Linear of which this rank holds its slice of every segment along ``dim`` (``cut``), under the
    whole layer's parameter names. ``segments``: the whole layer's sizes along ``dim``, in zoo's order.
    ``sequence_parallel``: in training its input (column-parallel) or output (row-parallel) is this
    rank's share of the positions."""

    dim: ClassVar[int]  # 0: rows (output features) are cut; 1: columns (input features)
    split_bias: ClassVar[bool]  # whether the bias is cut too (else it is whole on every rank)

    def __init__(
        self, whole: nn.Linear, segments: Sequence[int], group: ProcessGroup, *, sequence_parallel: bool = False
    ) -> None:
        rank, degree = dist.get_rank(group), dist.get_world_size(group)
        weight = cut(whole.weight.detach(), segments, self.dim, rank, degree)
        super().__init__(weight.shape[1], weight.shape[0], bias=whole.bias is not None, device="meta")
        self.group, self.segments, self.rank, self.degree = group, tuple(segments), rank, degree
        self.sequence_parallel = sequence_parallel
        self.weight = nn.Parameter(weight, requires_grad=whole.weight.requires_grad)  # cut made a new tensor
        if whole.bias is not None:
            bias = self.part(whole.bias.detach()) if self.split_bias else whole.bias.detach()
            self.bias = nn.Parameter(bias, requires_grad=whole.bias.requires_grad)

    def split_tensors(self) -> list[str]:
        """The names of the parameters that are cut (the others are whole on every rank)."""
        return ["weight", "bias"] if self.split_bias and self.bias is not None else ["weight"]

    def part(self, whole: Tensor) -> Tensor:
        """This rank's slice of a whole tensor of this layer (weight, bias, or state shaped like them)."""
        return cut(whole, self.segments, self.dim if whole.dim() > 1 else 0, self.rank, self.degree)

    def whole(self, local: Tensor) -> Tensor:
        """The whole tensor from every rank's slice (a collective: every rank calls it)."""
        slices = [torch.empty_like(local) for _ in range(self.degree)]
        dist.all_gather(slices, local.contiguous(), group=self.group)
        return join(slices, self.segments, self.dim if local.dim() > 1 else 0)

    def split_sequence(self) -> bool:
        """Whether this forward's activations outside the layer are split along the sequence."""
        return self.sequence_parallel and self.training


class ColumnParallelLinear(ShardedLinear):
    dim, split_bias = 0, True

    def forward(self, x: Tensor) -> Tensor:
        if self.split_sequence():  # (B, T/N, D) gathered to (B, T, D); the gradient reduce-scattered
            return F.linear(_Collective.apply(x, self.group, gathered, scattered), self.weight, self.bias)
        return F.linear(to_ranks(x, self.group), self.weight, self.bias)  # (..., out / N)


class RowParallelLinear(ShardedLinear):
    dim, split_bias = 1, False

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight)  # (B, T, out): this rank's share of the sum
        if self.split_sequence():  # summed and cut to (B, T/N, out); the gradient all-gathered
            y = _Collective.apply(y, self.group, scattered, gathered)
        else:
            y = from_ranks(y, self.group)  # (..., out): every rank's share summed
        return y if self.bias is None else y + self.bias


def split_model(model: zoo.ZooModel, group: ProcessGroup, *, sequence_parallel: bool = False) -> None:
    """Split every block of ``model`` over the ranks of ``group``, in place, by its plan (computed once
    here: checked, then applied). Every rank must hold the same weights. A model split already is left as
    it is (Lightning configures the model again for testing). The gradients of the plan's group-summed
    parameters are summed over the group by hooks on them (FSDP, which replaces the parameters, drops
    them: tasks.parallel.fsdp)."""
    if cut_parameters(model):
        return
    plan = TensorPlan.of(model, dist.get_world_size(group))
    if sequence_parallel:
        check_sequence_parallel(model)
    for entry in plan.sublayers():
        _split_sublayer(entry, group, sequence_parallel)
    for stack in model.stacks():
        if sequence_parallel and len(stack.blocks):
            stack.blocks[0].register_forward_pre_hook(partial(_enter_sequence_parallel, group=group))
            stack.blocks[-1].register_forward_hook(partial(_leave_sequence_parallel, group=group))
    for param in plan.group_summed(sequence_parallel=sequence_parallel).values():
        param.register_hook(partial(summed, group=group))


def group_summed_parameters(model: zoo.ZooModel, *, sequence_parallel: bool) -> dict[str, nn.Parameter]:
    """The whole parameters of ``model`` whose gradients are summed over the group once it is split, by
    name (``TensorPlan.group_summed``); the same names before and after the split."""
    return TensorPlan.read(model).group_summed(sequence_parallel=sequence_parallel)


def _split_sublayer(entry: SublayerPlan, group: ProcessGroup, sequence_parallel: bool) -> None:
    """Its layers replaced by their slices as its declaration says; then it keeps its share of the heads."""
    sublayer, split = entry.sublayer, entry.split
    assert split is not None  # the plan refuses a sublayer that cannot be split
    for name, segments in split.column_parallel.items():
        whole = sublayer.get_submodule(name)
        setattr(sublayer, name, ColumnParallelLinear(whole, segments, group, sequence_parallel=sequence_parallel))
    for name in split.row_parallel:
        whole = sublayer.get_submodule(name)
        layer = RowParallelLinear(whole, [whole.in_features], group, sequence_parallel=sequence_parallel)
        setattr(sublayer, name, layer)
    sublayer.keep_share(dist.get_world_size(group))


def _enter_sequence_parallel(block: Block, args: tuple[Any, ...], *, group: ProcessGroup) -> tuple[Any, ...] | None:
    """The first block's input (B, T, D), the same on every rank, cut to this rank's (B, T/N, D) in training."""
    if not block.training:
        return None
    x, degree = args[0], dist.get_world_size(group)
    if x.shape[1] % degree:
        raise zoo.ConfigError(
            f"trainer.strategy.sequence_parallel=true: a training batch of {x.shape[1]} positions does not split "
            f"over {degree} tensor-parallel ranks; choose data.seq_len a multiple of {degree} (rows of one "
            f"length), or sequence_parallel=false"
        )
    return (_Collective.apply(x, group, own_positions, gathered), *args[1:])


def _leave_sequence_parallel(block: Block, args: tuple[Any, ...], out: Tensor, *, group: ProcessGroup) -> Tensor:
    """The last block's output whole again, (B, T, D) on every rank; its gradient cut to this rank's share."""
    return _Collective.apply(out, group, gathered, own_positions) if block.training else out


def sharded_tensors(module: nn.Module) -> dict[str, ShardedLinear]:
    """Every cut parameter under ``module``, by its name in ``module.state_dict()``, to its layer."""
    return {
        f"{prefix}.{name}": layer
        for prefix, layer in module.named_modules()
        if isinstance(layer, ShardedLinear)
        for name in layer.split_tensors()
    }


def cut_parameters(module: nn.Module) -> dict[int, ShardedLinear]:
    """Every cut parameter under ``module`` (``module`` itself included), by ``id``, to its layer."""
    return {
        id(getattr(layer, name)): layer
        for layer in module.modules()
        if isinstance(layer, ShardedLinear)
        for name in layer.split_tensors()
    }


def whole_parameter_count(module: nn.Module, *, trainable_only: bool = False) -> int:
    """The parameters of ``module`` as the unsplit model has them: each cut tensor counted times the ranks
    that share it, a whole one once (a tied embedding too), a vocabulary's padding rows left out (the
    embedding and head are whole). ``zoo.count_parameters`` of a module that is not split."""
    return zoo.count_parameters(module, trainable_only=trainable_only) + _other_shares(module, trainable_only)


def held_parameter_count(module: nn.Module, *, trainable_only: bool = False) -> int:
    """The parameters of ``module`` as one process would hold them unsplit, padding rows included (the
    model summary's count, as Lightning's own counts a model that is not split)."""
    held = sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)
    return held + _other_shares(module, trainable_only)


def _other_shares(module: nn.Module, trainable_only: bool) -> int:
    """The elements of each cut tensor of ``module`` that the other ranks hold."""
    cut_ids = cut_parameters(module)
    return sum(
        p.numel() * (cut_ids[id(p)].degree - 1)
        for p in module.parameters()
        if id(p) in cut_ids and (p.requires_grad or not trainable_only)
    )


def grad_norm(
    sharded: list[Tensor], whole: list[Tensor], group: ProcessGroup, *, replicas: ProcessGroup | None = None
) -> Tensor:
    """The 2-norm of the whole model's gradient: the slices' squares summed over the ranks, the whole
    tensors' (the same on every rank) counted once. ``replicas``: the data-parallel group when each
    gradient is this rank's shard over it (FSDP: tasks.parallel.fsdp), whose squares are summed over it too."""
    device = (sharded or whole)[0].device

    def squares(grads: list[Tensor]) -> Tensor:
        return torch.nn.utils.get_total_norm(grads).float().square() if grads else torch.zeros((), device=device)

    shards = squares(sharded)
    dist.all_reduce(shards, group=group)
    total = shards + squares(whole).to(device)
    if replicas is not None:
        dist.all_reduce(total, group=replicas)
    return total.sqrt()


BUCKET = 1 << 24  # elements per all-reduce when gradients are averaged (64 MiB of fp32)


def average_gradients(grads: list[Tensor], group: ProcessGroup) -> None:
    """Each of ``grads`` replaced, in place, by its mean over the ranks of ``group``: one all-reduce per
    bucket of about ``BUCKET`` elements of one dtype and device. Every rank passes its gradients of the
    same parameters in the same order."""
    size = dist.get_world_size(group)
    if size == 1 or not grads:
        return
    buckets: list[list[Tensor]] = []
    for grad in grads:
        last = buckets[-1] if buckets else []
        alike = bool(last) and (last[0].dtype, last[0].device) == (grad.dtype, grad.device)
        if alike and sum(g.numel() for g in last) + grad.numel() <= BUCKET:
            last.append(grad)
        else:
            buckets.append([grad])
    for bucket in buckets:
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, group=group)
        flat /= size
        for grad, mean in zip(bucket, flat.split([g.numel() for g in bucket]), strict=True):
            grad.copy_(mean.view_as(grad))
