"""zoo's own training strategies, each a :class:`tasks.strategy.ZooStrategy` beside its Lightning base.

- ``base``: ``SplitStrategy``, the Lightning overrides of a strategy that splits the model, once.
- ``tensor``: ``trainer=tp``, ``TensorParallelStrategy`` (the mesh, data parallelism, checkpoints);
  ``plan`` (which layers of each sublayer split how, read from the sublayers' declarations, and what
  cannot be split), ``layers`` (the Megatron layers and the split), ``checks`` (the strategy's settings),
  ``fsdp`` (FSDP2 over the replicas).
- ``pipeline``: ``trainer=pp``, ``PipelineParallelStrategy``.

Each is imported from its module (``import tasks.parallel.plan`` loads no Lightning); conf/ names each
strategy there (``tasks.parallel.tensor.TensorParallelStrategy``). A run stored before names it by the
package, which resume maps (``tasks.cli.conf_rules.MOVED``).
"""
