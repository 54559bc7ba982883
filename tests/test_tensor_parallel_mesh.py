"""Tensor parallelism beside data parallelism (tasks/parallel/, ``trainer=tp`` with
``tensor_parallel_size`` below ``trainer.devices``): 2 replicas of a 2-way split model on 4 gloo processes,
replicated or sharded by FSDP2 (``data_parallel=fsdp``), against DDP on 2: the same gradients, losses and
checkpoints, and resumes across one process, DDP and the mesh."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from parallel_runs import losses, train
from test_tensor_parallel import MODELS, _free_port, _Steps
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

import zoo
from tasks.parallel.fsdp import local, shard_replicas, sum_over_group
from tasks.parallel.layers import cut_parameters, grad_norm, sharded_tensors, split_model
from tasks.parallel.tensor import part, whole


def _compare_sharded_replicas_with_whole(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data_parallel", "tensor_parallel"))
        for preset, overrides in MODELS.items():
            whole_model = zoo.create_model(preset, seed=0, **overrides)
            for sequence_parallel in (False, True) if not whole_model.config.form.cross_attention else (False,):
                _check_sharded_replicas(whole_model, mesh, sequence_parallel, f"{preset} sp={sequence_parallel}")
    finally:
        dist.destroy_process_group()


def _check_sharded_replicas(whole_model: zoo.ZooModel, mesh: DeviceMesh, sequence_parallel: bool, msg: str) -> None:
    """Replica r trains on batch r; the gradients (every shard gathered, the slices joined) are the whole
    model's averaged over both batches, the norm is theirs, and the state goes to zoo's layout and back."""
    group, replicas = mesh["tensor_parallel"].get_group(), mesh["data_parallel"]
    whole_model.zero_grad()
    task = _Steps(copy.deepcopy(whole_model))
    inputs = type(whole_model).example_inputs(whole_model.config)
    batches = [inputs, {k: v.flip(1) for k, v in inputs.items()}]  # the second replica's
    probe = torch.randn(whole_model(**inputs).shape, generator=torch.Generator().manual_seed(0))
    for batch in batches:
        (whole_model(**batch) * probe).mean().backward()
    split_model(task.model, group, sequence_parallel=sequence_parallel)
    names = shard_replicas(task, task.model, replicas, sequence_parallel=sequence_parallel)
    if whole_model.config.value_residual:  # whole tensors that meet this rank's heads, or positions
        assert "model.decoder.blocks.1.attn.value_residual.weight" in names
        assert ("model.decoder.blocks.0.ffn_res.norm.weight" in names) == sequence_parallel
    out = task.training_step(batches[replicas.get_local_rank()])
    torch.testing.assert_close(out, whole_model(**batches[replicas.get_local_rank()]), atol=1e-5, rtol=1e-4, msg=msg)
    (out * probe).mean().backward()
    sum_over_group([task.get_parameter(name) for name in names], group)
    layers = sharded_tensors(task)
    for name, param in whole_model.named_parameters():
        mine = task.get_parameter(f"model.{name}").grad
        if param.grad is None:  # a part the forward does not use (the pooler)
            assert mine is None, f"{msg} {name}"
            continue
        atol = 1e-4 * param.grad.abs().max().item()
        grad = whole(layers.get(f"model.{name}"), mine)
        torch.testing.assert_close(grad, param.grad.cpu() / 2, atol=atol, rtol=1e-4, msg=f"{msg} {name}")
    cut_ids, trained = cut_parameters(task), [p for p in task.parameters() if p.grad is not None]
    cuts = [local(p.grad) for p in trained if id(p) in cut_ids]
    rest = [local(p.grad) for p in trained if id(p) not in cut_ids]
    expected = torch.nn.utils.get_total_norm([p.grad / 2 for p in whole_model.parameters() if p.grad is not None])
    torch.testing.assert_close(grad_norm(cuts, rest, group, replicas=replicas.get_group()), expected, msg=msg)
    current = task.state_dict()  # DTensors: this rank's shards of its slices
    saved = {k: whole(layers.get(k), v) for k, v in current.items()}
    assert all(torch.equal(saved[f"model.{k}"], v) for k, v in whole_model.state_dict().items()), msg
    before = {k: local(v).clone() for k, v in current.items()}
    for value in current.values():
        local(value).zero_()
    task.load_state_dict({k: part(layers.get(k), v, current[k]) for k, v in saved.items()})
    assert all(torch.equal(local(v), before[k]) for k, v in task.state_dict().items()), msg


@pytest.mark.slow
def test_replicas_sharded_by_fsdp_compute_what_the_whole_model_does():
    """FSDP2 over the data-parallel dimension of split blocks, for a decoder (GQA, a GLU, qk_norm and
    value_residual, activation checkpointing), an encoder and an encoder-decoder, sequence-parallel too
    (not the encoder-decoder): logits, averaged gradients, their norm, and the state in zoo's layout
    that loads back into the shards."""
    mp.spawn(_compare_sharded_replicas_with_whole, args=(_free_port(),), nprocs=4)


# ---- zoo-train: 2 processes against 1 -----------------------------------------------------------------


MESH = ["trainer.devices=4", "trainer.strategy.tensor_parallel_size=2"]  # 2 KV heads: split in 2, not in 4


@pytest.fixture(scope="module")
def mesh_runs(tmp_path_factory) -> dict[str, Path]:
    """The same 6 steps under DDP on 2 processes and as 2 replicas of a 2-way split model on 4: replica r
    reads what DDP's process r reads, and the gradients are averaged alike."""
    root = tmp_path_factory.mktemp("mesh")
    train("ddp", root / "ddp", "trainer.accelerator=cpu")
    train("tp", root / "mesh", *MESH)
    return {"ddp": root / "ddp", "mesh": root / "mesh"}


