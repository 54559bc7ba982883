"""Tensor parallelism (tasks/parallel/, ``trainer=tp``): the row layout of the cut layers, the
refusals, the split model against the whole one on 2 CPU processes (gloo), sequence-parallel too, the
whole model counted by the reports, the replicas sharded by FSDP2 against the whole model (4 processes),
and zoo-train on 2 processes against 1 and as 2 replicas of a 2-way split (4 processes, whole or sharded)
against DDP on 2: the same losses, checkpoints that load and resume in one process."""

from __future__ import annotations

import copy
import socket
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from parallel_runs import losses, resume_both_ways, train

import zoo
from tasks import GeneratorTask
from tasks.cli.loading import load_task
from tasks.cli.schemas import conf_dir
from tasks.parallel.checks import check_tensor_parallel
from tasks.parallel.layers import (
    ShardedLinear,
    cut,
    grad_norm,
    join,
    sharded_tensors,
    split_model,
    whole_parameter_count,
)
from tasks.parallel.tensor import TensorParallelStrategy
from tasks.run import callbacks
from tasks.run.callbacks import Throughput, WholeSummary
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
    assert not strategy.fsdp and instantiate(cfg.strategy, data_parallel="fsdp").fsdp  # replicas whole by default


def test_the_group_size_not_the_device_count_must_divide_the_model():
    """trainer.devices=4 trainer.strategy.tensor_parallel_size=2: two replicas of a model split in two."""
    model = zoo.create_model("llama-tiny", n_heads=6, n_kv_heads=2, d_model=96, dropout=0.1)  # splits in 2, not 4
    TensorParallelStrategy.check_model(model, 4, tensor_parallel_size=2)
    refusals = [
        ({}, 4, r"^model.n_heads=6 does not split over 4 tensor-parallel ranks"),  # auto: every device
        ({"tensor_parallel_size": 2}, 3, r"^trainer.devices=3 do not form tensor-parallel groups of .*=2"),
        ({"tensor_parallel_size": 0}, 2, r"^trainer.strategy.tensor_parallel_size=0 must be"),
        ({"tensor_parallel_size": 2, "sequence_parallel": True}, 2, r"^model.dropout=0.1: under .*sequence_parallel"),
        ({"data_parallel": "zero3"}, 2, r"^trainer.strategy.data_parallel='zero3' must be one of replicate, fsdp"),
    ]
    for settings, devices, first_words in refusals:
        with pytest.raises(zoo.ConfigError, match=first_words) as error:
            TensorParallelStrategy.check_model(model, devices, **settings)
        assert "\n" not in str(error.value)
    with pytest.raises(zoo.ConfigError, match=r"^model.arch='encoder_decoder': trainer.strategy.sequence_parallel"):
        TensorParallelStrategy.check_model(zoo.create_model("t5-tiny", position="rope"), 2, sequence_parallel=True)


def test_throughput_counts_each_replicas_tokens_once_and_mfu_over_every_device(monkeypatch):
    """4 processes as 2 replicas of a 2-way split model: a rank's tokens count twice (the other rank of
    its group read the same ones), its FLOPs over the peak of 4 devices."""
    strategy = TensorParallelStrategy(tensor_parallel_size=2)
    strategy.parallel_devices = [torch.device("cpu")] * 4
    strategy._device_mesh = {"data_parallel": SimpleNamespace(size=lambda: 2, get_local_rank=lambda: 0)}
    logged = []
    logger = SimpleNamespace(log_metrics=lambda metrics, **_: logged.append(metrics))
    loop = SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=0))
    trainer = SimpleNamespace(
        world_size=4, strategy=strategy, global_step=0, callback_metrics={}, loggers=[logger], fit_loop=loop
    )
    task = SimpleNamespace(model=zoo.create_model("gpt-tiny"))
    monkeypatch.setattr(callbacks, "time", SimpleNamespace(perf_counter=iter([0.0, 4.0, 4.0]).__next__))
    throughput, batch = Throughput(peak_flops=1e9, window=2), {"input_ids": torch.zeros(2, 16, dtype=torch.long)}
    for i in range(2):  # two optimizer steps: the window's value is logged at the second
        throughput.on_train_batch_start(trainer, task, batch, i)
        trainer.global_step = i + 1
        throughput.on_train_batch_end(trainer, task, None, batch, i)
    counted = zoo.stats(task.model, seq_len=16)
    flops, causal = counted.flops_per_token_train, counted.flops_per_token_train_causal
    assert logged == [
        {
            "perf/tokens_per_s": 64 * 2 / 4,
            "perf/mfu": pytest.approx(64 * flops * 2 / 4 / 4 / 1e9),
            "perf/mfu_causal": pytest.approx(64 * causal * 2 / 4 / 4 / 1e9),
        }
    ]


