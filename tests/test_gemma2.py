"""Issue 24: Gemma 2 composed of zoo's components, and the two it needed: ``window_pattern``
(windowed and global layers interleaved) and ``norm=rmsnorm_1p`` (a (1 + weight) gain). Logits and
greedy tokens against transformers' Gemma2ForCausalLM for every kind of ``layer_types``; the
pattern's properties on zoo's own models (kernels agree, the cache keeps what each layer sees)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config, tiny_model

import zoo
from zoo.norm import RMSNorm, RMSNorm1P

transformers = pytest.importorskip("transformers")

from hf_tiny import VOCAB, _build, _close, _gemma2_config, _tokens  # noqa: E402  (after the importorskip)

NEW = 10
LAYER_TYPES = {
    "alternating": None,  # Gemma 2's default: windowed first, then global
    "all_windowed": ["sliding_attention"] * 3,
    "all_global": ["full_attention"] * 3,
    "two_to_one": ["sliding_attention", "sliding_attention", "full_attention"],
}
READ = {  # layer_types -> (mask, window_pattern) zoo reads
    "alternating": ("sliding_window", "LG"),
    "all_windowed": ("sliding_window", None),
    "all_global": (None, None),
    "two_to_one": ("sliding_window", "LLG"),
}


def _gemma2(kind: str, **kw) -> torch.nn.Module:
    hf = _build(transformers.Gemma2ForCausalLM, _gemma2_config(layer_types=LAYER_TYPES[kind], **kw))
    with torch.no_grad():  # Gemma's norms start at zero (a gain of one): move them so they are mapped
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.uniform_(-0.5, 0.5)
    return hf


# ---- the family ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", LAYER_TYPES)
def test_logits_equal_transformers_for_every_kind_of_layer_types(kind):
    hf = _gemma2(kind)
    model = zoo.from_hf(hf)
    cfg = model.config
    assert (cfg.mask, cfg.window_pattern) == READ[kind]
    assert (cfg.norm, cfg.norm_placement, cfg.ffn, cfg.gelu_approximate) == ("rmsnorm_1p", "sandwich", "geglu", "tanh")
    assert (cfg.attn_softcap, cfg.final_softcap, cfg.attn_scale, cfg.embed_scale) == (2.0, 3.0, 20**-0.5, 8.0)
    ids = _tokens(2, 14)  # longer than the window of 4: the windowed layers see less than the global ones
    with torch.no_grad():
        _close(model(ids), hf(ids).logits)


@pytest.mark.parametrize("kind", ["alternating", "two_to_one"])
def test_greedy_tokens_equal_transformers_with_the_cache(kind):
    hf = _gemma2(kind, final_logit_softcapping=30.0, tie_word_embeddings=False)
    model = zoo.from_hf(hf)
    ids = _tokens(1, 7)
    hf.generation_config.eos_token_id, hf.generation_config.pad_token_id = None, 0
    with torch.no_grad():
        expected = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW)
    got = model.generate(ids, max_new_tokens=NEW, eos_token_id=None)
    assert got.tolist() == expected.tolist()
    assert len(set(got[0, 7:].tolist())) > 1


def test_what_gemma2_cannot_compute_is_refused_in_one_line():
    cfg = zoo.from_hf_config(_gemma2_config())
    assert zoo.hf_exportable(cfg) == "gemma2"
    unfit = zoo.hf.FAMILIES.get("gemma2").unfit
    for change, field in [
        (dict(embed_scale=1.0), "embed_scale"),
        (dict(norm="rmsnorm"), "norm"),
        (dict(attn_scale=0.3), "attn_scale"),
        (dict(qk_norm="rmsnorm"), "qk_norm"),
    ]:
        assert [p.split("=")[0] for p in unfit(cfg.replace(**change))] == [field]
    with pytest.raises(zoo.ConfigError) as error:
        zoo.hf_exportable(cfg.replace(value_residual=True))
    assert "\n" not in str(error.value) and "value_residual=True (Gemma 2 has False)" in str(error.value)
    with pytest.raises(ValueError, match="attention_bias=True is not supported"):
        zoo.from_hf_config(_gemma2_config(attention_bias=True))


# ---- window_pattern -------------------------------------------------------------------------------------
def _patterned(**kw) -> zoo.ZooModel:
    return tiny_model(n_layers=4, mask="sliding_window", window=3, window_pattern="LG", n_kv_heads=2, **kw)


def test_global_layers_see_every_key_and_windowed_layers_only_theirs():
    model = _patterned()
    assert model.decoder.global_layers == [False, True, False, True]
    assert model.decoder.lookbacks() == [2, None, 2, None]
    cache = model.new_cache()
    assert [layer.keep for layer in cache.self_attn] == [2, None, 2, None]
    x = torch.randint(0, 61, (2, 12))
    with torch.no_grad():
        windowed = tiny_model(n_layers=4, mask="sliding_window", window=3, n_kv_heads=2)(x)
        patterned = model(x)
        wide = tiny_model(n_layers=4, mask="sliding_window", window=12, window_pattern="LG", n_kv_heads=2)(x)
        causal = tiny_model(n_layers=4, n_kv_heads=2)(x)
    assert not torch.allclose(patterned, windowed, atol=1e-4) and not torch.allclose(patterned, causal, atol=1e-4)
    torch.testing.assert_close(wide, causal)  # a window as long as the row: every layer is global
    torch.testing.assert_close(patterned[:, :3], causal[:, :3])  # inside the first window nothing differs


@pytest.mark.parametrize("kernel", ["math", "flex", "auto"])
def test_every_kernel_agrees_with_sdpa_under_a_pattern(kernel):
    x, mask = torch.randint(0, 61, (2, 11)), torch.ones(2, 11, dtype=torch.long)
    mask[0, :4] = 0
    with torch.no_grad():
        torch.testing.assert_close(_patterned(attention=kernel)(x, mask), _patterned()(x, mask), rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # tens of seconds on 2 cores: CI's slow pass runs it
@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_cached_decoding_under_a_pattern_equals_full_recompute(arch):
    model = _patterned(arch=arch, value_residual=True)
    prompt = torch.randint(0, 61, (3, 5))
    cached = model.generate(prompt, max_new_tokens=12, eos_token_id=None)
    assert torch.equal(cached, model.generate(prompt, max_new_tokens=12, eos_token_id=None, use_cache=False))

    if arch == "decoder":  # a static cache holds every position; the mask drops what a window no longer sees
        x, cache = torch.randint(0, 61, (2, 12)), model.new_cache(16, static=True)
        with torch.no_grad():
            steps = [model(x[:, :5], cache=cache)] + [model(x[:, t : t + 1], cache=cache) for t in range(5, 12)]
            torch.testing.assert_close(torch.cat(steps, dim=1), model(x), rtol=1e-4, atol=1e-5)


def test_an_encoders_global_layers_are_bidirectional():
    model = tiny_model(arch="encoder", n_layers=2, mask="sliding_window", window=2, window_pattern="LG")
    assert type(model.encoder.global_mask).__name__ == "Bidirectional"
    x = torch.randint(0, 61, (1, 8))
    changed = x.clone()
    changed[0, 7] = (changed[0, 7] + 1) % 61
    with torch.no_grad():
        a, b = model(x), model(changed)
    assert not torch.allclose(a[0, 0], b[0, 0])  # the global layer carries the last token to the first


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (dict(window_pattern="LX"), r"^window_pattern='LX' must be letters L \(a windowed layer\) and G"),
        (dict(window_pattern="GG"), r"^window_pattern='GG' must be letters L .* at least one L"),
        (dict(mask="causal", window=None), r"^window_pattern='LG' is read by mask=document or mask=sliding_window"),
        (dict(mask="document", window=None), r"^window_pattern='LG' interleaves windowed and global layers, but"),
    ],
)
def test_bad_patterns_are_refused_in_one_line(values, message):
    with pytest.raises(zoo.ConfigError, match=message):
        tiny_config(**{"mask": "sliding_window", "window": 3, "window_pattern": "LG", **values}).validate()


# ---- rmsnorm_1p -------------------------------------------------------------------------------------
def test_rmsnorm_1p_is_rmsnorm_with_weight_plus_one_and_starts_at_zero():
    norm = RMSNorm1P(16, eps=1e-6)
    assert torch.equal(norm.weight, torch.zeros(16))
    plain = RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(-0.5, 0.5)
        plain.weight.copy_(norm.weight + 1)
    x = 5 * torch.randn(3, 16)
    torch.testing.assert_close(norm(x), plain(x))
    model = tiny_model(norm="rmsnorm_1p")
    with torch.no_grad():
        model.decoder.final_norm.weight.fill_(0.3)
    model.init_weights()
    assert torch.equal(model.decoder.final_norm.weight, torch.zeros(32))
    assert VOCAB > 61  # the HF tiny vocabulary is not the zoo tiny one: the tests above use their own


def test_stats_count_what_each_layers_cache_holds():
    """zoo.stats' KV cache under a pattern: windowed layers hold window - 1 positions, global ones all."""
    base = dict(n_layers=4, n_kv_heads=2, max_seq_len=64)
    full = zoo.stats(tiny_config(**base), seq_len=64, dtype=torch.float32).kv_cache_bytes
    windowed = zoo.stats(tiny_config(**base, mask="sliding_window", window=9), seq_len=64, dtype=torch.float32)
    mixed = zoo.stats(
        tiny_config(**base, mask="sliding_window", window=9, window_pattern="LG"), seq_len=64, dtype=torch.float32
    )
    assert full == 2 * 4 * 2 * 8 * 4 * 64  # K and V, layers, KV heads, head size, 4 bytes, positions
    assert windowed.kv_cache_bytes == full * 8 // 64
    assert mixed.kv_cache_bytes == (full + windowed.kv_cache_bytes) // 2
