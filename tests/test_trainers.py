"""Trainer presets compose, and FSDP's wrap policy (checked here; Lightning runs FSDP on CUDA only)
makes one unit per transformer block of every form."""

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

import zoo
from tasks.cli.schemas import conf_dir


def _trainer_cfg(name: str):
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose("train", overrides=[f"trainer={name}"]).trainer


@pytest.mark.parametrize("preset", ["gpt-tiny", "bert-tiny", "t5-tiny"])
def test_fsdp_wraps_each_block(preset):
    from lightning.pytorch.strategies import FSDPStrategy

    cfg = _trainer_cfg("fsdp")
    assert cfg.accelerator == "gpu" and cfg.precision == "bf16-mixed"
    strategy = instantiate(cfg.strategy)
    assert isinstance(strategy, FSDPStrategy)
    model = zoo.create_model(preset)
    units = strategy.kwargs["auto_wrap_policy"]._run_policy(model, set(), {})
    blocks = [m for m in model.modules() if isinstance(m, zoo.blocks.Block)]
    assert len(blocks) == sum(len(s.blocks) for s in model.stacks()) > 0
    assert set(units) == set(blocks)  # the embeddings and the head stay in the root unit


@pytest.mark.parametrize("name", ["cpu", "gpu", "ddp", "fsdp"])
def test_trainer_presets_compose(name):
    cfg = _trainer_cfg(name)
    assert cfg._target_ == "lightning.pytorch.trainer.Trainer"
    assert cfg.use_distributed_sampler is False  # zoo's data modules shard themselves
