"""Tensor parallelism (``trainer=tp``): every block's attention heads and FFN width split over the
devices of one node, as Megatron-LM splits them (Shoeybi et al. 2019, https://arxiv.org/abs/1909.08053,
section 3), on Lightning's ModelParallelStrategy.

Notation: N ranks (the tensor-parallel degree), r this rank; H, KV as in zoo.attention. The plan, per
block (``split_model``):

- attention: the input projections (self-attention's fused ``qkv``, cross-attention's ``q`` and fused
  ``kv``) are column-parallel: rank r holds query heads r*H/N .. (r+1)*H/N - 1 and the KV/N key/value
  heads they read (GQA keeps its groups), and attends over them alone; ``out`` is row-parallel: each rank
  multiplies its heads' columns and the partial outputs are summed over the ranks.
- FFN (the dense MLPs and GLUs): ``fc`` column-parallel (a GLU's gate and up rows cut alike, so each
  rank's units keep their pairs), ``proj`` row-parallel.
- embeddings, norms, the head and the task's own modules: whole on every rank.

That costs two all-reduces per sublayer and pass: the sum after a row-parallel layer (forward, Megatron's
g) and the sum of the input's gradient before the column-parallel layers (backward, Megatron's f).

Design. Zoo's fused layers keep their rows segment by segment ([q; k; v], [gate; up]), so a contiguous
share of the rows would give a rank some q rows and some k rows. Each rank holds instead its slice of
*every* segment ([q_r; k_r; v_r]) as a plain tensor under zoo's own parameter name, in a layer that knows
its segments (``ShardedLinear``); attention is told its local head counts (``n_heads``, ``n_kv_heads``).
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
Not done: data parallelism beside it (a 2-D mesh), sequence-parallel norms, pipeline stages."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial
from typing import Any, ClassVar

import lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import ModelParallelStrategy, Strategy
from torch import Tensor, nn
from torch.distributed import ProcessGroup
from torch.optim import Optimizer
from torch.utils.data import DataLoader, DistributedSampler

import zoo
from tasks.base import ZooTask
from tasks.data.loading import EpochBatchSampler
from tasks.parallel_checks import check_tensor_parallel, whole_parameters
from zoo.attention import Attention
from zoo.sublayer import Sublayer

ELEMENTWISE = (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD)  # each entry's update reads its own state


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


class _ToRanks(torch.autograd.Function):
    """Megatron's f, before a column-parallel layer: the input as it is; its gradient summed over the ranks."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: ProcessGroup) -> Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return summed(grad, ctx.group), None


class _FromRanks(torch.autograd.Function):
    """Megatron's g, after a row-parallel layer: the ranks' partial outputs summed; the gradient as it is."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: ProcessGroup) -> Tensor:
        return summed(x, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class ShardedLinear(nn.Linear):
    """A Linear of which this rank holds its slice of every segment along ``dim`` (``cut``), under the
    whole layer's parameter names. ``segments``: the whole layer's sizes along ``dim``, in zoo's order."""

    dim: ClassVar[int]  # 0: rows (output features) are cut; 1: columns (input features)
    split_bias: ClassVar[bool]  # whether the bias is cut too (else it is whole on every rank)

    def __init__(self, whole: nn.Linear, segments: Sequence[int], group: ProcessGroup) -> None:
        rank, degree = dist.get_rank(group), dist.get_world_size(group)
        weight = cut(whole.weight.detach(), segments, self.dim, rank, degree)
        super().__init__(weight.shape[1], weight.shape[0], bias=whole.bias is not None, device="meta")
        self.group, self.segments, self.rank, self.degree = group, tuple(segments), rank, degree
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


class ColumnParallelLinear(ShardedLinear):
    dim, split_bias = 0, True

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(_ToRanks.apply(x, self.group), self.weight, self.bias)  # (..., out / N)


class RowParallelLinear(ShardedLinear):
    dim, split_bias = 1, False

    def forward(self, x: Tensor) -> Tensor:
        y = _FromRanks.apply(F.linear(x, self.weight), self.group)  # (..., out): every rank's share summed
        return y if self.bias is None else y + self.bias