@pytest.mark.slow
def test_two_replicas_of_a_split_model_train_as_ddp_on_two_processes(mesh_runs):
    """Replica 0's training losses (as DDP's rank 0 logs its own) and the validation and test losses
    averaged over the replicas; the checkpoint, gathered over one group, holds DDP's weights and state."""
    _assert_trains_as_ddp(mesh_runs["mesh"], mesh_runs["ddp"])


def _assert_trains_as_ddp(
    run: Path, ddp: Path, metrics: tuple[str, ...] = ("train/loss", "val/loss", "test/loss")
) -> None:
    for metric in metrics:
        theirs, mine = losses(ddp, metric), losses(run, metric)
        assert theirs and mine == pytest.approx(theirs, rel=1e-5), metric
    assert sorted(losses(run)) == list(range(1, 7))
    _assert_same_checkpoint(run, ddp)


def _assert_same_checkpoint(run: Path, reference: Path) -> None:
    """The last checkpoints of ``run`` and ``reference``: the same weights and optimizer state, in zoo's layout."""
    mine, theirs = (torch.load(r / "checkpoints" / "last.ckpt", weights_only=True) for r in (run, reference))
    assert mine["state_dict"].keys() == theirs["state_dict"].keys()
    for name, value in theirs["state_dict"].items():
        torch.testing.assert_close(mine["state_dict"][name], value, atol=1e-6, rtol=1e-4, msg=name)
    assert mine["optimizer_states"][0]["state"].keys() == theirs["optimizer_states"][0]["state"].keys()
    for index, state in theirs["optimizer_states"][0]["state"].items():
        torch.testing.assert_close(mine["optimizer_states"][0]["state"][index], state, atol=1e-7, rtol=1e-3)


@pytest.mark.slow
def test_a_mesh_checkpoint_resumes_in_one_process(mesh_runs, tmp_path):
    """Two more steps in one process from either checkpoint: the same losses."""
    more = ["trainer.max_steps=8", "test=false"]
    for name in ("ddp", "mesh"):
        train("cpu", tmp_path / name, f"ckpt_path={mesh_runs[name] / 'checkpoints' / 'last.ckpt'}", *more)
    ddp, mesh = losses(tmp_path / "ddp"), losses(tmp_path / "mesh")
    assert sorted(mesh) == [7, 8] and mesh == pytest.approx(ddp, rel=1e-5)


# ---- zoo-train: the 2 replicas sharded by FSDP2 (trainer.strategy.data_parallel=fsdp) against DDP on 2 ---

FSDP = [*MESH, "trainer.strategy.data_parallel=fsdp"]


@pytest.fixture(scope="module")
def fsdp_runs(mesh_runs, tmp_path_factory) -> dict[str, Path]:
    """The same 6 steps as ``mesh_runs`` with the replicas sharded; and sequence-parallel, clipped to a
    gradient norm of 0.01 (far below the model's: every step clipped), against DDP clipped alike."""
    root, clipped = tmp_path_factory.mktemp("fsdp"), ["trainer.gradient_clip_val=0.01", "test=false"]
    train("tp", root / "fsdp", *FSDP)  # and tests the best checkpoint: configured (split, sharded) again
    train("tp", root / "fsdp_sp", *FSDP, "trainer.strategy.sequence_parallel=true", *clipped)
    train("ddp", root / "ddp_clipped", "trainer.accelerator=cpu", *clipped)
    return {**mesh_runs, "fsdp": root / "fsdp", "fsdp_sp": root / "fsdp_sp", "ddp_clipped": root / "ddp_clipped"}


@pytest.mark.slow
def test_replicas_sharded_by_fsdp_train_as_ddp_on_two_processes(fsdp_runs):
    """As the whole replicas do: DDP's losses and a checkpoint, gathered over the replicas and the
    groups, that holds DDP's weights and state; sequence-parallel and clipped by the whole model's norm
    (Adam's first moments hold the clipped gradients: a norm counted otherwise would scale them)."""
    _assert_trains_as_ddp(fsdp_runs["fsdp"], fsdp_runs["ddp"])
    _assert_trains_as_ddp(fsdp_runs["fsdp_sp"], fsdp_runs["ddp_clipped"], ("train/loss", "val/loss"))


@pytest.mark.slow
def test_an_fsdp_checkpoint_resumes_in_one_process_and_a_ddp_one_under_fsdp(fsdp_runs, tmp_path):
    """Two more steps in one process from the sharded replicas' checkpoint as from DDP's; and as sharded
    replicas from DDP's (each rank cuts its shard of its slice) as under DDP: the same losses; the last two
    write the same weights and state."""
    more = ["trainer.max_steps=8", "test=false"]
    ckpt = {name: f"ckpt_path={fsdp_runs[name] / 'checkpoints' / 'last.ckpt'}" for name in ("ddp", "fsdp")}
    train("cpu", tmp_path / "one_fsdp", ckpt["fsdp"], *more)
    train("cpu", tmp_path / "one_ddp", ckpt["ddp"], *more)
    train("tp", tmp_path / "fsdp", *FSDP, ckpt["ddp"], *more)
    train("ddp", tmp_path / "ddp", "trainer.accelerator=cpu", ckpt["ddp"], *more)
    for run, reference in (("one_fsdp", "one_ddp"), ("fsdp", "ddp")):
        mine, theirs = losses(tmp_path / run), losses(tmp_path / reference)
        assert sorted(mine) == [7, 8] and mine == pytest.approx(theirs, rel=1e-5), run
    _assert_same_checkpoint(tmp_path / "fsdp", tmp_path / "ddp")
