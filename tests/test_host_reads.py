"""No host read inside a training step under trainer=gpu (composed for the CPU): the host never waits for
the device to learn a value, except once per logging interval. A host read is ``aten._local_scalar_dense``
or ``aten.is_nonzero`` (``.item()``, ``float(t)``, ``bool(t)``), or an op whose output's size depends on
the values (``nonzero``, a boolean index, ``masked_select``, ``unique``, ``bincount``, ``repeat_interleave``
of a tensor of repeats): on a GPU the host waits for that size. They are counted by a TorchDispatchMode
over zoo-train's own loop, except in the data loader's collate, which works on the CPU on any machine.
And a NaN under fused AdamW stops the run at the logging interval, naming the step it happened at, with no
non-finite weights saved."""

from __future__ import annotations

import collections
import sys
from typing import Any

import lightning as L
import pytest
import torch
from omegaconf import open_dict
from test_gpu_config import GPU_ON_CPU
from test_tasks import TINY, compose_train
from torch.utils._python_dispatch import TorchDispatchMode
from torchmetrics import Accuracy, F1Score

import zoo
from tasks import TASKS
from tasks.classifier import MacroF1
from tasks.cli.train.training import train
from tasks.errors import DivergedError
from tasks.mlm import MaskedAccuracy, MLMTask

READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default}
# ops whose output's size depends on the values: the host learns that size from the device before it can
# go on (a sync on a GPU, no host read on the CPU); a boolean index is a nonzero inside index/index_put
SIZED_BY_DATA = {
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten.bincount.default,
    torch.ops.aten._unique.default,
    torch.ops.aten._unique2.default,
    torch.ops.aten.unique_dim.default,
    torch.ops.aten.unique_consecutive.default,
    torch.ops.aten.unique_dim_consecutive.default,
}
BOOL_INDEXED = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default}
DATA_PATH = ("tasks.data", "torch.utils.data")  # collate and draw: the batch on the CPU, before it is sent
N = 10  # trainer.log_every_n_steps in conf/trainer/default.yaml: steps N+1 .. 3N hold two logging intervals
COUNTED: dict[str, Any] = {}


def sized_by_data(func, args, kwargs) -> bool:
    """Whether the op's output size depends on its input's values."""
    if func in SIZED_BY_DATA:
        return True
    if func in BOOL_INDEXED:
        return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1])
    if func is torch.ops.aten.repeat_interleave.Tensor:  # the repeats alone, no output_size given
        return kwargs.get("output_size") is None
    return False


def in_data_path() -> bool:
    """Whether the op runs in the data loader's collate or draw (CPU tensors on any machine)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith(DATA_PATH):
            return True
        frame = frame.f_back
    return False


class HostReads(TorchDispatchMode):
    """Counts, by op, the host reads and the ops sized by data dispatched while it is on, outside the data
    path (the collate and the masked LM's draw work on CPU tensors before the batch is sent, on any machine:
    nothing there waits for a device)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func in READS or sized_by_data(func, args, kwargs)) and not in_data_path():
            self.reads[str(func)] += 1
        return func(*args, **kwargs)


class CountHostReads(L.Callback):
    """Counts the host reads of steps N+1 .. 3N (from the start of the one to the start of the step after
    the other: the step's data, forward, backward, update, logging and progress bar) into ``COUNTED``."""

    def __init__(self, name: str) -> None:
        self.name, self.mode = name, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == N and self.mode is None:
            self.mode = HostReads().__enter__()
        elif trainer.global_step == 3 * N and self.name not in COUNTED:
            self.mode.__exit__(None, None, None)
            COUNTED[self.name] = self.mode.reads


SETTINGS = [  # steps N .. 3N in one epoch with no validation, at the default logging interval
    f"trainer.log_every_n_steps={N}",
    f"trainer.max_steps={3 * N + 1}",
    "trainer.val_check_interval=1000",
    "data.batch_size=4",  # a new epoch's DataLoader iterator draws its seed with a read (torch's, once an epoch)
    "test=false",
]


