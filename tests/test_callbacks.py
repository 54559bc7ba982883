"""zoo's own training callbacks at tiny size."""

import lightning as L
import pytest
import torch
from torch import nn

from tasks.run.callbacks import CrashCheckpoint


class Steps(L.LightningModule):
    """A linear model on random data that raises at ``fail_at`` (a crash mid-training)."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.fail_at = fail_at
        self.ran = 0  # training steps this run executed

    def training_step(self, batch, batch_idx):
        self.ran += 1
        if self.fail_at is not None and self.global_step == self.fail_at:
            raise RuntimeError("crash")
        return self.layer(batch).pow(2).mean()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(tmp_path, max_steps: int) -> L.Trainer:
    return L.Trainer(
        max_steps=max_steps,
        callbacks=[CrashCheckpoint(tmp_path / "checkpoints")],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )


def test_crash_leaves_a_checkpoint_and_a_new_run_does_not_resume_from_it(tmp_path):
    with pytest.raises(RuntimeError, match="crash"):
        _trainer(tmp_path, max_steps=10).fit(Steps(fail_at=3))
    saved = tmp_path / "checkpoints" / "on_exception.ckpt"
    assert torch.load(saved, weights_only=True)["global_step"] == 3

    fresh, model = _trainer(tmp_path, max_steps=5), Steps()
    fresh.fit(model)  # no ckpt_path: starts at step 0 although a checkpoint lies in its directory
    assert (fresh.global_step, model.ran) == (5, 5)

    resumed, model = _trainer(tmp_path, max_steps=5), Steps()
    resumed.fit(model, ckpt_path=saved)  # asked to resume: continues from step 3
    assert (resumed.global_step, model.ran) == (5, 2)


def test_a_resume_that_fails_to_load_leaves_the_crash_checkpoint_alone(tmp_path):
    with pytest.raises(RuntimeError, match="crash"):
        _trainer(tmp_path, max_steps=10).fit(Steps(fail_at=3))
    saved = tmp_path / "checkpoints" / "on_exception.ckpt"
    before = saved.read_bytes()
    other = Steps()
    other.layer = nn.Linear(4, 2)  # its weights do not fit the checkpoint: restoring fails before any step
    with pytest.raises(RuntimeError, match="size mismatch"):
        _trainer(tmp_path, max_steps=10).fit(other, ckpt_path=saved)
    assert saved.read_bytes() == before  # not replaced by an untrained model that never stepped
