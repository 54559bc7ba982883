"""What ``trainer=tp`` (tasks.parallel.tensor) cannot split, refused in one line that names the field and the
fix: asked when a run is composed (``TensorParallelStrategy.check_model``) and again when the strategy
connects the model."""

from __future__ import annotations

from torch import nn

import zoo
from zoo.attention import Attention
from zoo.ffn import MLP
from zoo.registry import FFN


def check_tensor_parallel(model: zoo.ZooModel, degree: int) -> None:
    """Raise ConfigError for a model that ``degree`` ranks cannot split, naming the field and the fix."""
    cfg = model.config
    for field, size in (("n_heads", cfg.n_heads), ("n_kv_heads", cfg.resolved_n_kv_heads), ("d_ff", cfg.resolved_d_ff)):
        if size % degree:
            raise zoo.ConfigError(
                f"model.{field}={size} does not split over {degree} tensor-parallel ranks (trainer=tp: "
                f"trainer.strategy.tensor_parallel_size, all trainer.devices unless set); choose a multiple of "
                f"{degree}, or another tensor_parallel_size"
            )
    if cfg.qk_norm != "none" and cfg.qk_norm_scope == "all":
        raise zoo.ConfigError(
            "model.qk_norm_scope='all' normalises across every head, which trainer=tp splits; "
            "use qk_norm_scope=head, or trainer=ddp"
        )
    for stack in model.stacks():
        if stack.position.has_bias:
            raise zoo.ConfigError(
                f"model.position={cfg.position!r} adds a bias per head, which trainer=tp does not split; "
                f"choose a position without one (e.g. rope), or trainer=ddp"
            )
        for block in stack.blocks:
            for sublayer, _ in block.branches():
                _check_sublayer(sublayer, cfg)


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


def _check_sublayer(sublayer: nn.Module, cfg: zoo.ModelConfig) -> None:
    for name, child in sublayer.named_children():
        if isinstance(child, nn.Linear) and type(child) is not nn.Linear:
            raise zoo.ConfigError(
                f"adapter: layer {name} is a {type(child).__name__}, which trainer=tp cannot split; train "
                f"without an adapter (adapter=none), or with trainer=ddp"
            )
    if isinstance(sublayer, Attention):
        return
    if not isinstance(sublayer, MLP) or whole_parameters(sublayer):
        dense = ", ".join(n for n in FFN.names() if issubclass(FFN.get(n), MLP))
        raise zoo.ConfigError(
            f"model.ffn={cfg.ffn!r} ({type(sublayer).__name__}) cannot be split by trainer=tp, which splits "
            f"the dense FFNs ({dense}); choose one of them, or trainer=ddp"
        )


def whole_parameters(sublayer: nn.Module) -> list[nn.Parameter]:
    """The parameters of ``sublayer`` outside its Linear children (sharded or not)."""
    linear = {id(p) for m in sublayer.children() if isinstance(m, nn.Linear) for p in m.parameters()}
    return [p for p in sublayer.parameters() if id(p) not in linear]