# ---- the split model against the whole one, on 2 processes --------------------------------------------

MODELS = {  # every form; GQA, a GLU, qk_norm and value_residual (whole weights that meet one rank's heads)
    "llama-tiny": {"qk_norm": "rmsnorm", "value_residual": True, "qkv_bias": True, "activation_checkpointing": "all"},
    "bert-tiny": {"mlm_head": True, "vocab_size": 1000, "vocab_multiple_of": 128},  # 24 padding rows
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
            for sequence_parallel in (False, True) if not whole.config.form.cross_attention else (False,):
                _check_split(whole, sequence_parallel, f"{preset} sequence_parallel={sequence_parallel}")
    finally:
        dist.destroy_process_group()


def _check_split(whole: zoo.ZooModel, sequence_parallel: bool, msg: str) -> None:
    """In training (where sequence parallelism applies) and in evaluation."""
    whole.zero_grad()
    model = copy.deepcopy(whole)
    split_model(model, dist.group.WORLD, sequence_parallel=sequence_parallel)
    layers = sharded_tensors(model)
    assert layers and all(isinstance(layer, ShardedLinear) for layer in layers.values())
    inputs = type(whole).example_inputs(whole.config)
    out, expected = model(**inputs), whole(**inputs)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4, msg=msg)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))  # a loss of every output
    (out * probe).mean().backward()
    (expected * probe).mean().backward()
    params = dict(model.named_parameters())
    for name, param in whole.named_parameters():
        mine = params[name].grad
        if param.grad is None:  # a part the forward does not use (the pooler)
            assert mine is None
            continue
        grad = layers[name].whole(mine) if name in layers else mine
        atol = 1e-4 * param.grad.abs().max().item()  # relative to the tensor's scale
        torch.testing.assert_close(grad, param.grad, atol=atol, rtol=1e-4, msg=f"{msg} {name}")
    weights = {k: layers[k].whole(v) if k in layers else v for k, v in model.state_dict().items()}
    assert all(torch.equal(weights[k], v) for k, v in whole.state_dict().items())  # zoo's layout
    cut_ids = {id(model.get_parameter(k)) for k in layers}
    trained = [p for p in model.parameters() if p.grad is not None]
    sharded, rest = [p.grad for p in trained if id(p) in cut_ids], [p.grad for p in trained if id(p) not in cut_ids]
    total = torch.nn.utils.get_total_norm([p.grad for p in whole.parameters() if p.grad is not None])
    torch.testing.assert_close(grad_norm(sharded, rest, dist.group.WORLD), total, msg=msg)
    if sequence_parallel:  # a length the ranks cannot share, refused before any rank waits for the other
        with pytest.raises(zoo.ConfigError, match=r"^trainer.strategy.sequence_parallel=true: a training batch of 15"):
            model(**{k: v[:, :15] for k, v in inputs.items()})
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(**inputs), whole.eval()(**inputs), atol=1e-5, rtol=1e-4, msg=msg)
    whole.train()
    # the reports count the whole model once, not this rank's share
    count, length = zoo.count_parameters(whole), inputs["input_ids"].shape[1]
    contract = TensorParallelStrategy.__new__(TensorParallelStrategy)  # what the reports ask
    tp_trainer = SimpleNamespace(strategy=contract, precision="32-true")
    assert zoo.count_parameters(model) < count == whole_parameter_count(model)
    assert (
        Throughput()._flops(tp_trainer, SimpleNamespace(model=model), length)[0]  # attention counted whole
        == zoo.stats(whole, seq_len=length).flops_per_token_train
    )
    task = L.LightningModule()
    task.model, task._trainer = model, tp_trainer  # the summary asks the strategy's contract
    summary = WholeSummary(task, max_depth=1)
    held = sum(p.numel() for p in whole.parameters())  # the summary's count: padding rows held too
    assert summary.param_nums == [held] and summary.total_parameters == summary.trainable_parameters == held


