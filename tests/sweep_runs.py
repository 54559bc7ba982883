"""A tiny sweep's command line, and zoo-train -m run in the test's own process.

Shared by tests/test_sweep*.py; tests/test_sweep_errors.py imports these names from tests/test_sweep.py.
"""

from __future__ import annotations

import sys

# the gpt_generator experiment at seconds a trial (as in test_tasks.py), without progress bars
TINY = [
    "experiment=gpt_generator",
    "data.source_args.max_files=40",
    "data.vocab_size=300",
    "data.seq_len=32",
    "model.d_model=32",
    "model.n_heads=2",
    "model.n_layers=1",
    "trainer.max_steps=6",
    "trainer.val_check_interval=3",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1",
    "trainer.num_sanity_val_steps=0",
    "test=false",
    "task.sample_tokens=4",
    "callbacks.rich_progress_bar=null",
    "callbacks.rich_model_summary=null",
    "callbacks.throughput=null",
]
SEARCH = [
    "hydra/sweeper=zoo_optuna",
    "optimizer.lr=tag(log, interval(1e-4, 1e-2))",
    "scheduler.warmup_steps=choice(0, 2)",
    "hydra.sweeper.sampler=random",
    "hydra.sweeper.seed=0",
]


def _in_process(args: list[str], monkeypatch) -> None:
    """zoo-train -m in this process (saves the start-up of a new one)."""
    from tasks.cli import verbs

    monkeypatch.setattr(sys, "argv", ["zoo-train", "-m", *args])
    verbs.train()
