"""The tensor-parallel plan (tasks/parallel/plan.py): read from what the sublayers declare
(``Sublayer.tensor_split``), which layers go column- and row-parallel, what each rank holds 1/N of, which
whole parameters are summed over the group, the one-line refusals; built once per split."""

from __future__ import annotations

import copy

import pytest
import torch.distributed as dist

import zoo
from tasks.parallel.layers import split_model
from tasks.parallel.plan import TensorPlan
from zoo.registry import FFN


def test_a_gqa_decoder_with_a_glu_splits_its_fused_layers_by_segment():
    model = zoo.create_model("llama-tiny", n_layers=2)  # 4 heads of 32, 2 KV heads, swiglu of 352
    plan = TensorPlan.of(model, 2)
    assert [type(entry.sublayer).__name__ for entry in plan.sublayers()] == ["SelfAttention", "SwiGLU"] * 2
    attn, ffn = plan.blocks[0].sublayers
    assert attn.split.column_parallel == {"qkv": (128, 64, 64)} and attn.split.row_parallel == ("out",)
    assert attn.split.sizes == {"n_heads": 4, "n_kv_heads": 2} and attn.split.sums_own
    assert ffn.split.column_parallel == {"fc": (352, 352)} and ffn.split.row_parallel == ("proj",)
    assert ffn.split.sizes == {"d_ff": 352} and not ffn.split.sums_own


def test_cross_attention_splits_its_query_and_its_fused_keys_and_values():
    plan = TensorPlan.of(zoo.create_model("t5-tiny", position="rope"), 2)
    cross = plan.blocks[-1].sublayers[1]
    assert type(cross.sublayer).__name__ == "CrossAttention"
    assert cross.split.column_parallel == {"q": (128,), "kv": (128, 128)} and cross.split.row_parallel == ("out",)


def test_the_group_summed_parameters_meet_one_ranks_heads_or_positions():
    model = zoo.create_model("llama-tiny", n_layers=2, qk_norm="rmsnorm", value_residual=True, bias=True)
    plan = TensorPlan.of(model, 2)
    heads = set(plan.group_summed(sequence_parallel=False))
    assert heads == {
        *(f"decoder.blocks.{i}.attn.{norm}_norm.weight" for i in (0, 1) for norm in "qk"),
        "decoder.blocks.1.attn.value_residual.weight",
    }
    positions = set(plan.group_summed(sequence_parallel=True)) - heads
    names = ("attn_res.norm.weight", "ffn_res.norm.weight", "attn.out.bias", "ffn.proj.bias")  # rmsnorm: no bias
    assert positions == {f"decoder.blocks.{i}.{name}" for i in (0, 1) for name in names}


def test_an_moe_is_refused_in_one_line_naming_the_ffns_that_split():
    model = zoo.create_model("llama-tiny", ffn="moe")
    assert model.decoder.blocks[0].ffn.tensor_split() is None
    with pytest.raises(zoo.ConfigError) as error:
        TensorPlan.of(model, 2)
    dense = [name for name in FFN.names() if FFN.get(name).splits_by_tensor]
    assert str(error.value) == (
        f"model.ffn='moe' (MoE) cannot be split by trainer=tp, which splits the dense FFNs ({', '.join(dense)}); "
        f"choose one of them, or trainer=ddp"
    )
    assert "swiglu" in dense and "moe" not in dense
    TensorPlan.read(model)  # reading what the sublayers declare refuses nothing


@pytest.mark.parametrize("ffn", FFN.names())
def test_every_ffn_that_says_it_splits_declares_how(ffn):
    model = zoo.create_model("llama-tiny", ffn=ffn)
    split = model.decoder.blocks[0].ffn.tensor_split()
    assert (split is not None) == FFN.get(ffn).splits_by_tensor


def test_a_size_the_ranks_do_not_divide_is_refused_by_the_field_that_sets_it():
    model = zoo.create_model("llama-tiny")
    TensorPlan.of(model, 2)
    with pytest.raises(zoo.ConfigError, match=r"^model.n_kv_heads=2 does not split over 4 tensor-parallel ranks"):
        TensorPlan.of(model, 4)


def test_attention_keeps_its_share_of_the_heads():
    attn = zoo.create_model("llama-tiny").decoder.blocks[0].attn
    attn.keep_share(2)
    assert (attn.n_heads, attn.n_kv_heads) == (2, 1)


def test_a_split_computes_its_plan_once_and_the_split_model_names_the_same_summed_parameters(monkeypatch, tmp_path):
    whole = zoo.create_model("llama-tiny", n_layers=2, qk_norm="rmsnorm", value_residual=True)
    reads, read = [], TensorPlan.read.__func__
    monkeypatch.setattr(TensorPlan, "read", classmethod(lambda cls, model: reads.append(model) or read(cls, model)))
    model = copy.deepcopy(whole)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        split_model(model, dist.group.WORLD, sequence_parallel=True)
        assert reads == [model]
        split_model(model, dist.group.WORLD)  # split already: left as it is, no plan
        assert reads == [model]
    finally:
        dist.destroy_process_group()
    before = TensorPlan.read(whole).group_summed(sequence_parallel=True)
    assert list(TensorPlan.read(model).group_summed(sequence_parallel=True)) == list(before)
