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
    """Each test starts from seed 0, and ends with torch's thread count and ``OMP_NUM_THREADS`` as it found
    them: Lightning's launchers set both for the processes they start (one thread each of two), and a test
    that starts them in this process would leave them to later tests, whose in-process runs would then add
    in another order than the processes they start (the last bits of a loss: an exact-resume test fails)."""
    torch.manual_seed(0)
    threads, variable = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    if os.environ.get("OMP_NUM_THREADS") != variable:
        if variable is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = variable


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
