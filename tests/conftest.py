import pytest
import torch

import zoo


def tiny_config(**overrides) -> zoo.ModelConfig:
    """A model small enough to run forward and backward in milliseconds."""
    base = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_seq_len=64, init_std=0.2,
                ffn_multiple_of=16)
    return zoo.ModelConfig(**{**base, **overrides})


def tiny_model(seed: int = 0, **overrides) -> zoo.ZooModel:
    return zoo.build_model(tiny_config(**overrides), seed=seed).eval()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_configure(config):
    """Tests compose zoo-train's config as the verb does: its schemas and sweeper registered first."""
    from tasks.cli.common import register_configs

    register_configs()
