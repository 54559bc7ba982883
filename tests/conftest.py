import os
import shutil
import tempfile

import pytest
import torch

import zoo


def tiny_config(**overrides) -> zoo.ModelConfig:
    """A model small enough to run forward and backward in milliseconds."""
    base = dict(
        vocab_size=61, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_seq_len=64, init_std=0.2, ffn_multiple_of=16
    )
    return zoo.ModelConfig(**{**base, **overrides})


def tiny_model(seed: int = 0, **overrides) -> zoo.ZooModel:
    return zoo.build_model(tiny_config(**overrides), seed=seed).eval()


@pytest.fixture(autouse=True)
def _seed():
    """Each test starts from seed 0, and ends with torch's thread count as it found it: a test that runs a
    script's ``--threads`` in this process would otherwise leave it to later tests, whose in-process runs then
    add in another order than the processes they start (the last bits of a loss: an exact-resume test fails)."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def gpt_base(tmp_path_factory):
    """last.ckpt of a tiny gpt_generator run, trained once for every test module that starts from it."""
    from test_tasks import compose_train

    from tasks.cli.train.training import train

    run_dir = tmp_path_factory.mktemp("base")
    train(compose_train("gpt_generator", run_dir, "test=false"))
    return run_dir / "checkpoints" / "last.ckpt"


def pytest_configure(config):
    """Tests compose zoo-train's config as the verb does: its schemas and sweeper registered first.
    Prepared corpora go to a cache of this session (the processes the tests start inherit it), never
    to the user's ~/.cache/zoo."""
    from tasks.cli.schemas import register_configs
    from tasks.data.prepared import CACHE_ENV

    register_configs()
    config.zoo_cache = tempfile.mkdtemp(prefix="zoo-test-cache-")
    os.environ[CACHE_ENV] = config.zoo_cache


def pytest_unconfigure(config):
    if getattr(config, "zoo_cache", None):
        shutil.rmtree(config.zoo_cache, ignore_errors=True)
