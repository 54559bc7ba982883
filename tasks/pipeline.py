"""The old home of ``trainer=pp``'s strategy, kept so that stored run configs that name
``tasks.pipeline.PipelineParallelStrategy`` resume, and old imports work: it lives in
tasks.parallel.pipeline."""

from tasks.parallel.pipeline import SCHEDULES, PipelineBatch, PipelineParallelStrategy

__all__ = ["SCHEDULES", "PipelineBatch", "PipelineParallelStrategy"]
