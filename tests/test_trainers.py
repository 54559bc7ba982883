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


GPU_USE = {  # each trainer file with the settings its use on GPUs has (conf/trainer/*.yaml, scripts/gpu_check.sh)
    "gpu": [],
    "ddp": ["trainer.accelerator=gpu", "trainer.precision=bf16-mixed"],
    "fsdp": [],
    "tp": ["trainer.accelerator=gpu", "trainer.precision=bf16-mixed"],
    "pp": ["trainer.accelerator=gpu", "trainer.precision=bf16-mixed"],
}


@pytest.mark.parametrize("experiment", ["gpt_generator", "bert_classifier"])
@pytest.mark.parametrize("name", list(GPU_USE))
def test_each_trainer_file_composes_for_gpus_and_builds_its_trainer(name, experiment, tmp_path):
    """Composed as a GPU user runs it (bf16-mixed, fused AdamW by default, clipping), passing zoo-train's
    composition checks; the Trainer built from it on the CPU (FSDP: its strategy; Lightning runs FSDP on CUDA
    only) has Lightning's mixed-precision plugin, whose refusal to clip fused optimizers zoo's tasks get round."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    from tasks.cli.train.checks import check_composition

    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[f"experiment={experiment}", f"trainer={name}", *GPU_USE[name], f"paths.output_dir={tmp_path}"],
        )
    assert cfg.trainer.accelerator == "gpu" and cfg.trainer.precision == "bf16-mixed"
    assert cfg.trainer.gradient_clip_val > 0 and cfg.optimizer.fused is None  # null: fused on GPUs
    check_composition(cfg)
    if name == "fsdp":
        return  # its strategy is built in test_fsdp_wraps_each_block
    trainer = instantiate(cfg.trainer, accelerator="cpu", devices=1 if name == "gpu" else 2, logger=False)
    assert isinstance(trainer.precision_plugin, MixedPrecision) and trainer.precision_plugin.scaler is None
    assert trainer.gradient_clip_val == cfg.trainer.gradient_clip_val
