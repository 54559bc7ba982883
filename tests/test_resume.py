"""Exact resume: the train samplers and loader pick up where a checkpoint left them, MLM masks and
dropout draw the same numbers, and a run stopped at step k and resumed gives bit-for-bit the same
per-step losses as one that never stopped."""

from __future__ import annotations

import io
import json
import random
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from test_tasks import compose_train

from tasks.cli.train.training import train
from tasks.data.loading import BucketBatchSampler, ListDataset, ResumableLoader, ShuffledBatchSampler
from tasks.run.resume import ResumeState

LENGTHS = [(i * 37) % 101 + 1 for i in range(203)]  # 203: no world size below divides it


def _samplers(world: int = 1, rank: int = 0, seed: int = 3) -> list:
    return [
        ShuffledBatchSampler(len(LENGTHS), 8, seed=seed, world=world, rank=rank),
        BucketBatchSampler(LENGTHS, 8, shuffle=True, seed=seed, window=4, world=world, rank=rank),
    ]


def _epoch(sampler, epoch: int) -> list[list[int]]:
    sampler.set_epoch(epoch)
    return list(sampler)


@pytest.mark.parametrize("kind", [0, 1], ids=["shuffled", "bucketed"])
def test_sampler_order_is_a_function_of_seed_and_epoch(kind):
    a, b = _samplers()[kind], _samplers()[kind]
    first = [list(a) for _ in range(3)]  # without set_epoch each iteration is the next epoch
    assert [_epoch(b, e) for e in (0, 1, 2)] == first
    assert _epoch(b, 1) == first[1]  # any epoch again, in any order
    assert first[0] != first[1] != first[2]
    assert _epoch(_samplers(seed=4)[kind], 0) != first[0]
    for batches in first:
        assert len(batches) == len(a) and all(batches)


@pytest.mark.parametrize("kind", [0, 1], ids=["shuffled", "bucketed"])
def test_resuming_at_batch_k_equals_dropping_the_first_k(kind):
    full = _epoch(_samplers()[kind], 2)
    for k in (0, 1, 5, len(full)):
        sampler = _samplers()[kind]
        sampler.resume(2, k)
        assert _epoch(sampler, 2) == full[k:]
        assert _epoch(sampler, 2) == full  # only the first iteration of that epoch starts late
    sampler = _samplers()[kind]
    sampler.resume(2, 5)
    assert _epoch(sampler, 3) == _epoch(_samplers()[kind], 3)  # a resume of another epoch is dropped
    assert _epoch(sampler, 2) == full


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", [0, 1], ids=["shuffled", "bucketed"])
def test_shards_are_disjoint_and_equally_long(kind, world):
    shards = [_epoch(_samplers(world, rank)[kind], 1) for rank in range(world)]
    assert len({len(s) for s in shards}) == 1 and len(shards[0]) == len(_samplers(world)[kind])
    seen = [i for shard in shards for batch in shard for i in batch]
    assert len(seen) == len(set(seen))  # no example on two processes
    if kind == 0:
        assert all(len(b) == 8 for shard in shards for b in shard)  # full blocks only
        assert len(seen) == len(LENGTHS) // world // 8 * 8 * world


