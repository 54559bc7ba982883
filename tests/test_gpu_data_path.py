"""trainer=gpu feeds the GPU: data workers that persist, batches in pinned memory (which Lightning copies to
the device without blocking); trainer=cpu keeps the data path it had (no workers, nothing pinned)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from test_tasks import TINY

from tasks.cli.schemas import conf_dir
from tasks.data.loading import feeding


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose("train", overrides=list(overrides))


@pytest.mark.parametrize("experiment", list(TINY))
def test_the_gpu_trainer_gives_the_data_workers_and_the_cpu_trainer_none(experiment):
    gpu, cpu = (_compose(f"experiment={experiment}", f"trainer={t}") for t in ("gpu", "cpu"))
    assert gpu.data.num_workers > 0 and cpu.data.num_workers == 0
    assert (gpu.trainer.accelerator, gpu.trainer.precision) == ("gpu", "bf16-mixed")
    assert gpu.trainer.max_steps == cpu.trainer.max_steps  # the experiment's settings still win
    assert _compose(f"experiment={experiment}", "trainer=gpu", "data.num_workers=0").data.num_workers == 0


def test_batches_are_pinned_for_a_gpu_and_workers_persist_where_there_are_any():
    assert feeding("cuda", 4) == {"pin_memory": True, "persistent_workers": True}
    assert feeding("cpu", 0) == {"pin_memory": False, "persistent_workers": False}
    assert feeding("cpu", 2) == {"pin_memory": False, "persistent_workers": True}


def test_a_data_module_pins_its_batches_when_the_trainer_runs_on_a_gpu(tmp_path):
    cfg = _compose("experiment=gpt_generator", *TINY["gpt_generator"], "data.num_workers=0")
    datamodule = instantiate(cfg.data, _convert_="all", _recursive_=False)
    datamodule.setup("fit")
    assert not datamodule.train_dataloader().pin_memory and not datamodule.val_dataloader().pin_memory
    datamodule.trainer = SimpleNamespace(
        strategy=SimpleNamespace(root_device=torch.device("cuda", 0)), overfit_batches=0
    )
    assert datamodule.train_dataloader().pin_memory and datamodule.val_dataloader().pin_memory


def test_a_masked_lm_batch_drawn_after_the_loader_is_pinned_for_a_gpu(monkeypatch):
    """The masked LM draws its masks in the main process, after the loader pinned the padded batch: the
    drawn tensors are new, so they are pinned there too (a pageable batch's copy to the GPU waits for the
    stream). CPU-only here: pin_memory is replaced by a stand-in that records what it pinned."""
    from tasks.data import loading
    from tasks.data.loading import ListDataset, ResumableLoader, ShuffledBatchSampler

    held: list[torch.Tensor] = []

    def pin(tensor: torch.Tensor) -> torch.Tensor:
        held.append(tensor.clone())
        return held[-1]

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    monkeypatch.setattr(loading.torch.cuda, "is_available", lambda: True)

    def draw(batch: torch.Tensor, generator: torch.Generator) -> dict:
        return {"input_ids": batch + 1, "chosen": [torch.randperm(3, generator=generator)], "padded": 0}

    data = ListDataset(torch.arange(24).view(8, 3))
    for pins in (False, True):
        held.clear()
        loader = ResumableLoader(data, ShuffledBatchSampler(8, 4, seed=0), collate_fn=torch.stack, draw=draw)
        loader.pin_memory = pins  # what feeding("cuda", ...) gives (the DataLoader's own pinning: off on a CPU)
        for batch in loader:
            tensors = [batch["input_ids"], *batch["chosen"]]
            assert all(any(t is h for h in held) for t in tensors) == pins and batch["padded"] == 0