@pytest.mark.slow
def test_split_models_compute_what_whole_ones_do():
    """Logits, every gradient (cut ones gathered) and the gradient norm, for a decoder, an encoder and an
    encoder-decoder, each stack's activations split along the sequence too (not the encoder-decoder's);
    the gathered weights are the whole model's, in zoo's layout; the reports count the whole model."""
    mp.spawn(_compare_split_with_whole, args=(_free_port(),), nprocs=2)


# ---- the replicas sharded by FSDP2, on 4 processes: 2 replicas of a 2-way split ---------------------------


class _Steps(L.LightningModule):
    """A task as shard_replicas takes one: its model, run by its training step."""

    def __init__(self, model: zoo.ZooModel) -> None:
        super().__init__()
        self.model = model

    def training_step(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model(**inputs)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The same 6 steps in one process and under tensor parallelism on two, sequence-parallel too."""
    root = tmp_path_factory.mktemp("tp")
    train("cpu", root / "one", "test=false")
    train("tp", root / "tp")  # and tests the best checkpoint: Lightning configures the split model again
    train("tp", root / "sp", "trainer.strategy.sequence_parallel=true", "test=false")
    return {"one": root / "one", "tp": root / "tp", "sp": root / "sp"}


@pytest.mark.slow
def test_tensor_parallel_training_matches_one_process(runs):
    one, tp = losses(runs["one"]), losses(runs["tp"])
    assert sorted(tp) == list(range(1, 7))
    assert tp == pytest.approx(one, rel=1e-5)
    header = (runs["tp"] / "logs" / "metrics.csv").read_text().splitlines()[0]
    assert "test/loss" in header


@pytest.mark.slow
def test_sequence_parallel_training_matches_one_process(runs):
    """Norms and residuals on 16 of the 32 positions per rank in training; validation (and its sampled
    text, one position at a time) on the whole sequence."""
    one, sp = losses(runs["one"]), losses(runs["sp"])
    assert sorted(sp) == list(range(1, 7)) and sp == pytest.approx(one, rel=1e-5)
    assert losses(runs["sp"], "val/loss") == pytest.approx(losses(runs["one"], "val/loss"), rel=1e-5)


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
    resume_both_ways("tp", runs, tmp_path)
    weights = [
        torch.load(run / "checkpoints" / "last.ckpt", weights_only=True) for run in (tmp_path / "tp", tmp_path / "one")
    ]
    assert weights[0]["global_step"] == weights[1]["global_step"] == 8
    for name, value in weights[1]["state_dict"].items():
        torch.testing.assert_close(weights[0]["state_dict"][name], value, atol=1e-6, rtol=1e-4, msg=name)


# ---- zoo-train: 2 replicas of a 2-way split model (4 processes) against DDP on 2 ------------------------


def test_zoo_train_refuses_what_tp_cannot_split_before_it_claims_a_run_directory(tmp_path):
    """The strategy's check runs when the run is composed: one line, no run directory, no data read."""
    from test_tasks import compose_train

    from tasks.cli.train.checks import check_composition

    cfg = compose_train("gpt_generator", tmp_path / "run", "trainer=tp", "model.n_heads=3", "model.d_model=96")
    with pytest.raises(zoo.ConfigError, match=r"^model.n_heads=3 does not split over 2 tensor-parallel ranks"):
        check_composition(cfg)
    assert not (tmp_path / "run").exists()
    check_composition(compose_train("gpt_generator", tmp_path / "run", "trainer=tp"))  # gpt-tiny splits in two


def test_zoo_train_checks_the_group_size_when_the_run_is_composed(tmp_path):
    """tasks.cli.train.checks.check_strategy hands the strategy its settings: 2 heads split over groups of 2 of
    the 4 devices, and not over 3 devices."""
    from test_tasks import compose_train

    from tasks.cli.train.checks import check_composition

    mesh = ["trainer=tp", "trainer.strategy.tensor_parallel_size=2", "model.n_heads=2"]
    check_composition(compose_train("gpt_generator", tmp_path / "run", *mesh, "trainer.devices=4"))
    with pytest.raises(zoo.ConfigError, match=r"^trainer.devices=3 do not form tensor-parallel groups"):
        check_composition(compose_train("gpt_generator", tmp_path / "run", *mesh, "trainer.devices=3"))