def _loader(num_workers: int = 0) -> ResumableLoader:
    dataset = ListDataset(torch.arange(64 * 3).view(64, 3))

    def draw(batch: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        return {"x": batch, "noise": torch.rand(batch.shape[0], generator=generator)}

    return ResumableLoader(
        dataset, ShuffledBatchSampler(64, 4, seed=7), collate_fn=torch.stack, num_workers=num_workers, seed=7, draw=draw
    )


def _take(loader: ResumableLoader, epoch: int, n: int | None = None) -> list[dict[str, torch.Tensor]]:
    loader.batch_sampler.set_epoch(epoch)  # what Lightning does before every epoch
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            break
    return out


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """The same batches: equal tensors, and equal plain values (a batch's ``padded``, decided on the CPU)."""
    equal = lambda u, v: torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v
    return len(a) == len(b) and all(equal(x[k], y[k]) for x, y in zip(a, b, strict=True) for k in x)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_state_round_trip_continues_the_epoch(num_workers):
    full = _take(_loader(), 1)
    assert len(full) == 16
    stopped = _loader(num_workers)
    assert _same(_take(stopped, 1, 5), full[:5])  # workers read ahead; only handed-out batches count
    state = stopped.state_dict()
    assert state == {"epoch": 1, "batches": 5}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    resumed = _loader(num_workers)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    before = torch.get_rng_state()
    assert _same(_take(resumed, 1), full[5:])  # the random part too (``noise``)
    assert torch.equal(torch.get_rng_state(), before)  # the global RNG was left alone
    assert resumed.state_dict() == {"epoch": 1, "batches": 16}
    assert _same(_take(resumed, 2), _take(_loader(), 2))  # the next epoch starts at its beginning


def test_overfitting_repeats_the_first_epoch(tmp_path):
    from tasks.data import LMDataModule

    (tmp_path / "corpus.txt").write_text("\n".join(f"def f{i}(a, b):\n    return a * {i} + b\n" for i in range(300)))
    dm = LMDataModule(
        source="local",
        source_args={"path": str(tmp_path)},
        vocab_size=300,
        seq_len=16,
        batch_size=4,
        val_fraction=0.2,
        test_fraction=0.0,
    )
    dm.setup("fit")
    cpu = SimpleNamespace(root_device=torch.device("cpu"))
    dm.trainer = type("Trainer", (), {"overfit_batches": 4, "strategy": cpu})()  # what Lightning attaches
    loader = dm.train_dataloader()
    first = _take(loader, 0, 4)
    assert _same(_take(loader, 1, 4), first) and _same(_take(loader, 7, 4), first)
    dm.trainer = None
    assert not _same(_take(dm.train_dataloader(), 1, 4), first)


def test_mlm_training_masks_follow_the_batch_position_not_the_global_rng():
    from tasks.data import MLMDataModule

    dm = MLMDataModule(
        source="stdlib_docstrings",
        source_args={"packages": ["json", "email"]},
        vocab_size=200,
        seq_len=32,
        batch_size=16,
    )
    dm.setup("fit")
    torch.manual_seed(0)
    first = _take(dm.train_dataloader(), 0)
    torch.manual_seed(1)  # another global state: the same masks
    assert _same(_take(dm.train_dataloader(), 0), first)
    resumed = dm.train_dataloader()
    resumed.load_state_dict({"epoch": 0, "batches": 3})
    assert _same(_take(resumed, 0), first[3:])
    assert not _same(_take(dm.train_dataloader(), 1)[:1], first[:1])  # each epoch masks anew


def test_resume_state_restores_every_global_rng_through_a_weights_only_checkpoint():
    saver = ResumeState()
    L.seed_everything(5)
    state = saver.state_dict()
    expected = (random.random(), float(np.random.rand()), torch.rand(3))
    buffer = io.BytesIO()
    torch.save({"callbacks": {"ResumeState": state}}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)["callbacks"]["ResumeState"]

    L.seed_everything(6)
    restorer = ResumeState()
    restorer.load_state_dict(loaded)
    progress = SimpleNamespace(total=SimpleNamespace(processed=0))
    trainer = SimpleNamespace(
        global_rank=0,
        world_size=1,
        global_step=0,
        optimizers=[],
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)),
    )
    restorer.on_train_start(trainer, None)
    assert (random.random(), float(np.random.rand())) == expected[:2]
    assert torch.equal(torch.rand(3), expected[2])


# ---- whole runs -----------------------------------------------------------------------------------
class RecordLosses(L.Callback):
    """Writes {global step: exact training loss} to ``path`` after every step."""

    def __init__(self, path: str) -> None:
        self.path, self.losses = Path(path), {}

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.losses[trainer.global_step] = float(outputs["loss"])
        self.path.write_text(json.dumps(self.losses))