@pytest.mark.slow  # tens of seconds on 2 cores: CI's slow pass runs it
@pytest.mark.parametrize("experiment", list(TINY))
def test_a_training_step_reads_nothing_from_the_device_but_once_per_logging_interval(experiment, tmp_path):
    """At most 0.25 reads per step at the default interval of 10. Measured (CPU, 2026-12-06, this test):
    0.20 for every experiment, 4 ``_local_scalar_dense`` over 20 steps and no op sized by data (4.4 reads
    before for the generator, 6.5 for the classifier and masked LM, 7.5 for the translator; then, with the
    ops sized by data counted, 1.2 for the classifier (torchmetrics' bincount in its F1) and 7.2 for the
    masked LM (the boolean index of the chosen positions, forward and backward, and torchmetrics' ignore_index
    and label check)). What remains, per interval: the guard's one read (StopOnNonFinite: the non-finite
    flags and the loss the progress bar shows) and Lightning's conversion of the logged train/loss for the
    loggers (logger_connector.log_metrics)."""
    counter = f"+callbacks.count_reads={{_target_:{__name__}.CountHostReads,name:{experiment}}}"
    cfg = compose_train(experiment, tmp_path, *GPU_ON_CPU, *SETTINGS, counter)
    with open_dict(cfg):
        cfg.callbacks.rich_progress_bar = {"_target_": "tasks.run.callbacks.ProgressBar"}  # the bar a user sees
    assert cfg.trainer.precision == "bf16-mixed" and cfg.trainer.log_every_n_steps == N
    train(cfg)
    reads = COUNTED[experiment]
    per_step = reads.total() / (2 * N)
    assert per_step <= 0.25, f"{reads.total()} host reads over {2 * N} steps: {dict(reads)}"


def test_the_counter_sees_each_op_sized_by_data_and_not_a_selection_by_indices():
    x, mask = torch.randn(4, 3, requires_grad=True), torch.tensor([True, False, True, True])
    with HostReads() as mode:
        x[mask].sum().backward()  # index with a boolean index, and index_put with it in backward
        x.detach().masked_select(mask[:, None]), mask.nonzero(), torch.unique(mask), torch.bincount(mask.long())
        torch.repeat_interleave(torch.tensor([1, 2])), float(x.detach().sum())
        x.index_select(0, torch.tensor([0, 2, 3])), torch.repeat_interleave(torch.tensor([1, 2]), output_size=3)
    assert dict(mode.reads) == {
        "aten.index.Tensor": 1,
        "aten.index_put.default": 1,
        "aten.masked_select.default": 1,
        "aten.nonzero.default": 1,
        "aten._unique2.default": 1,
        "aten.bincount.default": 1,
        "aten.repeat_interleave.Tensor": 1,
        "aten._local_scalar_dense.default": 1,
    }


def test_the_masked_lms_accuracy_is_torchmetrics_accuracy_with_ignore_index():
    """MaskedAccuracy (a mask, no boolean index) against torchmetrics' micro Accuracy over the entries that
    count, with and without a mask, and over a batch where none counts."""
    torch.manual_seed(0)
    ours, theirs = MaskedAccuracy(), Accuracy(task="multiclass", num_classes=5, ignore_index=-100)
    for n, share in ((9, 1.0), (12, 0.5), (6, 0.0)):
        predictions, labels = torch.randint(0, 5, (n,)), torch.randint(0, 5, (n,))
        counts = torch.rand(n) < share
        ours.update(predictions, labels, None if share == 1.0 else counts)
        theirs.update(predictions, labels.masked_fill(~counts, -100))
    assert torch.allclose(ours.compute(), theirs.compute())


