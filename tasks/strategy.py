"""What zoo's tasks, checks, summary and verbs ask of a training strategy, in one declared contract.

A strategy of zoo's own (trainer=tp: ``tasks.parallel.tensor.TensorParallelStrategy``; trainer=pp:
``tasks.parallel.pipeline.PipelineParallelStrategy``) subclasses :class:`ZooStrategy` beside its Lightning base
and overrides what it does differently. Lightning's own strategies (one device, DDP, FSDP) keep the
model whole and get the defaults (:data:`PLAIN`). Callers ask :func:`strategy_of` (a running trainer's)
or :func:`strategy_class` (a composed config's ``trainer.strategy._target_``), never ``getattr``.

A new strategy (context parallel, expert parallel, ...) is a class here-shaped: refuse what it cannot
run when a run is composed (``check_run``, ``check_model``), split the model once its processes are up
(``parallelize``), run a step as pipeline stages (``runs_pipeline``, ``pipeline_step``), and count a
split model whole (``whole_parameter_count``). No Lightning import: the checks run before it loads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import zoo

if TYPE_CHECKING:
    from torch import Tensor, nn

    from tasks.base import ZooTask


class PipelineBatch(NamedTuple):
    """A batch as pipeline stages take it: what a strategy that ``runs_pipeline`` asks of a pipelined
    task (``ZooTask.pipeline_batch``). ``inputs`` for the first stage (token ids, (B, T)), ``extra``
    for every stage (the padding mask or document ids: what its masks need; segment ids), ``target``
    for the last stage's ``pipeline_loss`` (tensors of B rows: labels, and what else the loss reads),
    and ``items``: how many losses the batch's loss averages."""

    inputs: Tensor
    extra: dict[str, Tensor]
    target: dict[str, Tensor]
    items: Tensor


class ZooStrategy:
    """The contract, with the defaults of a strategy that keeps the model whole on every process."""

    runs_pipeline: ClassVar[bool] = False  # True: a step runs through ``pipeline_step``

    @classmethod
    def check_run(cls, *, task: type, optimizer: Any, num_nodes: int) -> None:
        """Refuse, when a run is composed (before any process starts), a task class, an optimizer (its
        OptimizerSettings) or a number of nodes this strategy cannot run: ConfigError in one line."""

    @classmethod
    def check_model(cls, model: zoo.ZooModel, devices: int, **settings: Any) -> None:
        """Refuse a model (built on the meta device) this strategy cannot run on ``devices`` devices with
        ``settings`` (its constructor's arguments, the trainer.strategy node's other keys)."""

    def parallelize(self, task: ZooTask) -> None:
        """Split ``task``'s model once the processes are up (Lightning's configure_model); the default
        keeps it whole."""

    def pipeline_step(self, task: ZooTask, batch: dict[str, Tensor], stage: str) -> Tensor:
        """A step's loss, the model run as pipeline stages (only when ``runs_pipeline``)."""
        raise NotImplementedError(f"{type(self).__name__} does not run pipeline stages")

    def whole_parameter_count(self, module: nn.Module) -> int:
        """The parameters of ``module`` as the unsplit model holds them, on every process (a split
        strategy's may be a collective: every rank calls it)."""
        return zoo.count_parameters(module)

    def local_parameter_count(self, module: nn.Module, *, trainable_only: bool = False) -> int:
        """This process's parameters of ``module``, a layer it holds a share of counted as the unsplit
        layer (the model summary's count, which one rank asks: never a collective)."""
        return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)

    def stats_model(self, model: zoo.ZooModel) -> zoo.ZooModel | zoo.ModelConfig:
        """What ``zoo.stats`` reads for the FLOPs of the model this process trains: the model, or its
        config where its layers hold a share (the throughput's FLOPs)."""
        return model


PLAIN = ZooStrategy()
"""What Lightning's own strategies (one device, DDP, FSDP) answer: the model whole, nothing refused."""


def strategy_of(trainer: Any) -> ZooStrategy:
    """The contract of a running trainer's strategy (:data:`PLAIN` for Lightning's own, or no trainer)."""
    strategy = None if trainer is None else trainer.strategy
    return strategy if isinstance(strategy, ZooStrategy) else PLAIN


def strategy_class(named: Any) -> type[ZooStrategy]:
    """The contract of the strategy class a config names (``trainer.strategy._target_``, resolved): itself
    where it is one of zoo's, else the defaults (:class:`ZooStrategy`; Lightning's own, or none)."""
    return named if isinstance(named, type) and issubclass(named, ZooStrategy) else ZooStrategy


def pipeline_step_of(trainer: Any) -> Callable[[ZooTask, dict[str, Tensor], str], Tensor] | None:
    """The running strategy's ``pipeline_step`` when it runs pipeline stages, else None."""
    strategy = strategy_of(trainer)
    return strategy.pipeline_step if strategy.runs_pipeline else None
