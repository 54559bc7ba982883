"""zoo's own training strategies, each a :class:`tasks.strategy.ZooStrategy` beside its Lightning base.

- ``tensor``: ``trainer=tp``, :class:`TensorParallelStrategy` (the mesh, data parallelism, checkpoints);
  ``plan`` (which layers of each sublayer split how, read from the sublayers' declarations, and what
  cannot be split), ``layers`` (the Megatron layers and the split), ``checks`` (the strategy's settings),
  ``fsdp`` (FSDP2 over the replicas).
- ``pipeline``: ``trainer=pp``, :class:`PipelineParallelStrategy`.

The names below load on first use (PEP 562), as ``tasks``' own do: ``import tasks.parallel.plan`` loads
no Lightning. ``tasks.parallel.TensorParallelStrategy`` is the name stored run configs give
``trainer.strategy._target_``; the other names are what this module exported when it was one file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zoo.lazy import names_from

if TYPE_CHECKING:
    from tasks.parallel.checks import check_tensor_parallel
    from tasks.parallel.layers import (
        ShardedLinear,
        cut,
        grad_norm,
        join,
        sharded_tensors,
        split_model,
        whole_parameter_count,
    )
    from tasks.parallel.pipeline import PipelineParallelStrategy
    from tasks.parallel.tensor import TensorParallelStrategy, part, whole

_HOMES = {
    "TensorParallelStrategy": "tasks.parallel.tensor",
    "PipelineParallelStrategy": "tasks.parallel.pipeline",
    "part": "tasks.parallel.tensor",
    "whole": "tasks.parallel.tensor",
    "check_tensor_parallel": "tasks.parallel.checks",
    "ShardedLinear": "tasks.parallel.layers",
    "cut": "tasks.parallel.layers",
    "grad_norm": "tasks.parallel.layers",
    "join": "tasks.parallel.layers",
    "sharded_tensors": "tasks.parallel.layers",
    "split_model": "tasks.parallel.layers",
    "whole_parameter_count": "tasks.parallel.layers",
}

__getattr__ = names_from(__name__, _HOMES)

__all__ = [
    "PipelineParallelStrategy",
    "ShardedLinear",
    "TensorParallelStrategy",
    "check_tensor_parallel",
    "cut",
    "grad_norm",
    "join",
    "part",
    "sharded_tensors",
    "split_model",
    "whole",
    "whole_parameter_count",
]
