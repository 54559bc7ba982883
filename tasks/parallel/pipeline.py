"""Pipeline parallelism (``trainer=pp``): the blocks of a decoder or an encoder cut into one stage
per device (zoo.pipeline), each batch cut into microbatches that flow through the stages on torch's
schedules (torch.distributed.pipelining): GPipe (every microbatch forward, then every one backward;
Huang et al. 2019, https://arxiv.org/abs/1811.06965) or 1F1B (one forward, one backward, so a stage
keeps at most N microbatches' activations; Narayanan et al. 2021, https://arxiv.org/abs/2104.04473).

How it meets Lightning. The schedule runs forward and backward together, so ``ZooTask.shared_step``
hands the batch to ``pipeline_step`` (instead of its ``model_step``), which returns the batch's loss,
summed on the last stage from the task's ``pipeline_loss`` and broadcast to every rank for logging;
``backward`` then has nothing left to do. Every rank reads every batch (the first stage its tokens,
the last its targets, all of them the padding mask or document ids). The task's own modules (a
classifier's head) are read by ``pipeline_loss``, so they live on the last stage alone.

The loss is the batch's: each microbatch's summed loss is divided by the batch's label count, so the
gradients equal one process's on the whole batch (not a mean of microbatch means). A tied head (an
LM or MLM head) has a copy of the embedding on the last stage; the two copies' gradients are summed
before each step, so they stay equal. Checkpoints are single files in zoo's whole layout (rank 0
gathers every stage's tensors and optimizer state, keyed by parameter name), so they resume under
any number of stages or one process, and every tool that reads checkpoints reads them."""

from __future__ import annotations

import itertools
import warnings
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.core.optimizer import LightningOptimizer
from torch import Tensor, nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.optim import Optimizer

