"""A static KV cache and compiled decoding (``generate(compile=True)``) change speed, never tokens.

Most tests run the static cache without compiling (``zoo.decoding.compiled`` replaced by the identity),
so every position type, mask and decoding mode is covered in milliseconds; a few compile for real."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

import zoo
import zoo.decoding
from zoo.kv_cache import KVCache, StaticKVCache

POSITIONS = zoo.list_components()["position"]
PROMPTS = [[5, 17, 3, 40, 22, 9, 31], [8, 2, 60], [11, 12, 13, 14, 15]]


@pytest.fixture
def eager(monkeypatch):
    """The static cache without torch.compile: the same step, run eagerly."""
    monkeypatch.setattr(zoo.decoding, "compiled", lambda step: step)


def _both(model: zoo.ZooModel, prompts, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    kw = {"max_new_tokens": 10, "eos_token_id": None, **kw}
    return model.generate(prompts, compile=True, **kw), model.generate(prompts, **kw)


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_static_cache_decodes_padded_prompts_as_the_growing_cache_does(eager, arch, position):
    model = tiny_model(arch=arch, position=position, n_kv_heads=2, tie_embeddings=False)
    static, dynamic = _both(model, PROMPTS)
    assert static.unique().numel() > 3, "a constant continuation would make the comparison vacuous"
    assert torch.equal(static, dynamic)


@pytest.mark.parametrize("mask", [dict(mask="prefix"), dict(mask="sliding_window", window=3)])
@pytest.mark.parametrize("position", ["rope", "alibi", "t5_relative"])
def test_static_cache_keeps_prefix_and_window_masks(eager, mask, position):
    """The slots after each query are hidden by the mask's causal part; a window's band still applies
    though the static cache holds every position."""
    model = tiny_model(position=position, **mask)
    static, dynamic = _both(model, PROMPTS, max_new_tokens=12)
    assert torch.equal(static, dynamic)


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_static_cache_follows_beams_and_sampling(eager, arch):
    model = tiny_model(arch=arch, position="rope")
    assert torch.equal(*_both(model, PROMPTS, num_beams=3))
    kw = dict(do_sample=True, temperature=0.8, top_k=20, top_p=0.9)
    a = model.generate(PROMPTS, 10, compile=True, generator=torch.Generator().manual_seed(3), eos_token_id=None, **kw)
    b = model.generate(PROMPTS, 10, generator=torch.Generator().manual_seed(3), eos_token_id=None, **kw)
    assert torch.equal(a, b)


def test_static_cache_stops_where_learned_positions_end(eager):
    model = tiny_model(position="learned")  # max_seq_len 64
    prompt = torch.randint(5, 61, (2, 58))
    with pytest.warns(zoo.generation.GenerationLimitWarning):
        static, dynamic = _both(model, prompt, max_new_tokens=20)
    assert static.shape == (2, 64) and torch.equal(static, dynamic)


def test_a_static_cache_writes_in_place_and_counts_what_it_holds():
    cache = StaticKVCache(8)
    k = torch.randn(2, 1, 3, 4)
    keys, values = cache.append(k, -k)
    storage = keys.data_ptr()
    assert keys.shape == (2, 1, 8, 4) and cache.length == 3 and cache.nbytes() == 2 * 2 * 3 * 4 * 4
    keys, _ = cache.append(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4))
    assert keys.data_ptr() == storage and cache.length == 4
    assert torch.equal(keys[:, :, :3], k) and keys[:, :, 4:].eq(0).all()
    cache.reorder(torch.tensor([1, 1]))
    assert cache.k.data_ptr() == storage and torch.equal(cache.k[0, :, :3], k[1])


@pytest.mark.parametrize("kv_dtype", [None, "int8"])
def test_growing_and_cross_attention_caches_reorder_rows_in_place(kv_dtype):
    """Beam search reorders every cache in place: a CUDA graph of the static step reads the
    cross-attention cache's tensors at the addresses it captured."""
    k = torch.randn(2, 1, 3, 4)
    growing, cross = KVCache(8, kv_dtype=kv_dtype), KVCache(kv_dtype=kv_dtype)
    growing.append(k, -k)
    cross.set(k, -k)
    for cache in (growing, cross):
        stored = [t.data_ptr() for t in cache._stored()]
        before = cache.get()[0]
        cache.reorder(torch.tensor([1, 1]))
        assert [t.data_ptr() for t in cache._stored()] == stored
        assert torch.equal(cache.get()[0], before[[1, 1]])


def test_capacities_are_rounded_to_share_compiled_steps():
    model = tiny_model(position="rope")
    assert zoo.decoding.static_capacity(model, 20) == zoo.decoding.CAPACITY_STEP
    assert zoo.decoding.static_capacity(tiny_model(position="learned"), 20) == 64  # the table's end


def test_compile_needs_the_cache():
    with pytest.raises(zoo.ConfigError, match="use_cache=True"):
        tiny_model().generate([[1, 2]], 3, compile=True, use_cache=False)


def _compiled_frames() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def test_compiled_decoding_equals_eager_and_compiles_once():
    """torch.compile for real: padded prompts, then prompts of other lengths in the same capacity
    bucket and batch size reuse the compiled step."""
    torch._dynamo.reset()
    model = tiny_model(position="rope", n_kv_heads=2)
    static, dynamic = _both(model, PROMPTS)
    assert torch.equal(static, dynamic)
    graphs = _compiled_frames()
    assert graphs > 0, "nothing was compiled"
    other = [[9, 8, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9], [4, 4]]
    static, dynamic = _both(model, other, max_new_tokens=15)
    assert torch.equal(static, dynamic)
    assert _compiled_frames() == graphs, "a new prompt length recompiled the step"


def test_compiled_beam_search_of_an_encoder_decoder():
    model = tiny_model(arch="encoder_decoder", position="t5_relative")
    assert torch.equal(*_both(model, PROMPTS, num_beams=2))