class CrashAt(L.Callback):
    """A kill in the middle of step ``step`` (after its forward and backward: dropout has drawn)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step + 1 == self.step:
            raise RuntimeError(f"killed in step {self.step}")


RESUMABLE = ["++callbacks.resume_state._target_=tasks.run.resume.ResumeState", "test=false"]


def _losses(experiment: str, out: Path, *extra: str) -> dict[int, float]:
    record = out.parent / f"{out.name}.json"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(
            compose_train(
                experiment,
                out,
                *RESUMABLE,
                "++callbacks.record._target_=test_resume.RecordLosses",
                f"++callbacks.record.path={record}",
                *extra,
            )
        )
    assert not [w for w in caught if "not resumable" in str(w.message)]  # Lightning's warning is gone
    return {int(k): v for k, v in json.loads(record.read_text()).items()}


def _crash(experiment: str, out: Path, step: int, like: Path, *extra: str) -> None:
    """A run like ``like`` (with its tokenizer: WordPiece training is not deterministic), killed in ``step``."""
    with pytest.raises(RuntimeError, match=f"killed in step {step}"):
        train(
            compose_train(
                experiment,
                out,
                *RESUMABLE,
                "++callbacks.crash._target_=test_resume.CrashAt",
                f"++callbacks.crash.step={step}",
                f"data.tokenizer_path={like / 'tokenizer.json'}",
                *extra,
            )
        )


RUNS = {  # experiment: settings (dropout on), epochs of a few steps, checkpoints at validations
    # epochs of 4 steps (limit_train_batches); last.ckpt at step 6 is mid-epoch, step 9 starts epoch 2
    "gpt_generator": ["++trainer.limit_train_batches=4"],
    # epochs of 3 batches: last.ckpt at step 6 ends epoch 1
    "bert_classifier": ["data.batch_size=96"],
    # epochs of 5 batches, validation every 5 steps: last.ckpt at step 5 ends epoch 0
    "bert_mlm": ["data.batch_size=64", "trainer.val_check_interval=5"],
    # epochs of 4 batches: last.ckpt at step 6 is mid-epoch
    "t5_translator": ["data.batch_size=96"],
}


@pytest.mark.slow
@pytest.mark.parametrize("experiment", list(RUNS))
def test_a_killed_run_resumes_bit_for_bit(experiment, tmp_path):
    """Killed in step 8 (after its backward: dropout has drawn), the run resumes from last.ckpt (the
    latest validation) and from on_exception.ckpt (step 7, written in the middle of step 8); both
    give the uninterrupted run's losses, to the bit."""
    run = ["model.dropout=0.1", "trainer.max_steps=10", *RUNS[experiment]]
    whole = _losses(experiment, tmp_path / "whole", *run)
    assert sorted(whole) == list(range(1, 11))
    _crash(experiment, tmp_path / "killed", 8, tmp_path / "whole", *run)
    for name in ("last", "on_exception"):
        checkpoint = tmp_path / "killed" / "checkpoints" / f"{name}.ckpt"
        start = torch.load(checkpoint, weights_only=True)["global_step"]
        assert start == (7 if name == "on_exception" else 5 if experiment == "bert_mlm" else 6)
        resumed = _losses(
            experiment, tmp_path / f"from_{name}", *run, f"ckpt_path={checkpoint}", "trainer.num_sanity_val_steps=1"
        )
        assert resumed == {s: whole[s] for s in range(start + 1, 11)}, name


@pytest.mark.slow
def test_a_finished_run_extended_with_more_steps_repeats_the_longer_run(tmp_path):
    """Resuming the final last.ckpt of a 5-step run with trainer.max_steps=8 gives the losses of an
    8-step run (a long warmup keeps the learning rate independent of max_steps)."""
    run = ["model.dropout=0.1", "scheduler.warmup_steps=100", *RUNS["gpt_generator"]]
    whole = _losses("gpt_generator", tmp_path / "whole", *run, "trainer.max_steps=8")
    _losses("gpt_generator", tmp_path / "short", *run, "trainer.max_steps=5")
    last = tmp_path / "short" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 5
    more = _losses("gpt_generator", tmp_path / "more", *run, "trainer.max_steps=8", f"ckpt_path={last}")
    assert more == {s: whole[s] for s in (6, 7, 8)}
