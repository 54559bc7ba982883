"""Tensor parallelism (tasks/parallel.py, ``trainer=tp``): the row layout of the cut layers, the
refusals, the split model against the whole one on 2 CPU processes (gloo), and zoo-train on 2 processes
against 1: the same losses, checkpoints that load in one process and resume under tensor parallelism."""

from __future__ import annotations

import copy
import csv
import os
import socket
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from test_tasks import STEPS, TINY

import zoo
from tasks import GeneratorTask
from tasks.cli.loading import load_task
from tasks.cli.schemas import conf_dir
from tasks.parallel import (
    ShardedLinear,
    TensorParallelStrategy,
    check_tensor_parallel,
    cut,
    grad_norm,
    join,
    sharded_tensors,
    split_model,
)
from zoo.sublayer import Sublayer

# ---- the layout: each rank holds its slice of every segment ------------------------------------------


def test_each_rank_holds_its_slice_of_every_segment_and_join_undoes_cut():
    segments = [8, 4, 4]  # q of 4 heads, k and v of 2 KV heads, head width 2: [q; k; v]
    whole = torch.arange(16.0)[:, None].expand(16, 3)
    slices = [cut(whole, segments, 0, rank, 2) for rank in (0, 1)]
    assert slices[0][:, 0].tolist() == [0, 1, 2, 3, 8, 9, 12, 13]  # heads 0-1 of q, KV head 0 of k and of v
    assert slices[1][:, 0].tolist() == [4, 5, 6, 7, 10, 11, 14, 15]
    assert torch.equal(join(slices, segments, 0), whole)
    columns = torch.randn(3, 12)
    assert torch.equal(join([cut(columns, [12], 1, r, 4) for r in range(4)], [12], 1), columns)


# ---- refusals: one line naming the field and the fix -------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"n_heads": 3, "n_kv_heads": 1, "d_model": 96}, "model.n_heads=3"),
        ({"n_kv_heads": 1}, "model.n_kv_heads=1"),
        ({"d_ff": 351}, "model.d_ff=351"),
        ({"position": "alibi"}, "model.position='alibi'"),
        ({"ffn": "moe"}, "model.ffn='moe'"),
    ],
)
def test_what_cannot_be_split_is_refused(overrides, field):
    model = zoo.create_model("llama-tiny", **overrides)
    with pytest.raises(zoo.ConfigError, match="trainer") as error:
        check_tensor_parallel(model, 2)
    message = str(error.value)
    assert message.startswith(field) and "\n" not in message and "choose" in message
    check_tensor_parallel(zoo.create_model("llama-tiny"), 2)  # 4 heads, 2 KV heads, d_ff 352: split in two


def test_an_adapter_and_an_ffn_with_other_weights_are_refused():
    model = zoo.create_model("gpt-tiny")
    zoo.adapters.apply(model, "lora")
    with pytest.raises(zoo.ConfigError, match=r"^adapter: layer qkv is a LoRALinear.*adapter=none"):
        check_tensor_parallel(model, 2)

    class GatedFFN(Sublayer):  # a sublayer the plan does not know: its gate would see one rank's units
        def __init__(self) -> None:
            super().__init__()
            self.gate = torch.nn.Parameter(torch.ones(4))

    model = zoo.create_model("gpt-tiny")
    model.decoder.blocks[1].ffn = GatedFFN()
    with pytest.raises(zoo.ConfigError, match=r"^model.ffn='gelu' \(GatedFFN\) cannot be split by trainer=tp"):
        check_tensor_parallel(model, 2)


@pytest.mark.parametrize(
    ("settings", "first_words"),
    [({"devices": 2}, "model.d_ff=63 does not split over 2"), ({"devices": 1, "num_nodes": 2}, "trainer.num_nodes=2")],
)
def test_the_strategy_refuses_before_the_processes_wait_for_each_other(settings, first_words):
    """Every process (rank 0 and the ones it launches) runs connect before the process group exists."""
    trainer = L.Trainer(strategy=TensorParallelStrategy(), accelerator="cpu", logger=False, **settings)
    model = zoo.get_config("gpt-tiny").replace(d_ff=63).to_dict()
    task = GeneratorTask(model=model, optimizer={"lr": 1e-3, "weight_decay": 0.0, "betas": [0.9, 0.95]})
    with pytest.raises(zoo.ConfigError) as error:
        trainer.strategy.connect(task)
    assert str(error.value).startswith(first_words)
    assert trainer.precision_plugin.clip_grad_by_norm == trainer.strategy.clip_grad_by_norm  # the whole model's norm


