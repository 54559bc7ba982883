"""The int8 KV cache: keys and values stored as int8 with a float32 scale per row, head and
position, dequantised for each attention step. Each position is quantised alone, so decoding with
the cache equals recomputing the sequence through a fresh int8 cache, for every position type."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from rounding import assert_rounding_close

import zoo
import zoo.decoding
from zoo.kv_cache import KV_FORMATS, KVCache, KVFormat, quantize_int8

POSITIONS = zoo.list_components()["position"]


def _recomputed(model: zoo.ZooModel, ids: torch.Tensor, src: torch.Tensor | None) -> torch.Tensor:
    """Next-token logits after ``ids``, the whole sequence through a fresh int8 cache."""
    cache = model.new_cache(kv_dtype="int8")
    if src is None:
        return model.logits(model.features(ids, cache=cache))[:, -1]
    return model.logits(model.decoder_features(ids, model.encode(src), cache=cache))[:, -1]


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_int8_cached_decoding_equals_recompute_through_an_int8_cache(arch, position):
    model = tiny_model(arch=arch, position=position, n_kv_heads=2)
    src = torch.randint(5, 61, (2, 7)) if arch == "encoder_decoder" else None
    ids = torch.randint(5, 61, (2, 5)) if src is None else torch.zeros(2, 1, dtype=torch.long)
    cache = model.new_cache(kv_dtype="int8")
    memory = None if src is None else model.encode(src)
    new = ids
    with torch.no_grad():
        for _ in range(8):
            hidden = (
                model.features(new, cache=cache) if src is None else model.decoder_features(new, memory, cache=cache)
            )
            logits = model.logits(hidden)[:, -1]
            assert_rounding_close(logits, _recomputed(model, ids, src), model)
            new = logits.argmax(-1, keepdim=True)
            ids = torch.cat([ids, new], dim=1)
    assert all(c.k.dtype == torch.int8 for c in cache.modules() if isinstance(c, KVCache) and c.k is not None)


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_generate_reads_the_models_kv_dtype(arch):
    """``model.kv_dtype`` (what zoo.quantize sets) changes the cache generate builds; int8 greedy
    tokens stay those of the full-precision cache on a random tiny model (rounding of 1/254 of each
    head's largest value rarely flips an argmax)."""
    model = tiny_model(arch=arch, position="rope")
    prompt = torch.randint(5, 61, (3, 6))
    full = model.generate(prompt, 12, eos_token_id=None)
    model.kv_dtype = "int8"
    int8 = model.generate(prompt, 12, eos_token_id=None)
    beams = model.generate(prompt, 12, eos_token_id=None, num_beams=2)
    assert beams.shape[0] == 3
    agree = (int8 == full).float().mean().item()
    assert agree >= 0.9, f"int8 cache agreed with the fp32 cache on {agree:.0%} of tokens"


def test_int8_static_cache_equals_the_growing_int8_cache(monkeypatch):
    monkeypatch.setattr(zoo.decoding, "compiled", lambda step: step)
    model = tiny_model(position="alibi")
    model.kv_dtype = "int8"
    prompts = [[5, 17, 3, 40, 22], [8, 2, 60]]
    assert torch.equal(
        model.generate(prompts, 10, compile=True, eos_token_id=None), model.generate(prompts, 10, eos_token_id=None)
    )


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_an_int8_model_decodes_the_same_with_and_without_its_cache(arch, position):
    """``kv_dtype="int8"`` rounds keys and values without a cache as the cache stores them, so
    uncached decoding (and a forward pass: an evaluation) computes what cached decoding does."""
    model = tiny_model(arch=arch, position=position, n_kv_heads=2)
    model.kv_dtype = "int8"
    prompt = torch.randint(5, 61, (2, 6))
    cached = model.generate(prompt, 10, eos_token_id=None)
    assert torch.equal(cached, model.generate(prompt, 10, eos_token_id=None, use_cache=False))
    ids = torch.randint(5, 61, (2, 9))
    with torch.no_grad():
        full = model(ids) if arch == "decoder" else model(prompt, ids)
        if arch == "decoder":
            assert_rounding_close(full[:, -1], _recomputed(model, ids, None), model)
    model.kv_dtype = None
    with torch.no_grad():
        plain = model(ids) if arch == "decoder" else model(prompt, ids)
    assert not torch.equal(full, plain)


def test_an_int8_cache_takes_about_half_the_bytes_of_bf16():
    """hd + 4 bytes per head and position instead of 2 * hd: 68 / 128 = 0.53 at hd 64."""
    model = tiny_model(d_model=256, n_heads=4).to(torch.bfloat16)  # head_dim 64
    prompt = torch.randint(5, 61, (2, 40))
    sizes = {}
    for kv_dtype in (None, "int8"):
        cache = model.new_cache(kv_dtype=kv_dtype)
        with torch.no_grad():
            model.features(prompt, cache=cache)
        sizes[kv_dtype] = cache.nbytes()
    assert sizes["int8"] / sizes[None] == pytest.approx(68 / 128)
    expected = zoo.stats(model.config, seq_len=40, batch_size=2, kv_dtype="int8").kv_cache_bytes
    assert sizes["int8"] == expected


def test_a_windowed_int8_cache_stays_bounded():
    model = tiny_model(position="rope", mask="sliding_window", window=4)
    cache = model.new_cache(kv_dtype="int8")
    sizes = []
    with torch.no_grad():
        model.features(torch.randint(5, 61, (1, 9)), cache=cache)
        for token in range(5, 15):
            model.features(torch.tensor([[token]]), cache=cache)
            sizes.append(cache.nbytes())
    assert len(set(sizes)) == 1 and cache.length == 19


def test_quantisation_error_is_within_half_a_step():
    x = torch.randn(2, 3, 5, 16) * torch.logspace(-3, 3, 5)[:, None]  # positions of very different scales
    q, scale = quantize_int8(x)
    assert q.dtype == torch.int8 and scale.shape == (2, 3, 5, 1)
    assert ((q.float() * scale - x).abs() <= scale / 2 + 1e-6 * x.abs()).all()


def test_an_unknown_kv_dtype_is_refused():
    with pytest.raises(zoo.ConfigError, match="kv_dtype='int4'.*int8"):
        tiny_model().new_cache(kv_dtype="int4")


class _Halves(KVFormat):
    """A format of a test's own: keys and values stored as float16, no scales."""

    @staticmethod
    def pack(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return x.half(), None

    @staticmethod
    def unpack(x: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        return x.to(dtype)

    @staticmethod
    def value_bytes(head_dim: int, element_size: int) -> float:
        return 2 * head_dim


@pytest.fixture
def halves():
    KV_FORMATS.register("test_f16")(_Halves)
    yield "test_f16"
    KV_FORMATS.unregister("test_f16")


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_a_kv_format_is_one_registered_class_that_every_path_asks(arch, halves):
    """A new format is a KVFormat subclass and a name: caches store it, attention without a cache
    rounds as they do (so cached decoding equals uncached), zoo.stats and zoo.quantize know it."""
    model = tiny_model(arch=arch, position="rope")
    zoo.quantize(model, weights=None, kv_cache=halves)
    prompt = torch.randint(5, 61, (2, 6))
    cached = model.generate(prompt, 8, eos_token_id=None)
    assert torch.equal(cached, model.generate(prompt, 8, eos_token_id=None, use_cache=False))
    cache = model.new_cache()
    with torch.no_grad():
        if arch == "decoder":
            model.features(prompt, cache=cache)
        else:
            model.decoder_features(prompt[:, :1], model.encode(prompt), cache=cache)
    assert {c.k.dtype for c in cache.modules() if isinstance(c, KVCache) and c.k is not None} == {torch.float16}
    cfg = model.config
    sized = zoo.stats(cfg, seq_len=32, kv_dtype=halves, dtype=torch.float32).kv_cache_bytes
    assert sized == zoo.stats(cfg, seq_len=32, dtype=torch.float16).kv_cache_bytes
    with pytest.raises(zoo.ConfigError, match="kv_cache='test_f32'.*test_f16"):
        zoo.quantize(model, weights=None, kv_cache="test_f32")