def test_a_pipelines_masked_lm_loss_reads_nothing_from_the_device():
    """trainer=pp's last stage: a microbatch's masked-LM loss and accuracy from the collate's row-by-row
    positions, with no op sized by data (it found them with a nonzero of the labels before)."""
    task = MLMTask(model=zoo.get_config("bert-tiny", mlm_head=True).to_dict(), optimizer={"lr": 1e-3})
    labels = torch.full((2, 6), -100).index_put_((torch.tensor([0, 0, 1]), torch.tensor([1, 4, 2])), torch.tensor(7))
    target = {"labels": labels, "chosen_rows": torch.tensor([[1, 4], [2, -1]])}
    hidden = torch.randn(2, 6, task.model.config.d_model, requires_grad=True)
    with HostReads() as mode:
        task.pipeline_loss(hidden, target, "train").backward()
    assert not mode.reads, dict(mode.reads)
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(
            task.model.mlm_logits(hidden[[0, 0, 1], [1, 4, 2]]), torch.full((3,), 7), reduction="sum"
        )
        torch.testing.assert_close(task.pipeline_loss(hidden, target, "val"), want)


def test_the_classifiers_f1_is_torchmetrics_macro_f1():
    """MacroF1 (no bincount) against torchmetrics' F1Score over batches where some labels never occur."""
    torch.manual_seed(0)
    for n in (2, 3, 7):
        ours, theirs = MacroF1(n), F1Score(task="multiclass", num_classes=n, average="macro")
        for _ in range(4):
            logits, labels = torch.randn(9, n), torch.randint(0, max(1, n - 2), (9,))
            ours.update(logits, labels), theirs.update(logits, labels)
        assert torch.allclose(ours.compute(), theirs.compute()), n


def _nan_at(step: int, monkeypatch) -> None:
    """The generator's training loss is NaN at optimizer step ``step`` (1-based)."""
    task = TASKS.get("generator")
    honest = task.training_loss

    def loss(self, batch):
        value = honest(self, batch)
        return value * float("nan") if self.trainer.global_step + 1 == step else value

    monkeypatch.setattr(task, "training_loss", loss)


def test_a_nan_under_fused_adamw_stops_at_the_next_check_naming_its_step_and_saves_no_nan(tmp_path, monkeypatch):
    """The loss turns NaN at step 6; fused AdamW skips that step on the device and the run goes on to the
    validation of step 8, whose check stops it before its checkpoints: the DivergedError names step 6,
    the weights are still finite, and every checkpoint on disk (last.ckpt of step 4) is finite."""
    _nan_at(6, monkeypatch)
    cfg = compose_train(
        "gpt_generator", tmp_path, *GPU_ON_CPU, *SETTINGS, "trainer.val_check_interval=4", "trainer.max_steps=12"
    )
    with pytest.raises(DivergedError, match=r"training diverged at step 6: train/loss is nan") as error:
        train(cfg)
    assert "stopped before the weights became NaN" in str(error.value)
    saved = sorted((tmp_path / "checkpoints").glob("*.ckpt"))
    assert saved and not (tmp_path / "checkpoints" / "on_exception.ckpt").exists()
    for path in saved:
        checkpoint = torch.load(path, weights_only=True)
        assert checkpoint["global_step"] == 4, path
        assert all(torch.isfinite(v).all() for v in checkpoint["state_dict"].values() if v.is_floating_point())


class StopStep(L.Callback):
    """Records the optimizer steps taken when training stopped on an exception, into ``COUNTED``."""

    def on_exception(self, trainer, pl_module, exception) -> None:
        COUNTED["stopped at"] = trainer.global_step


def test_a_nan_between_logging_intervals_stops_at_the_interval(tmp_path, monkeypatch):
    """No validation in between: the NaN of step 3 stops the run at the logging interval, step 10."""
    _nan_at(3, monkeypatch)
    cfg = compose_train(
        "gpt_generator", tmp_path, *GPU_ON_CPU, *SETTINGS, f"+callbacks.stop_step._target_={__name__}.StopStep"
    )
    with pytest.raises(DivergedError, match=r"training diverged at step 3: train/loss is nan"):
        train(cfg)
    assert COUNTED.pop("stopped at") == N