import zoo
from tasks.base import ZooTask
from tasks.parallel.base import SplitStrategy
from zoo.pipeline import Stage, check_pipeline, tied_embedding

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class PipelineParallelStrategy(SplitStrategy):
    """``trainer=pp``: one pipeline stage per device of one node. ``schedule``: gpipe or 1f1b;
    ``microbatches``: how many each batch is cut into (the largest divisor of the batch size up to
    it; at least the number of stages keeps every stage busy in 1F1B, which falls back to GPipe
    for a batch cut into fewer)."""

    task_hooks: ClassVar[tuple[str, ...]] = ("pipeline_batch", "pipeline_loss")  # what a task it trains defines
    runs_pipeline = True

    @classmethod
    def check_model(cls, model: zoo.ZooModel, devices: int, **settings: Any) -> None:
        """Refuse what cannot run as ``devices`` stages with these ``settings`` (the constructor's):
        asked when a run is composed (tasks.cli.train.checks.check_strategy)."""
        cls(**settings)
        check_pipeline(model, devices)

    def __init__(
        self,
        schedule: str = "1f1b",
        microbatches: int = 4,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        if schedule not in SCHEDULES:
            raise zoo.ConfigError(
                f"trainer.strategy.schedule={schedule!r} is not a pipeline schedule; choose {' or '.join(SCHEDULES)}"
            )
        if not isinstance(microbatches, int) or microbatches < 1:
            raise zoo.ConfigError(f"trainer.strategy.microbatches={microbatches!r} must be an integer >= 1")
        super().__init__(
            data_parallel_size=1,
            tensor_parallel_size="auto",
            save_distributed_checkpoint=False,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self.schedule, self.microbatches = schedule, microbatches
        self.stage: Stage | None = None
        self._schedules: dict[tuple, Any] = {}
        self._loss: tuple[ZooTask, str, dict[str, Tensor], Tensor] | None = None  # the running step's task,
        # stage name, targets and divisor
        self._grads: list[tuple[Tensor, Tensor]] = []  # the running step's gradients, until ``backward``
        self._tied_group: dist.ProcessGroup | None = None  # None: the default group (2 stages)

    @classmethod
    def check_run(cls, *, task: type, optimizer: Any, num_nodes: int) -> None:
        """Refuse, when a run is composed (tasks.cli.train.checks.check_strategy: before any process starts), a task
        that cannot cut its batches and losses into stages, and more than one node."""
        if not (isinstance(task, type) and issubclass(task, ZooTask) and task.pipelined):
            raise zoo.ConfigError(
                f"trainer=pp trains tasks that cut their batches and losses into stages "
                f"({', '.join(cls.task_hooks)}), such as task=generator, mlm or classifier, not "
                f"{task.__name__}; use trainer=ddp, fsdp or tp"
            )
        if num_nodes != 1:
            raise zoo.ConfigError(
                f"trainer.num_nodes={num_nodes}: trainer=pp cuts the model over the devices of one node; "
                f"set trainer.num_nodes=1, or use trainer=fsdp"
            )

    def connect(self, model: Any) -> None:
        """Refuse, in every process and before any of them waits for the others, what cannot be cut."""
        if not (isinstance(model, ZooTask) and model.pipelined):
            raise zoo.ConfigError(
                f"trainer=pp trains tasks that cut their batches and losses into stages "
                f"({', '.join(self.task_hooks)}), such as task=generator, mlm or classifier, not "
                f"{type(model).__name__}; use trainer=ddp, fsdp or tp"
            )
        if self.num_nodes != 1:
            raise zoo.ConfigError(
                f"trainer.num_nodes={self.num_nodes}: trainer=pp cuts the model over the devices of one node; "
                f"set trainer.num_nodes=1, or use trainer=fsdp"
            )
        if self.stage is None:
            check_pipeline(model.model, self.num_processes)
        super().connect(model)

    def parallelize(self, task: ZooTask) -> None:
        """Prune the task's model to this rank's stage, and the task's own modules with parameters (its
        heads, which ``pipeline_loss`` reads) to the last stage (ZooTask.configure_model asks it, at
        every fit and test)."""
        if self.stage is None:  # else testing after fitting: cut already
            self.stage = Stage(task.model, self.global_rank, self.world_size)
            if not self.stage.last:
                for name, module in list(task.named_children()):
                    if module is not task.model and any(True for _ in module.parameters()):
                        setattr(task, name, None)
            ends = [0, self.world_size - 1]  # the ranks of a tied embedding's two copies
            self._tied_group = dist.new_group(ends) if self.world_size > 2 else None  # every rank makes it
        if not self.stage.last:  # the last stage alone updates the metrics; their sync adds every rank's
            warnings.filterwarnings("ignore", message=r"The ``compute`` method of metric .* before the ``update``")

    # ---- one step: the schedule runs forward and backward -----------------------------------------
    def pipeline_step(self, task: ZooTask, batch: dict[str, Tensor], stage: str) -> Tensor:
        """The batch's loss at ``stage`` (train: gradients computed too), the same on every rank."""
        cut = task.pipeline_batch(batch)
        training = stage == "train"
        divisor = cut.items.clamp(min=1).to(torch.float32)
        if training:
            divisor = divisor * self.lightning_module.trainer.accumulate_grad_batches
        self._loss = (task, stage, cut.target, divisor)
        schedule = self._schedule_for(tuple(cut.inputs.shape), training)
        losses: list[Tensor] = []
        last = self.stage.last
        # the schedule cuts one target tensor into microbatches: the rows' numbers, which the loss looks up
        rows = torch.arange(cut.inputs.shape[0], device=self.root_device) if last else None
        args, target, extra = (cut.inputs,) if self.stage.first else (), rows, cut.extra
        if training:
            tied = tied_embedding(self.stage)
            earlier = None if tied is None else tied.grad  # this accumulation window's, already summed
            if tied is not None:
                tied.grad = None
            schedule.step(*args, target=target, losses=losses, return_outputs=False, **extra)
            self._sum_tied_gradients(earlier)
            self._grads = [(p, p.grad) for p in self.lightning_module.parameters() if p.grad is not None]
        else:
            schedule.eval(*args, target=target, losses=losses, **extra)
        total = torch.stack(losses).sum().detach().float() if last else torch.zeros((), device=self.root_device)
        if training:
            total = total * self.lightning_module.trainer.accumulate_grad_batches
        dist.broadcast(total, src=self.world_size - 1)
        return total

    def _loss_fn(self, hidden: Tensor, rows: Tensor) -> Tensor:
        task, stage, targets, divisor = self._loss
        return task.pipeline_loss(hidden, {k: v[rows] for k, v in targets.items()}, stage) / divisor

    def _schedule_for(self, shape: tuple[int, ...], training: bool) -> Any:
        """A stage and schedule per batch shape and mode: torch's stages fix their buffers' shapes at
        the first microbatch, and buffers made in inference mode cannot enter autograd."""
        key = (shape, training)
        if key not in self._schedules:
            n = max(d for d in range(1, min(self.microbatches, shape[0]) + 1) if shape[0] % d == 0)
            kind = SCHEDULES[self.schedule] if n >= self.world_size else ScheduleGPipe
            stage = PipelineStage(self.stage, self.global_rank, self.world_size, self.root_device)
            self._schedules[key] = kind(stage, n, loss_fn=self._loss_fn, scale_grads=False)
        return self._schedules[key]

    def _sum_tied_gradients(self, earlier: Tensor | None) -> None:
        """The first and last stages' copies of a tied embedding take the sum of this step's gradients
        (plus ``earlier``: those of the accumulation window so far)."""
        weight = tied_embedding(self.stage)
        if weight is None:
            return
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        dist.all_reduce(weight.grad, group=self._tied_group)
        if earlier is not None:
            weight.grad += earlier

    def backward(self, closure_loss: Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any) -> Tensor:
        """The schedule ran backward in ``pipeline_step``; Lightning has since zeroed the gradients
        (it does so between the training step and backward, at an accumulation window's start): put
        them back."""
        for param, grad in self._grads:
            param.grad = grad
        self._grads = []
        return closure_loss

    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        """The step, then the gradients cleared: the next window's schedule must not add to them."""
        out = super().optimizer_step(optimizer, closure, model, **kwargs)
        self.lightning_module.zero_grad(set_to_none=True)
        return out

    def stats_model(self, model: zoo.ZooModel) -> zoo.ModelConfig:
        return model.config  # a stage holds some layers: the throughput's FLOPs are the whole model's

    def whole_parameter_count(self, module: nn.Module) -> int:
        """The parameters of ``module`` (the task's model or the task) as one process holds them: every
        stage's, the copies of the first stage's on later ones (``Stage.copies``) uncounted.
        A collective: every rank calls it."""
        owned = zoo.count_parameters(module, excluding=self.stage.copies())  # a vocabulary's true rows
        total = torch.tensor(owned, device=self.root_device)
        dist.all_reduce(total)
        return int(total)

    # ---- every rank reads every batch -------------------------------------------------------------
    @property
    def replicas(self) -> tuple[int, int]:
        """One replica: every stage reads every batch."""
        return 1, 0

    # ---- clipping by the whole model's norm ---------------------------------------------------------
    def clip_grad_by_norm(self, optimizer: Optimizer, clip_val: float) -> None:
        """Clip by the norm of every stage's gradients, the tied copy on the last stage counted once."""
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        copies = {id(p) for p in self.stage.copies()}
        counted = [p.grad for p in params if id(p) not in copies]
        squares = sum((g.detach().float().pow(2).sum() for g in counted), torch.zeros((), device=self.root_device))
        dist.all_reduce(squares)
        torch.nn.utils.clip_grads_with_norm_(params, clip_val, squares.sqrt())

    # ---- checkpoints in zoo's layout, gathered by parameter name -------------------------------------
    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The whole model: every stage's tensors, the first copy of each (a tied or unused copy on a
        later stage yields to the first stage's); on rank 0 only."""
        own = {k: v.detach().cpu() for k, v in self.lightning_module.state_dict().items()}
        merged: dict[str, Any] = {}
        for state in self._gathered(own):
            for key, value in state.items():
                merged.setdefault(key, value)
        return merged

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """The optimizer's state as one process would hold it, its parameters numbered in the whole
        model's order (every stage's, group by group, in stage order); on rank 0 only."""
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer._optimizer
        names, state = self._named_groups(optimizer), optimizer.state_dict()
        flat = [name for group in names for name in group]
        by_name = {flat[i]: _to_cpu(entry) for i, entry in state["state"].items()}
        gathered = self._gathered((names, by_name))
        if not self.is_global_zero:
            return {}
        index, found = _whole_order([g[0] for g in gathered]), {}
        for _, entries in gathered:
            for name, entry in entries.items():
                found.setdefault(name, entry)
        groups = [
            {**group, "params": [index[n] for n in _unique(n for g in gathered for n in g[0][i])]}
            for i, group in enumerate(state["param_groups"])
        ]
        return {"state": {index[n]: entry for n, entry in found.items()}, "param_groups": groups}

    def own_model_state(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The tensors of this rank's stage."""
        own = self.lightning_module.state_dict()
        return {k: v for k, v in state.items() if k in own}

    def own_optimizer_state(self, optimizer: Any, state: dict[str, Any]) -> dict[str, Any]:
        """The entries of this stage's parameters, renumbered from the whole model's order to the stage's."""
        names = self._named_groups(optimizer)
        index = _whole_order(self._gathered(names, everyone=True))
        local = [n for group in names for n in group]
        entries = {i: state["state"][index[n]] for i, n in enumerate(local) if index[n] in state["state"]}
        bounds = [0, *itertools.accumulate(len(group) for group in names)]
        groups = [
            {**group, "params": list(range(bounds[i], bounds[i + 1]))} for i, group in enumerate(state["param_groups"])
        ]
        return {"state": entries, "param_groups": groups}

    def _named_groups(self, optimizer: Optimizer) -> list[list[str]]:
        """Each param group's parameters by name in the task."""
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer._optimizer
        names = {id(p): n for n, p in self.lightning_module.named_parameters()}
        return [[names[id(p)] for p in group["params"]] for group in optimizer.param_groups]

    def _gathered(self, obj: Any, *, everyone: bool = False) -> list[Any]:
        """``obj`` of every rank, in rank order: on rank 0 (every rank with ``everyone``); else []."""
        if everyone:
            out: list[Any] = [None] * self.world_size
            dist.all_gather_object(out, obj)
            return out
        out = [None] * self.world_size if self.is_global_zero else None
        dist.gather_object(obj, out, dst=0)
        return out or []


def _whole_order(groups_by_rank: list[list[list[str]]]) -> dict[str, int]:
    """Each parameter name's index in the whole model's optimizer: group by group, each group's names
    in stage order, a name held by several stages counted at its first."""
    order: dict[str, int] = {}
    for i in range(len(groups_by_rank[0])):
        for name in _unique(n for groups in groups_by_rank for n in groups[i]):
            order.setdefault(name, len(order))
    return order


def _unique(names: Any) -> list[str]:
    return list(dict.fromkeys(names))


def _to_cpu(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v.detach().cpu() if isinstance(v, Tensor) else v for k, v in entry.items()}
