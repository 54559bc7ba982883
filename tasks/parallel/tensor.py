"""Tensor parallelism beside data parallelism (``trainer=tp``), on Lightning's ModelParallelStrategy:
the devices of one node form a 2-D mesh (data_parallel x tensor_parallel). Each tensor-parallel group of
``tensor_parallel_size`` ranks holds one copy of the model, every block split over its ranks as Megatron-LM
splits them (the plan: tasks.parallel.plan; the layers: tasks.parallel.layers); the groups are data-parallel
replicas.

Notation: N = tensor_parallel_size, R = devices / N replicas. The mesh puts ranks g*N .. g*N + N - 1 in
group g; rank r of every group forms data-parallel group r.

- data: each replica reads its own share of the batches (the data modules shard by replica and replica
  count, not by global rank); the ranks of one group read the same batches.
- gradients: after backward, before the hooks that read them, clipping and the step, every gradient is
  averaged over the data-parallel group (a slice with the same slices of the other replicas), as DDP
  averages them. Clipping by norm then counts the whole model once: slices summed over the
  tensor-parallel group only.
- logging: a value logged with ``sync_dist`` is averaged over all R*N processes, the N copies of each
  replica's value alike, so it is the mean over the replicas (what DDP logs); ``train/loss`` (not synced)
  is replica 0's, as under DDP.
- checkpoints: single files in zoo's layout, written by global rank 0; the slices are gathered over the
  tensor-parallel group of replica 0 alone (the other replicas hold the same weights and state).

``data_parallel=fsdp`` shards the replicas instead (tasks.parallel.fsdp): each slice, each whole tensor
and their optimizer state split R ways by FSDP2; the gradients are averaged by its reduce-scatter, and
checkpoints gather every shard over the replicas before joining the slices as above.

Not done: nodes beyond one, pipeline stages."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

import lightning as L
import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.core.optimizer import LightningOptimizer
from torch import Tensor
from torch.distributed import ProcessGroup
from torch.optim import Optimizer

import zoo
from tasks.base import ZooTask
from tasks.parallel.base import SplitStrategy
from tasks.parallel.checks import check_data_parallel, check_devices, check_sequence_parallel, check_tensor_parallel
from tasks.parallel.fsdp import local, shard_like, shard_replicas, sum_over_group, whole_over_replicas
from tasks.parallel.layers import (
    ShardedLinear,
    average_gradients,
    cut_parameters,
    grad_norm,
    held_parameter_count,
    sharded_tensors,
    split_model,
    whole_parameter_count,
)

ELEMENTWISE = (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD)  # each entry's update reads its own state


class TensorParallelStrategy(SplitStrategy):
    """``trainer=tp``: ModelParallelStrategy over the devices of one node, as R data-parallel replicas of
    one tensor-parallel group each. ``ZooTask.configure_model`` asks it to split the model
    (``parallelize``).

    Args:
        tensor_parallel_size: ranks per tensor-parallel group, a divisor of ``trainer.devices``; "auto":
            all of them (one group, no data parallelism).
        sequence_parallel: keep the activations between sublayers split along the sequence in training
            (tasks.parallel.layers); the training batches' length must be a multiple of the group size.
        data_parallel: "replicate": every replica holds its group's slices whole, gradients averaged after
            backward; "fsdp": the replicas shard them with FSDP2 (tasks.parallel.fsdp).
        process_group_backend, timeout: as ModelParallelStrategy's.
    """

    def __init__(
        self,
        tensor_parallel_size: int | Literal["auto"] = "auto",
        sequence_parallel: bool = False,
        data_parallel: str = "replicate",
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        size = tensor_parallel_size
        if size != "auto" and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise zoo.ConfigError(
                f"trainer.strategy.tensor_parallel_size={size!r} must be a whole number of devices >= 1, or auto "
                f"(all trainer.devices in one group)"
            )
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=size,
            save_distributed_checkpoint=False,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        check_data_parallel(data_parallel)
        self.tensor_parallel_size, self.sequence_parallel = size, bool(sequence_parallel)
        self.fsdp = data_parallel == "fsdp"
        self._group_summed: list[torch.nn.Parameter] = []  # fsdp: summed over the group after backward

    whole_parameter_count = staticmethod(whole_parameter_count)  # the run summary's count (tasks.cli.train)
    local_parameter_count = staticmethod(held_parameter_count)  # the model summary's: a rank's, cut layers whole

    def stats_model(self, model: zoo.ZooModel) -> zoo.ZooModel | zoo.ModelConfig:
        return model.config if cut_parameters(model) else model  # split: the layers hold one rank's share

    @classmethod
    def check_model(cls, model: zoo.ZooModel, devices: int, **settings: Any) -> None:
        """Refuse what this strategy cannot run on ``devices`` devices: asked when a run is composed
        (tasks.cli.train.checks.check_strategy); ``settings``: the strategy's constructor arguments (the default
        strategy without them)."""
        cls(**settings).check(model, devices)

    @classmethod
    def check_run(cls, *, task: type, optimizer: Any, num_nodes: int) -> None:
        """Refuse, when a run is composed (tasks.cli.train.checks.check_strategy: before any process starts), an
        optimizer that cannot update slices (``optimizer``: its OptimizerSettings) and more than one node."""
        if not optimizer.elementwise:
            raise zoo.ConfigError(
                f"optimizer={optimizer.name} updates each weight matrix as a whole, and under trainer=tp every "
                f"rank holds slices of them; choose optimizer=adamw, or trainer=ddp"
            )
        if num_nodes != 1:
            raise zoo.ConfigError(
                f"trainer.num_nodes={num_nodes}: trainer=tp lays its mesh over the devices of one node; "
                f"set trainer.num_nodes=1, or use trainer=fsdp"
            )

    def check(self, model: zoo.ZooModel, devices: int) -> None:
        """Raise ConfigError for a model this strategy's groups cannot split on ``devices`` devices."""
        check_tensor_parallel(model, self.degree(devices))
        if self.sequence_parallel:
            check_sequence_parallel(model)

    def degree(self, devices: int) -> int:
        """The tensor-parallel group size on ``devices`` devices; ConfigError unless it divides them."""
        degree = devices if self.tensor_parallel_size == "auto" else self.tensor_parallel_size
        check_devices(devices, degree)
        return degree

    @property
    def group(self) -> ProcessGroup:
        """This rank's tensor-parallel group."""
        return self.device_mesh["tensor_parallel"].get_group()

    @property
    def replicas(self) -> tuple[int, int]:
        """(data-parallel replicas, this rank's replica)."""
        mesh = self.device_mesh["data_parallel"]
        return mesh.size(), mesh.get_local_rank()

    def connect(self, model: Any) -> None:
        """Refuse, in every process and before any of them waits for the others, what cannot be split."""
        if not isinstance(model, ZooTask):
            raise TypeError(f"trainer=tp trains zoo tasks, not {type(model).__name__}")
        if self.num_nodes != 1:
            raise zoo.ConfigError(
                f"trainer.num_nodes={self.num_nodes}: trainer=tp lays its mesh over the devices of one node; "
                f"set trainer.num_nodes=1, or use trainer=fsdp"
            )
        if not cut_parameters(model):  # testing after fitting: split already
            self.check(model.model, self.num_processes)
        super().connect(model)

    def setup_environment(self) -> None:
        """The mesh's shape from the devices of the node, before Lightning builds it."""
        degree = self.degree(self.num_processes)
        self._tensor_parallel_size, self._data_parallel_size = degree, self.num_processes // degree
        super().setup_environment()

    def parallelize(self, task: ZooTask) -> None:
        split_model(task.model, self.group, sequence_parallel=self.sequence_parallel)
        if self.fsdp:
            mesh = self.device_mesh["data_parallel"]
            names = shard_replicas(task, task.model, mesh, sequence_parallel=self.sequence_parallel)
            self._group_summed = [task.get_parameter(name) for name in names]

    def setup_optimizers(self, trainer: L.Trainer) -> None:
        super().setup_optimizers(trainer)
        for optimizer in self.optimizers:
            if not isinstance(optimizer, ELEMENTWISE):
                raise zoo.ConfigError(
                    f"optimizer: {type(optimizer).__name__} updates each weight matrix as a whole, and under "
                    f"trainer=tp every rank holds slices of them; choose optimizer=adamw, or trainer=ddp"
                )

    # ---- data parallelism: each replica its batches, gradients averaged over the replicas -----------
    def optimizer_step(
        self, optimizer: Optimizer, closure: Any, model: L.LightningModule | None = None, **kwargs: Any
    ) -> Any:
        """The step, its closure's backward followed by the mean of every gradient over the replicas:
        the hooks before the step (StopOnNonFinite), clipping and the optimizer see the averaged ones.
        With fsdp, backward has averaged them (each rank's shard); the shards that tensor parallelism
        sums over the group are summed then."""

        def backward_then_average() -> Any:
            result = closure()
            if self.fsdp:
                sum_over_group(self._group_summed, self.group)
            else:
                grads = [p.grad for p in self.lightning_module.parameters() if p.grad is not None]
                average_gradients(grads, self.device_mesh["data_parallel"].get_group())
            return result

        return super().optimizer_step(optimizer, backward_then_average, model, **kwargs)

    # ---- clipping by the whole model's norm ---------------------------------------------------------
    def clip_grad_by_norm(self, optimizer: Optimizer, clip_val: float) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return
        cut_ids = cut_parameters(self.model)
        sharded = [local(p.grad) for p in params if id(p) in cut_ids]  # fsdp: this rank's shards of them
        rest = [local(p.grad) for p in params if id(p) not in cut_ids]
        replicas = self.device_mesh["data_parallel"].get_group() if self.fsdp else None
        norm = grad_norm(sharded, rest, self.group, replicas=replicas)
        torch.nn.utils.clip_grads_with_norm_(params, clip_val, norm)

    # ---- checkpoints in zoo's layout --------------------------------------------------------------
    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The whole model, each cut tensor gathered over replica 0's group (fsdp: every tensor over the
        replicas first, and over every group); on rank 0 (the writer) only."""
        if self.replicas[1] and not self.fsdp:
            return {}
        layers = sharded_tensors(self.lightning_module)
        state = {k: whole(layers.get(k), v) for k, v in self.lightning_module.state_dict().items()}
        return state if self.is_global_zero else {}

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """The optimizer's state as one process would hold it, gathered as the weights; on rank 0 only."""
        if self.replicas[1] and not self.fsdp:
            return {}
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer._optimizer
        state = self._converted(optimizer, optimizer.state_dict(), lambda p, layer, v: whole(layer, v))
        return state if self.is_global_zero else {}

    def own_model_state(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """This rank's slice of each cut tensor (fsdp: and its shard of every tensor)."""
        layers, current = sharded_tensors(self.lightning_module), self.lightning_module.state_dict()
        return {k: part(layers.get(k), v, current.get(k)) for k, v in state.items()}

    def own_optimizer_state(self, optimizer: Any, state: dict[str, Any]) -> dict[str, Any]:
        return self._converted(optimizer, state, lambda p, layer, v: part(layer, v, p))

    def _converted(
        self,
        optimizer: Optimizer,
        state: dict[str, Any],
        convert: Callable[[Tensor, ShardedLinear | None, Tensor], Tensor],
    ) -> dict[str, Any]:
        """An optimizer state dict of ``optimizer`` with ``convert(param, layer, tensor)`` applied to every
        state tensor shaped like its parameter (not the step count); ``layer``: the parameter's when it is
        cut, else None."""
        by_param = cut_parameters(self.model)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        entries = {}
        for i, entry in state["state"].items():
            param = params[i]
            layer = by_param.get(id(param))
            entries[i] = {
                k: convert(param, layer, v) if isinstance(v, Tensor) and v.dim() else v for k, v in entry.items()
            }
        return {**state, "state": entries}


def whole(layer: ShardedLinear | None, value: Tensor) -> Tensor:
    """A tensor as one process holds it, on the CPU: gathered over the replicas if sharded (fsdp), then
    joined over the group if ``layer`` cut it. Collectives: every rank calls it."""
    value = whole_over_replicas(value)
    return (layer.whole(value) if layer is not None else value).cpu()


def part(layer: ShardedLinear | None, value: Tensor, like: Tensor | None) -> Tensor:
    """The inverse of ``whole``: this rank's slice if ``layer`` cuts it, then its shard if ``like`` (the
    tensor it replaces) is sharded."""
    return shard_like(layer.part(value) if layer is not None else value, like)
