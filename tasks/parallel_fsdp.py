"""The old home of FSDP2 over tensor parallelism's replicas, kept so that old imports work: it lives in
tasks.parallel.fsdp."""

from tasks.parallel.fsdp import STEPS, local, shard_like, shard_replicas, sum_over_group, whole_over_replicas

__all__ = ["STEPS", "local", "shard_like", "shard_replicas", "sum_over_group", "whole_over_replicas"]
