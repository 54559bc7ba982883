"""The run's machinery, beside the tasks it runs: its callbacks (progress, summary, crash saves,
throughput, non-finite stops), checkpoints (``ZooCheckpointIO``), exact resumption (``ResumeState``), its
directory's claim, its loggers and trackers, mixed precision's clipping, and what ``init_from`` reports."""
