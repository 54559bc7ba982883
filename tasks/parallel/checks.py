"""What ``trainer=tp`` (tasks.parallel.tensor) cannot run, refused in one line that names the field and
the fix: a model its groups cannot split (the plan's refusals, tasks.parallel.plan), devices that do not
form whole groups, the strategy's settings, and what sequence parallelism cannot split. Asked when a run
is composed (``TensorParallelStrategy.check_model``) and again when the strategy connects the model."""

from __future__ import annotations

import zoo
from tasks.parallel.plan import TensorPlan


def check_tensor_parallel(model: zoo.ZooModel, degree: int) -> None:
    """Raise ConfigError for a model that ``degree`` ranks cannot split, naming the field and the fix
    (the refusals are the plan's: ``TensorPlan.check``)."""
    TensorPlan.of(model, degree)


def check_devices(devices: int, degree: int) -> None:
    """Raise ConfigError unless ``devices`` fall into whole tensor-parallel groups of ``degree`` ranks."""
    if degree < 1 or devices % degree:
        raise zoo.ConfigError(
            f"trainer.devices={devices} do not form tensor-parallel groups of trainer.strategy.tensor_parallel_size="
            f"{degree} (each data-parallel replica is one group); choose devices a multiple of it, or another size"
        )


DATA_PARALLEL = ("replicate", "fsdp")  # trainer.strategy.data_parallel: how the replicas hold the split model


def check_data_parallel(mode: object) -> None:
    """Raise ConfigError unless ``mode`` is one of ``DATA_PARALLEL``."""
    if mode not in DATA_PARALLEL:
        raise zoo.ConfigError(
            f"trainer.strategy.data_parallel={mode!r} must be one of {', '.join(DATA_PARALLEL)} (replicate: whole "
            f"copies of each slice, fsdp: the replicas shard them)"
        )


def check_sequence_parallel(model: zoo.ZooModel) -> None:
    """Raise ConfigError for a model whose activations ``trainer.strategy.sequence_parallel`` cannot split
    along the sequence (the length itself is checked at each training batch)."""
    cfg = model.config
    if cfg.dropout:
        raise zoo.ConfigError(
            f"model.dropout={cfg.dropout}: under trainer.strategy.sequence_parallel=true every rank would drop "
            f"the same places of its share of the positions; set model.dropout=0, or sequence_parallel=false"
        )
    if cfg.form.cross_attention:
        raise zoo.ConfigError(
            f"model.arch={cfg.arch!r}: trainer.strategy.sequence_parallel splits a stack's own positions, and "
            f"cross-attention reads the encoder's whole output; set sequence_parallel=false"
        )
