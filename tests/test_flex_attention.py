"""attention='flex' (torch.nn.attention.flex_attention) computes what the ``math`` reference does for
every position encoding and mask, with padding: in a full forward masks reach it as one block mask
built from ``Mask.mask_mod`` and ALiBi / T5 biases as ``Position.score_mod``, computed from positions
inside the kernel (no (T, T) tensor); with a KV cache the dense mask is converted. On the CPU torch
runs flex_attention's forward only (eagerly; no backward), so these tests compare forwards; the CUDA
training path (and attention='auto' choosing it) is measured by scripts/bench/flex.py."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import tiny_config, tiny_model
from rounding import assert_rounding_close
from torch import Tensor

import zoo
import zoo.attention
from zoo.attention import AttentionInputs
from zoo.kernels import Auto, flex_applies
from zoo.mask import Mask
from zoo.position import Position

POSITIONS = zoo.list_components()["position"]
B, T = 2, 9
# (arch, mask, extra config): every mask in the form it belongs to; bidirectional where the form allows
CASES = [
    ("decoder", "causal", {}),
    ("decoder", "prefix", {}),
    ("decoder", "sliding_window", {"window": 3}),
    ("decoder", "document", {}),
    ("decoder", "document", {"window": 3}),
    ("encoder", "bidirectional", {}),
    ("encoder", "sliding_window", {"window": 3}),
    ("encoder_decoder", None, {}),
]


def _pair(**overrides) -> tuple[zoo.ZooModel, zoo.ZooModel]:
    """The same weights (one seed) with attention='flex' and attention='math'."""
    return tiny_model(attention="flex", **overrides), tiny_model(attention="math", **overrides)


def _inputs(arch: str, mask: str | None) -> dict[str, Tensor]:
    """Token ids with padding (left for a decoder, as generation pads; right for an encoder) and
    whatever the mask reads: per-row prefix lengths, or packed documents' ids."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 61, (B, T), generator=g)
    keep = torch.ones(B, T, dtype=torch.long)
    if arch == "decoder":
        keep[1, :3] = 0
    else:
        keep[1, -3:] = 0
    kwargs = {"attention_mask": keep}
    if mask == "prefix":
        kwargs["prefix_len"] = torch.tensor([4, 6])
    if mask == "document":
        kwargs = {"document_ids": torch.tensor([[0, 0, 0, 0, 1, 1, 1, 2, 2], [0, 0, 1, 1, 1, 1, 1, 1, 1]])}
    if arch == "encoder_decoder":
        kwargs["decoder_input_ids"] = torch.randint(1, 61, (B, 5), generator=g)
        kwargs["decoder_attention_mask"] = torch.tensor([[1] * 5, [1] * 3 + [0] * 2])
    return {"input_ids": ids, **kwargs}


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize(("arch", "mask", "extra"), CASES, ids=[f"{a}-{m}" for a, m, _ in CASES])
def test_flex_forward_equals_math(arch, mask, extra, position):
    overrides = dict(arch=arch, position=position, **extra)
    if mask is not None:
        overrides["mask"] = mask
    flex, math = _pair(**overrides)
    inputs = _inputs(arch, mask)
    with torch.no_grad():
        expected = math(**inputs)
        got = flex(**inputs)
    assert_rounding_close(got, expected, math)


def _self_attention_inputs(model: zoo.ZooModel) -> list[AttentionInputs]:
    """Records what every self-attention layer of ``model`` receives."""
    seen: list[AttentionInputs] = []
    for block in (m for m in model.modules() if isinstance(m, zoo.attention.SelfAttention)):
        block.register_forward_pre_hook(lambda _m, args: seen.append(args[1]))
    return seen


@pytest.mark.parametrize("position", ["alibi", "t5_relative"])
@pytest.mark.parametrize(("arch", "mask", "extra"), CASES, ids=[f"{a}-{m}" for a, m, _ in CASES])
def test_a_full_forward_makes_no_dense_mask_or_bias(arch, mask, extra, position, monkeypatch):
    """The mods path never calls the dense builders (Position.bias, Mask.allowed, within_documents): every
    layer gets FlexMods and no (T, T) tensor; one block mask serves all layers of a stack."""
    overrides = dict(arch=arch, position=position, **extra)
    if mask is not None:
        overrides["mask"] = mask
    flex = tiny_model(attention="flex", **overrides)
    seen = _self_attention_inputs(flex)

    def refuse(*args, **kwargs):
        raise AssertionError("a dense (T, T) mask or bias was built")

    for cls in (*Position.__subclasses__(), Position):
        monkeypatch.setattr(cls, "bias", refuse)
    for cls in {Mask, *(type(s.mask) for s in flex.modules() if isinstance(s, zoo.blocks.Stack))}:
        monkeypatch.setattr(cls, "allowed", refuse)
        monkeypatch.setattr(cls, "within_documents", refuse)
    with torch.no_grad():
        flex(**_inputs(arch, mask))
    assert seen and all(i.mask is None and not i.is_causal and i.flex is not None for i in seen)
    assert all(i.flex.score_mod is not None for i in seen)  # the bias, computed in the kernel
    per_stack = {id(i.flex) for i in seen}
    assert len(per_stack) == (2 if arch == "encoder_decoder" else 1)  # made once per stack forward
    assert all(i.flex.block_mask is not None and i.flex.block_mask.mask_mod is not None for i in seen)  # padding


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("mask", [dict(mask="causal"), dict(mask="prefix"), dict(mask="sliding_window", window=3)])
def test_flex_decodes_with_a_kv_cache_as_math_does(position, mask):
    """With a cache the stack still builds the dense mask, which the flex kernel converts."""
    flex, math = _pair(position=position, **mask)
    prompts = [[5, 17, 3, 40, 22, 9, 31], [8, 2, 60]]
    kw = {"max_new_tokens": 6, "eos_token_id": None}  # a prefix LM's prefix is the prompt
    assert torch.equal(flex.generate(prompts, **kw), math.generate(prompts, **kw))


