"""What zoo's strategies that split the model over processes (``trainer=tp``, ``trainer=pp``) share: the
Lightning overrides, written once here, each asking a hook that a strategy fills.

- the loaders: each process reads its replica's share of every batch (``replicas``);
- clipping: Lightning's clipping by norm, which would see one process's gradients, becomes the
  strategy's ``clip_grad_by_norm`` (the whole model's norm);
- checkpoints: zoo's layout, one process's file: the model and the optimizer state gathered whole
  on saving (``lightning_module_state_dict``, ``optimizer_state``: the strategy's), read by the trainer's
  CheckpointIO, and on loading each process takes its part (``own_model_state``, ``own_optimizer_state``).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any

from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import ModelParallelStrategy, Strategy
from torch import Tensor
from torch.optim import Optimizer
from torch.utils.data import DataLoader, DistributedSampler

from tasks.data.loading import EpochBatchSampler
from tasks.strategy import ZooStrategy


class SplitStrategy(ModelParallelStrategy, ZooStrategy):
    """ModelParallelStrategy for a model split over the processes of one node, its hooks filled by
    each strategy: ``replicas``, ``clip_grad_by_norm``, ``own_model_state``, ``own_optimizer_state``."""

    # ---- the hooks ----------------------------------------------------------------------------------
    @property
    @abstractmethod
    def replicas(self) -> tuple[int, int]:
        """(how many processes read different batches, which of them this process is)."""

    @abstractmethod
    def clip_grad_by_norm(self, optimizer: Optimizer, clip_val: float) -> None:
        """Clip the gradients by the norm of the whole model's."""

    @abstractmethod
    def own_model_state(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """This process's part of a whole model's ``state_dict`` (a checkpoint's)."""

    @abstractmethod
    def own_optimizer_state(self, optimizer: Any, state: dict[str, Any]) -> dict[str, Any]:
        """This process's part of ``optimizer``'s state as one process held it (a checkpoint's)."""

    # ---- the loaders --------------------------------------------------------------------------------
    def process_dataloader(self, dataloader: object) -> object:
        """The data modules shard by the process group's size and rank (tasks.data.loading.world_rank),
        which here count the processes that split the model: make this loader read this replica's share
        instead, the same on every process of the replica."""
        replicas, replica = self.replicas
        if isinstance(dataloader, DataLoader):
            if isinstance(dataloader.batch_sampler, EpochBatchSampler):
                dataloader.batch_sampler.world, dataloader.batch_sampler.rank = replicas, replica
            elif isinstance(dataloader.sampler, DistributedSampler):
                reshard(dataloader.sampler, replicas, replica)
        return dataloader

    # ---- clipping by the whole model's norm ---------------------------------------------------------
    @property
    def precision_plugin(self) -> Precision:
        return super().precision_plugin

    @precision_plugin.setter
    def precision_plugin(self, plugin: Precision | None) -> None:
        """Lightning hands the trainer's precision plugin over here; its clipping by norm, which would
        see one process's gradients as the model's, becomes ``clip_grad_by_norm``."""
        if plugin is not None:
            plugin.clip_grad_by_norm = self.clip_grad_by_norm
        self._precision_plugin = plugin

    # ---- checkpoints in zoo's layout ----------------------------------------------------------------
    @property
    def lightning_restore_optimizer(self) -> bool:
        return True

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """A whole checkpoint, read by the trainer's CheckpointIO (ModelParallelStrategy's own reader
        takes DTensor models and sharded folders)."""
        return self.checkpoint_io.load_checkpoint(checkpoint_path, weights_only=weights_only)

    def load_model_state_dict(self, checkpoint: dict[str, Any], strict: bool = True) -> None:
        state = self.own_model_state(checkpoint["state_dict"])
        Strategy.load_model_state_dict(self, {"state_dict": state}, strict=strict)

    def load_optimizer_state_dict(self, checkpoint: dict[str, Any]) -> None:
        saved = zip(self.optimizers, checkpoint["optimizer_states"], strict=False)
        states = [self.own_optimizer_state(optimizer, state) for optimizer, state in saved]
        Strategy.load_optimizer_state_dict(self, {"optimizer_states": states})


def reshard(sampler: DistributedSampler, replicas: int, rank: int) -> None:
    """Make ``sampler`` give replica ``rank`` of ``replicas`` its share, counted as DistributedSampler's
    constructor counts it (padded to equal shares, or cut to them with ``drop_last``)."""
    n = len(sampler.dataset)
    sampler.num_replicas, sampler.rank = replicas, rank
    uneven = sampler.drop_last and n % replicas
    sampler.num_samples = math.ceil((n - replicas) / replicas) if uneven else math.ceil(n / replicas)
    sampler.total_size = sampler.num_samples * replicas
