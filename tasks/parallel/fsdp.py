"""FSDP2 over the data-parallel dimension of ``trainer=tp`` (``trainer.strategy.data_parallel=fsdp``,
tasks.parallel.tensor): instead of R whole replicas of one split model, each tensor-parallel slice (and each
whole tensor) is sharded over the R ranks that hold the same slice, as ZeRO-3 shards a model
(Rajbhandari et al. 2019, https://arxiv.org/abs/1910.02054; torch's ``fully_shard``).

Notation as in tasks.parallel.tensor: N ranks per tensor-parallel group, R replicas. The layers of
tasks.parallel.layers hold plain tensors (this rank's slice); FSDP sees them as ordinary parameters and
shards each along its first dimension over the data-parallel mesh dimension, as DTensors. During a
block's forward and backward it gathers them back into plain tensors, so the sharded layers run
unchanged.

- units: every block is one (gathered for its forward and its backward, freed after), and the task
  (its model's embeddings, final norm and head, and the task's own modules) is the root. The task's step
  methods (``STEPS``) open the root's forward, so the root's tensors are gathered for the whole step.
- gradients: FSDP reduce-scatters them, averaged over the replicas, during backward: each rank keeps
  its shard (a DTensor). The whole tensors whose gradients tensor parallelism sums over its group
  (``group_summed_parameters``) lose their hooks (FSDP replaces the parameters): their shards are summed
  over the group after backward instead (``sum_over_group``): the same sum, taken after the mean.
- clipping: the squares of every shard summed over the replicas too (tasks.parallel.layers.grad_norm).
- checkpoints: each DTensor gathered over the replicas (``whole_over_replicas``, a collective) and then
  joined over the group as before; loading cuts a whole tensor to this rank's slice, then to its shard
  (``shard_like``), with no communication.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor, distribute_tensor

import zoo
from tasks.parallel.layers import group_summed_parameters, summed

STEPS = ("training_step", "validation_step", "test_step", "predict_step")  # Lightning's, each the root's forward


def shard_replicas(task: nn.Module, model: zoo.ZooModel, mesh: DeviceMesh, *, sequence_parallel: bool) -> list[str]:
    """Shard ``task`` (whose split model is ``model``) over the 1-D data-parallel ``mesh``, in place: each
    block, then the task as the root. Returns the names (in ``task``) of the parameters whose gradients
    ``sum_over_group`` must sum over the tensor-parallel group. A task sharded already is left as it is
    (Lightning configures the model again for testing); it returns the same names."""
    prefix = next(name for name, module in task.named_modules() if module is model)
    names = [f"{prefix}.{name}" for name in group_summed_parameters(model, sequence_parallel=sequence_parallel)]
    if isinstance(task, FSDPModule):
        return names
    for stack in model.stacks():
        for block in stack.blocks:
            fully_shard(block, mesh=mesh)
    fully_shard(task, mesh=mesh)
    for step in STEPS:
        register_fsdp_forward_method(task, step)
    return names


def sum_over_group(params: Sequence[nn.Parameter], group: ProcessGroup) -> None:
    """After backward: the gradient shard of each of ``params`` summed over the tensor-parallel ``group``
    (the ranks of a group hold the same shards of a whole tensor)."""
    for param in params:
        if param.grad is not None:
            shard = local(param.grad)
            shard.copy_(summed(shard, group))


def local(x: Tensor) -> Tensor:
    """This rank's shard of a DTensor; a plain tensor as it is."""
    return x.to_local() if isinstance(x, DTensor) else x


def whole_over_replicas(x: Tensor) -> Tensor:
    """A DTensor gathered whole (a collective over the replicas: every rank calls it); a plain tensor as it is."""
    return x.full_tensor() if isinstance(x, DTensor) else x


def shard_like(x: Tensor, like: Tensor | None) -> Tensor:
    """``x`` (this rank's slice, the same on every replica) as a DTensor placed as ``like`` is: each rank
    keeps its own shard, no communication. ``x`` as it is when ``like`` is not a DTensor."""
    if not isinstance(like, DTensor):
        return x
    x = x.to(device=like.device, dtype=like.dtype)
    return distribute_tensor(x, like.device_mesh, like.placements, src_data_rank=None)


__all__ = ["STEPS", "local", "shard_like", "shard_replicas", "sum_over_group", "whole_over_replicas"]