def split_model(model: zoo.ZooModel, group: ProcessGroup) -> None:
    """Split every block of ``model`` over the ranks of ``group``, in place, by the plan of this module.
    Every rank must hold the same weights. A model split already is left as it is (Lightning configures
    the model again for testing)."""
    if cut_parameters(model):
        return
    check_tensor_parallel(model, dist.get_world_size(group))
    for stack in model.stacks():
        for block in stack.blocks:
            for sublayer, _ in block.branches():
                _split_sublayer(sublayer, group)


def _split_sublayer(sublayer: Sublayer, group: ProcessGroup) -> None:
    """Its residual projections row-parallel, its other Linear layers column-parallel by their segments."""
    outputs = {id(m) for m in sublayer.residual_projections()}
    fused = sublayer.fused_segments()
    for name, child in list(sublayer.named_children()):
        if not isinstance(child, nn.Linear):
            continue
        if id(child) in outputs:
            layer: ShardedLinear = RowParallelLinear(child, [child.in_features], group)
        else:
            layer = ColumnParallelLinear(
                child, [rows for _, rows in fused.get(name, [(name, child.out_features)])], group
            )
        setattr(sublayer, name, layer)
    if isinstance(sublayer, Attention):
        degree = dist.get_world_size(group)
        sublayer.n_heads, sublayer.n_kv_heads = sublayer.n_heads // degree, sublayer.n_kv_heads // degree
        for param in whole_parameters(sublayer):  # qk_norm, value_residual: each rank saw its heads only
            param.register_hook(partial(summed, group=group))


def sharded_tensors(module: nn.Module) -> dict[str, ShardedLinear]:
    """Every cut parameter under ``module``, by its name in ``module.state_dict()``, to its layer."""
    return {
        f"{prefix}.{name}": layer
        for prefix, layer in module.named_modules()
        if isinstance(layer, ShardedLinear)
        for name in layer.split_tensors()
    }


def cut_parameters(module: nn.Module) -> dict[int, ShardedLinear]:
    """Every cut parameter under ``module``, by ``id``, to its layer."""
    return {id(module.get_parameter(name)): layer for name, layer in sharded_tensors(module).items()}


def grad_norm(sharded: list[Tensor], whole: list[Tensor], group: ProcessGroup) -> Tensor:
    """The 2-norm of the whole model's gradient: the slices' squares summed over the ranks, the whole
    tensors' (the same on every rank) counted once."""
    device = (sharded or whole)[0].device

    def squares(grads: list[Tensor]) -> Tensor:
        return torch.nn.utils.get_total_norm(grads).float().square() if grads else torch.zeros((), device=device)

    shards = squares(sharded)
    dist.all_reduce(shards, group=group)
    return (shards + squares(whole).to(device)).sqrt()