def test_the_tp_trainer_composes_into_the_tensor_parallel_strategy():
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("train", overrides=["trainer=tp"]).trainer
    assert cfg.devices == 2 and cfg.use_distributed_sampler is False
    strategy = instantiate(cfg.strategy)
    assert isinstance(strategy, TensorParallelStrategy) and strategy._save_distributed_checkpoint is False


# ---- the split model against the whole one, on 2 processes --------------------------------------------

MODELS = {  # every form; GQA, a GLU, qk_norm and value_residual (whole weights that meet one rank's heads)
    "llama-tiny": {"qk_norm": "rmsnorm", "value_residual": True, "qkv_bias": True, "activation_checkpointing": "all"},
    "bert-tiny": {"mlm_head": True},
    "t5-tiny": {"position": "rope"},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _compare_split_with_whole(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        for preset, overrides in MODELS.items():
            whole = zoo.create_model(preset, seed=0, **overrides)
            model = copy.deepcopy(whole)
            split_model(model, dist.group.WORLD)
            layers = sharded_tensors(model)
            assert layers and all(isinstance(layer, ShardedLinear) for layer in layers.values())
            inputs = type(whole).example_inputs(whole.config)
            out, expected = model(**inputs), whole(**inputs)
            torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4, msg=preset)
            out.square().mean().backward()
            expected.square().mean().backward()
            params = dict(model.named_parameters())
            for name, param in whole.named_parameters():
                mine = params[name].grad
                if param.grad is None:  # a part the forward does not use (the pooler)
                    assert mine is None
                    continue
                grad = layers[name].whole(mine) if name in layers else mine
                torch.testing.assert_close(grad, param.grad, atol=1e-6, rtol=1e-4, msg=f"{preset} {name}")
            weights = {k: layers[k].whole(v) if k in layers else v for k, v in model.state_dict().items()}
            assert all(torch.equal(weights[k], v) for k, v in whole.state_dict().items())  # zoo's layout
            cut_ids = {id(model.get_parameter(k)) for k in layers}
            trained = [p for p in model.parameters() if p.grad is not None]
            norm = grad_norm(
                [p.grad for p in trained if id(p) in cut_ids],
                [p.grad for p in trained if id(p) not in cut_ids],
                dist.group.WORLD,
            )
            total = torch.nn.utils.get_total_norm([p.grad for p in whole.parameters() if p.grad is not None])
            torch.testing.assert_close(norm, total, msg=preset)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_split_models_compute_what_whole_ones_do():
    """Logits, every gradient (cut ones gathered) and the gradient norm, for a decoder, an encoder and an
    encoder-decoder; the gathered weights are the whole model's, in zoo's layout."""
    mp.spawn(_compare_split_with_whole, args=(_free_port(),), nprocs=2)


# ---- zoo-train: 2 processes against 1 -----------------------------------------------------------------

# GQA (4 heads, 2 KV heads) and a GLU, whose fused rows a plain contiguous cut would mix up
MODEL = ["model.n_heads=4", "model.n_kv_heads=2", "model/ffn=swiglu", "model.d_ff=64", "model.dropout=0"]
FASTER = ["trainer.val_check_interval=6", "task.sample_tokens=4"]  # one validation, a short sample


def _train(trainer: str, run: Path, *extra: str) -> subprocess.CompletedProcess:
    tiny = [a for a in TINY["gpt_generator"] if not a.startswith("model.n_heads=")]
    args = ["experiment=gpt_generator", *tiny, *STEPS, *MODEL, *FASTER, f"hydra.run.dir={run}"]
    done = subprocess.run(
        [sys.executable, "-m", "tasks.cli.train", *args, f"trainer={trainer}", *extra],
        cwd=run.parent,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _losses(run: Path) -> dict[int, float]:
    rows = csv.DictReader((run / "logs" / "metrics.csv").open())
    return {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The same 6 steps in one process and under tensor parallelism on two."""
    root = tmp_path_factory.mktemp("tp")
    _train("cpu", root / "one", "test=false")
    _train("tp", root / "tp")  # and tests the best checkpoint: Lightning configures the split model again
    return {"one": root / "one", "tp": root / "tp"}


@pytest.mark.slow
def test_tensor_parallel_training_matches_one_process(runs):
    one, tp = _losses(runs["one"]), _losses(runs["tp"])
    assert sorted(tp) == list(range(6))
    assert tp == pytest.approx(one, rel=1e-5)
    header = (runs["tp"] / "logs" / "metrics.csv").read_text().splitlines()[0]
    assert "test/loss" in header


@pytest.mark.slow
def test_a_tensor_parallel_checkpoint_is_a_one_process_checkpoint(runs):
    one = torch.load(runs["one"] / "checkpoints" / "last.ckpt", weights_only=True)
    tp = torch.load(runs["tp"] / "checkpoints" / "last.ckpt", weights_only=True)
    assert {k: v.shape for k, v in tp["state_dict"].items()} == {k: v.shape for k, v in one["state_dict"].items()}
    for name, value in one["state_dict"].items():
        torch.testing.assert_close(tp["state_dict"][name], value, atol=1e-6, rtol=1e-4, msg=name)
    for index, state in one["optimizer_states"][0]["state"].items():
        torch.testing.assert_close(tp["optimizer_states"][0]["state"][index], state, atol=1e-7, rtol=1e-3)
    task, _ = load_task(runs["tp"] / "checkpoints" / "last.ckpt")
    reference, _ = load_task(runs["one"] / "checkpoints" / "last.ckpt")
    ids = torch.randint(5, task.model.config.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(task.model(ids), reference.model(ids), atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_checkpoints_resume_across_one_process_and_tensor_parallel(runs, tmp_path):
    """Two more steps: under tensor parallelism from the one-process checkpoint, and in one process from
    the tensor-parallel one; weights, optimizer state and schedule come back in either direction."""
    more = ["trainer.max_steps=8", "test=false"]
    _train("tp", tmp_path / "tp", f"ckpt_path={runs['one'] / 'checkpoints' / 'last.ckpt'}", *more)
    _train("cpu", tmp_path / "one", f"ckpt_path={runs['tp'] / 'checkpoints' / 'last.ckpt'}", *more)
    tp, one = _losses(tmp_path / "tp"), _losses(tmp_path / "one")
    assert sorted(tp) == sorted(one) == [6, 7]
    assert tp == pytest.approx(one, rel=1e-5)
    weights = [
        torch.load(run / "checkpoints" / "last.ckpt", weights_only=True) for run in (tmp_path / "tp", tmp_path / "one")
    ]
    assert weights[0]["global_step"] == weights[1]["global_step"] == 8
    for name, value in weights[1]["state_dict"].items():
        torch.testing.assert_close(weights[0]["state_dict"][name], value, atol=1e-6, rtol=1e-4, msg=name)


def test_zoo_train_refuses_what_tp_cannot_split_before_it_claims_a_run_directory(tmp_path):
    """The strategy's check runs when the run is composed: one line, no run directory, no data read."""
    from test_tasks import compose_train

    from tasks.cli.checks import check_composition

    cfg = compose_train("gpt_generator", tmp_path / "run", "trainer=tp", "model.n_heads=3", "model.d_model=96")
    with pytest.raises(zoo.ConfigError, match=r"^model.n_heads=3 does not split over 2 tensor-parallel ranks"):
        check_composition(cfg)
    assert not (tmp_path / "run").exists()
    check_composition(compose_train("gpt_generator", tmp_path / "run", "trainer=tp"))  # gpt-tiny splits in two