def test_prefix_len_as_an_int_and_per_row_give_math():
    flex, math = _pair(mask="prefix", position="alibi")
    ids = torch.randint(1, 61, (B, T))
    with torch.no_grad():
        for prefix_len in (4, torch.tensor([2, 7])):
            assert_rounding_close(flex(ids, prefix_len=prefix_len), math(ids, prefix_len=prefix_len), math)


def test_flex_applies_only_on_cuda_to_a_full_forward_sdpa_cannot_fuse_without_dropout():
    for device, cached, dense, dropout_p in itertools.product(
        ("cuda", "cpu", "mps"), (False, True), (False, True), (0.0, 0.1)
    ):
        expected = device == "cuda" and not cached and dense and dropout_p == 0.0
        assert flex_applies(device, cached=cached, dense=dense, dropout_p=dropout_p) is expected


def test_auto_is_sdpa_on_the_cpu_and_asks_for_mods_on_cuda():
    auto, sdpa = tiny_model(attention="auto", position="alibi"), tiny_model(attention="sdpa", position="alibi")
    ids = torch.randint(1, 61, (B, T))
    with torch.no_grad():
        assert torch.equal(auto(ids), sdpa(ids))  # the same kernel here
    attn = auto.decoder.blocks[0].attn
    assert attn.reads_flex_mods("cuda", cached=False, dense=True)
    assert not attn.reads_flex_mods("cuda", cached=True, dense=True)  # decoding keeps sdpa
    assert not attn.reads_flex_mods("cuda", cached=False, dense=False)  # RoPE + causal: sdpa's is_causal
    assert not attn.reads_flex_mods("cpu", cached=False, dense=True)
    attn.dropout = 0.1
    assert attn.reads_flex_mods("cuda", cached=False, dense=True)  # eval: no dropout
    assert not attn.train().reads_flex_mods("cuda", cached=False, dense=True)
    assert not tiny_model(attention="sdpa").decoder.blocks[0].attn.reads_flex_mods("cuda", cached=False, dense=True)


@pytest.mark.parametrize("position", ["alibi", "t5_relative", "rope"])
@pytest.mark.parametrize(("arch", "mask", "extra"), CASES, ids=[f"{a}-{m}" for a, m, _ in CASES])
def test_auto_where_flex_applies_equals_math(arch, mask, extra, position, monkeypatch):
    """attention='auto' as it runs on CUDA (the device check lifted): FlexMods where they apply, else sdpa."""
    as_on_cuda = classmethod(lambda cls, _device, **kw: flex_applies("cuda", **kw))
    monkeypatch.setattr(Auto, "reads_flex_mods", as_on_cuda)
    overrides = dict(arch=arch, position=position, **extra)
    if mask is not None:
        overrides["mask"] = mask
    auto, math = tiny_model(attention="auto", **overrides), tiny_model(attention="math", **overrides)
    seen = _self_attention_inputs(auto)
    with torch.no_grad():
        assert_rounding_close(auto(**_inputs(arch, mask)), math(**_inputs(arch, mask)), math)
    assert all(i.flex is not None for i in seen)  # padding everywhere: sdpa would need a (T, T) tensor


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_flex_without_padding_and_with_grouped_query_heads(position):
    """No mask tensor at all (the kernel's is_causal) and key/value heads shared by query heads."""
    flex, math = _pair(position=position, n_kv_heads=2)
    ids = torch.randint(1, 61, (B, T))
    with torch.no_grad():
        assert_rounding_close(flex(ids), math(ids), math)


def test_flex_refuses_attention_dropout_when_the_model_is_composed():
    with pytest.raises(zoo.ConfigError, match="attn_dropout=0"):
        tiny_config(attention="flex", attn_dropout=0.1).validate()
    with pytest.raises(zoo.ConfigError, match="attn_dropout=0"):
        tiny_config(attention="flex", dropout=0.1).validate()  # attn_dropout=None follows dropout
    tiny_config(attention="flex", dropout=0.1, attn_dropout=0.0).validate()
    model = tiny_model(attention="flex").train()  # the kernel refuses it too, if asked past validate
    model.decoder.blocks[0].attn.dropout = 0.1
    with torch.no_grad(), pytest.raises(ValueError, match="attn_dropout=0"):
        model(torch.randint(1, 61, (1, 4)))