class TensorParallelStrategy(ModelParallelStrategy):
    """``trainer=tp``: ModelParallelStrategy over the devices of one node, one tensor-parallel group
    (data_parallel_size 1). ``ZooTask.configure_model`` asks it to split the model (``parallelize``).

    Checkpoints are single files in zoo's layout, written by rank 0 through the trainer's CheckpointIO
    and read through it. Every rank reads every batch. Clipping by norm counts every shard once.
    """

    def __init__(
        self, process_group_backend: str | None = None, timeout: timedelta | None = default_pg_timeout
    ) -> None:
        super().__init__(
            data_parallel_size=1,
            tensor_parallel_size="auto",
            save_distributed_checkpoint=False,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )

    check_model = staticmethod(check_tensor_parallel)  # asked when a run is composed (tasks.cli.checks)

    @property
    def group(self) -> ProcessGroup:
        return self.device_mesh["tensor_parallel"].get_group()

    def connect(self, model: Any) -> None:
        """Refuse, in every process and before any of them waits for the others, what cannot be split."""
        if not isinstance(model, ZooTask):
            raise TypeError(f"trainer=tp trains zoo tasks, not {type(model).__name__}")
        if self.num_nodes != 1:
            raise zoo.ConfigError(
                f"trainer.num_nodes={self.num_nodes}: trainer=tp splits the model over the devices of one node "
                f"and adds no data parallelism across nodes; set trainer.num_nodes=1, or use trainer=fsdp"
            )
        if not cut_parameters(model):  # testing after fitting: split already
            check_tensor_parallel(model.model, self.num_processes)
        super().connect(model)

    def parallelize(self, task: ZooTask) -> None:
        split_model(task.model, self.group)

    def setup_optimizers(self, trainer: L.Trainer) -> None:
        super().setup_optimizers(trainer)
        for optimizer in self.optimizers:
            if not isinstance(optimizer, ELEMENTWISE):
                raise zoo.ConfigError(
                    f"optimizer: {type(optimizer).__name__} updates each weight matrix as a whole, and under "
                    f"trainer=tp every rank holds slices of them; choose optimizer=adamw, or trainer=ddp"
                )

    # ---- every rank reads every batch ---------------------------------------------------------------
    def process_dataloader(self, dataloader: object) -> object:
        """The data modules shard by the process group's size (tasks.data.loading.world_rank), which
        here counts the tensor-parallel ranks: make this loader read the whole split on every rank."""
        if isinstance(dataloader, DataLoader):
            if isinstance(dataloader.batch_sampler, EpochBatchSampler):
                dataloader.batch_sampler.world, dataloader.batch_sampler.rank = 1, 0
            elif isinstance(dataloader.sampler, DistributedSampler):
                sampler = dataloader.sampler
                sampler.num_replicas, sampler.rank = 1, 0
                sampler.num_samples = sampler.total_size = len(sampler.dataset)
        return dataloader

    # ---- clipping by the whole model's norm ---------------------------------------------------------
    @property
    def precision_plugin(self) -> Precision:
        return super().precision_plugin

    @precision_plugin.setter
    def precision_plugin(self, plugin: Precision | None) -> None:
        """Lightning hands the trainer's precision plugin over here; its clipping by norm, which would
        see this rank's slices as whole tensors, becomes ``clip_grad_by_norm``."""
        if plugin is not None:
            plugin.clip_grad_by_norm = self.clip_grad_by_norm
        self._precision_plugin = plugin

    def clip_grad_by_norm(self, optimizer: Optimizer, clip_val: float) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return
        cut_ids = cut_parameters(self.model)
        sharded = [p.grad for p in params if id(p) in cut_ids]
        norm = grad_norm(sharded, [p.grad for p in params if id(p) not in cut_ids], self.group)
        torch.nn.utils.clip_grads_with_norm_(params, clip_val, norm)

    # ---- checkpoints in zoo's layout --------------------------------------------------------------
    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The whole model, each cut tensor gathered; on rank 0 (the writer) only."""
        layers = sharded_tensors(self.lightning_module)
        state = {
            k: (layers[k].whole(v) if k in layers else v).cpu() for k, v in self.lightning_module.state_dict().items()
        }
        return state if self.is_global_zero else {}

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """The optimizer's state as one process would hold it; on rank 0 only."""
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer._optimizer
        state = self._converted(optimizer, optimizer.state_dict(), lambda layer, v: layer.whole(v).cpu())
        return state if self.is_global_zero else {}

    @property
    def lightning_restore_optimizer(self) -> bool:
        return True

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """A full checkpoint, read by the trainer's CheckpointIO (ModelParallelStrategy's own reader
        takes DTensor models and sharded folders)."""
        return self.checkpoint_io.load_checkpoint(checkpoint_path, weights_only=weights_only)

    def load_model_state_dict(self, checkpoint: dict[str, Any], strict: bool = True) -> None:
        layers = sharded_tensors(self.lightning_module)
        state = {k: layers[k].part(v) if k in layers else v for k, v in checkpoint["state_dict"].items()}
        Strategy.load_model_state_dict(self, {"state_dict": state}, strict=strict)

    def load_optimizer_state_dict(self, checkpoint: dict[str, Any]) -> None:
        saved = zip(self.optimizers, checkpoint["optimizer_states"], strict=False)
        states = [self._converted(optimizer, state, ShardedLinear.part) for optimizer, state in saved]
        Strategy.load_optimizer_state_dict(self, {"optimizer_states": states})

    def _converted(
        self, optimizer: Optimizer, state: dict[str, Any], convert: Callable[[ShardedLinear, Tensor], Tensor]
    ) -> dict[str, Any]:
        """An optimizer state dict of ``optimizer`` with ``convert(layer, tensor)`` applied to every state
        tensor of a cut parameter (those shaped like it: not the step count)."""
        by_param = cut_parameters(self.model)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        layers = {i: by_param[id(p)] for i, p in enumerate(params) if id(p) in by_param}
        entries = {}
        for i, entry in state["state"].items():
            layer = layers.get(i)
            entries[i] = {
                k: convert(layer, v) if layer and isinstance(v, Tensor) and v.dim() else v for k, v in entry.items()
            }
        return {**state, "state": entries}
