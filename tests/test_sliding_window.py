"""Sliding-window attention (``mask=sliding_window``, ``window=W``): a query sees only the keys less
than W positions away (a decoder's only those before it); the KV cache keeps no more than that, so
decoding memory is bounded and tokens equal full recompute; Mistral's and Qwen2's windows import
and export with logits parity against transformers."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from conftest import tiny_config, tiny_model
from rounding import assert_rounding_close
from torch import Tensor

import zoo
from zoo.mask import CausalSlidingWindow, SlidingWindow

POSITIONS = zoo.list_components()["position"]
W = 3  # the window of the tiny models: shorter than every sequence below


def _outputs(model: zoo.ZooModel, ids: Tensor, mask: Tensor | None = None) -> Tensor:
    with torch.no_grad():
        return model(ids, mask)  # (B, T, V) logits of a decoder, (B, T, D) hidden states of an encoder


def _influence(model: zoo.ZooModel, length: int, mask: Tensor | None = None) -> Tensor:
    """(length, length) bool: [i, j] whether changing token j changes the output at position i."""
    ids = torch.randint(5, 61, (1, length), generator=torch.Generator().manual_seed(0))
    changed = ids.repeat(length, 1)  # row j: token j replaced
    changed[torch.arange(length), torch.arange(length)] = (ids[0] + 7) % 56 + 5
    masks = None if mask is None else mask.repeat(length, 1)
    delta = (_outputs(model, changed, masks) - _outputs(model, ids, mask)).abs().amax(-1)  # (j, i)
    return (delta > 1e-5).T


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("arch", ["decoder", "encoder"])
@pytest.mark.parametrize("n_layers", [1, 2])
def test_a_token_reaches_only_the_positions_within_the_window(arch, position, n_layers):
    """Each layer widens the reach by W - 1 positions; padding (left, as generation pads a decoder's
    prompts; right for an encoder) reaches nothing."""
    length, pad = 14, 2
    model = tiny_model(arch=arch, position=position, mask="sliding_window", window=W, n_layers=n_layers)
    mask = torch.ones(1, length, dtype=torch.long)
    padded = torch.arange(pad) if arch == "decoder" else torch.arange(length - pad, length)
    mask[0, padded] = 0
    reach = n_layers * (W - 1)
    behind = torch.arange(length)[:, None] - torch.arange(length)[None, :]  # (i, j): i - j
    expected = (behind >= 0) & (behind <= reach) if arch == "decoder" else behind.abs() <= reach
    expected[:, padded] = False
    real = mask[0].bool()
    assert torch.equal(_influence(model, length, mask)[real], expected[real])


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder_decoder"])
def test_a_window_wider_than_the_sequence_is_the_forms_own_mask(arch, position):
    """Same weights (masks have none): a window of max_seq_len computes exactly what the natural mask
    does, position biases included (T5's buckets look one way in a decoder, both in an encoder)."""
    windowed = tiny_model(arch=arch, position=position, mask="sliding_window", window=64)
    plain = tiny_model(arch=arch, position=position)
    ids = torch.randint(0, 61, (2, 9))
    pad = torch.ones(2, 9, dtype=torch.long)
    pad[1, 6:] = 0
    args = (ids, ids[:, :5], pad) if arch == "encoder_decoder" else (ids, pad)
    with torch.no_grad():
        torch.testing.assert_close(windowed(*args), plain(*args))
    mask = windowed.stacks()[0].mask
    assert type(mask) is (CausalSlidingWindow if arch == "decoder" else SlidingWindow)
    assert mask.causal == plain.stacks()[0].mask.causal  # what the position encoding was built for


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("arch", ["decoder", "encoder"])
def test_sdpa_path_equals_math_path(arch, position):
    kw = dict(arch=arch, position=position, mask="sliding_window", window=W)
    ids = torch.randint(0, 61, (2, 11))
    pad = torch.ones(2, 11, dtype=torch.long)
    pad[1, 7:] = 0
    torch.testing.assert_close(
        _outputs(tiny_model(attention="sdpa", **kw), ids, pad),
        _outputs(tiny_model(attention="math", **kw), ids, pad),
        atol=1e-4,
        rtol=1e-4,
    )


# ---- decoding ------------------------------------------------------------------------------------
def _windowed_decoder(position: str, window: int = W, **kw) -> zoo.ZooModel:
    return tiny_model(position=position, mask="sliding_window", window=window, n_kv_heads=2, tie_embeddings=False, **kw)


def _assert_not_degenerate(tokens: Tensor) -> None:
    assert tokens.unique().numel() > 2, "a constant continuation would make the comparison vacuous"


@pytest.mark.parametrize("position", POSITIONS)
def test_greedy_with_and_without_cache_gives_the_same_tokens(position):
    model = _windowed_decoder(position)
    prompt = torch.randint(0, 61, (3, 6))
    cached = model.generate(prompt, max_new_tokens=12, eos_token_id=None)
    uncached = model.generate(prompt, max_new_tokens=12, eos_token_id=None, use_cache=False)
    _assert_not_degenerate(cached[:, -12:])
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("position", POSITIONS)
def test_left_padded_batches_decode_like_single_prompts(position):
    model = _windowed_decoder(position)
    prompts = [[5, 17, 3, 40, 22, 9, 31], [8, 2, 60], [11, 12, 13, 14, 15]]
    batch = model.generate(prompts, max_new_tokens=8, eos_token_id=None)
    assert torch.equal(batch, model.generate(prompts, max_new_tokens=8, eos_token_id=None, use_cache=False))
    _assert_not_degenerate(batch[:, -8:])
    for row, prompt in zip(batch, prompts, strict=True):
        alone = model.generate(torch.tensor([prompt]), max_new_tokens=8, eos_token_id=None)[0]
        assert torch.equal(row[-8:], alone[-8:])


def test_beam_search_reorders_the_bounded_cache():
    model = _windowed_decoder("rope")
    prompts = [[5, 6, 7, 8, 9], [10, 11]]
    kw = dict(max_new_tokens=10, num_beams=3, eos_token_id=None)
    assert torch.equal(model.generate(prompts, **kw), model.generate(prompts, use_cache=False, **kw))


def test_a_window_of_one_attends_to_the_token_alone():
    model = _windowed_decoder("alibi", window=1)
    assert model.decoder.mask.lookback == 0
    prompt = torch.randint(0, 61, (2, 5))
    cached = model.generate(prompt, max_new_tokens=6, eos_token_id=None)
    assert torch.equal(cached, model.generate(prompt, max_new_tokens=6, eos_token_id=None, use_cache=False))


@pytest.mark.parametrize("position", ["rope", "learned", "alibi", "t5_relative"])
def test_the_cache_holds_the_last_window_positions_only(position):
    """Step-by-step decoding through the cache equals a full forward at every step, while each layer
    holds W - 1 positions at most (the newest key joins them when attended) and the position count
    (the next token's absolute position) keeps growing."""
    model = _windowed_decoder(position)
    ids = torch.randint(0, 61, (2, 20))
    cache = model.new_cache()
    with torch.no_grad():
        full = model(ids)  # (2, 20, V)
        steps = [model(ids[:, :5], cache=cache)[:, -1]] + [
            model(ids[:, t : t + 1], cache=cache)[:, -1] for t in range(5, 20)
        ]
        sizes = []
        for layer in cache.self_attn:
            assert layer.k.shape == layer.v.shape == (2, 2, W - 1, 8) and layer.held == W - 1
            sizes.append(layer.nbytes())
    assert_rounding_close(torch.stack(steps, 1), full[:, 4:], model)
    assert cache.length == 20
    assert cache.nbytes() == sum(sizes) == 2 * 2 * (2 * 2 * (W - 1) * 8) * 4  # layers x k,v x B x KV x held x hd x fp32


def test_generate_allocates_a_cache_bounded_by_the_window(monkeypatch):
    model = _windowed_decoder("rope")
    made = []
    new_cache = model.new_cache
    monkeypatch.setattr(model, "new_cache", lambda *a, **k: made.append(new_cache(*a, **k)) or made[-1])
    model.generate(torch.randint(0, 61, (2, 30)), max_new_tokens=20, eos_token_id=None)
    (cache,) = made
    assert cache.length == 49  # the prompt and every token fed back (the last one is only sampled)
    assert {layer.k.shape[2] for layer in cache.self_attn} == {W - 1}
    unbounded = zoo.build_model(model.config.replace(mask=None, window=None), seed=0).new_cache()
    assert unbounded.self_attn[0].keep is None


def test_the_encoder_of_an_encoder_decoder_slides_both_ways():
    model = tiny_model(arch="encoder_decoder", position="t5_relative", mask="sliding_window", window=W)
    assert type(model.encoder.mask) is SlidingWindow and model.encoder.position.bidirectional
    assert model.decoder.mask.lookback is None and model.new_cache().self_attn[0].keep is None
    src = torch.randint(0, 61, (2, 9))
    assert torch.equal(
        model.generate(src, max_new_tokens=6, eos_token_id=None),
        model.generate(src, max_new_tokens=6, eos_token_id=None, use_cache=False),
    )


# ---- refusals ------------------------------------------------------------------------------------
def test_the_mask_needs_a_window():
    with pytest.raises(zoo.ConfigError, match="mask='sliding_window' needs window"):
        tiny_config(mask="sliding_window").validate()


@pytest.mark.parametrize("mask", [None, "causal", "prefix"])
def test_a_window_without_the_mask_is_refused(mask):
    with pytest.raises(zoo.ConfigError, match="window=4 is read by mask=document or mask=sliding_window only"):
        tiny_config(mask=mask, window=4).validate()


# ---- transformers --------------------------------------------------------------------------------
def _hf_config(cls_name: str, **kw):
    transformers = pytest.importorskip("transformers")
    return getattr(transformers, cls_name)(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        vocab_size=100,
        max_position_embeddings=64,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        **kw,
    )


def _hf_model(cls_name: str, config, attn: str = "sdpa", seed: int = 0) -> torch.nn.Module:
    import transformers

    torch.manual_seed(seed)
    return getattr(transformers, cls_name)._from_config(config, attn_implementation=attn).eval()


def _convert(hf: torch.nn.Module) -> zoo.ZooModel:
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="zoo")  # a plain LM conversion is silent
        return zoo.from_hf(hf)


IDS = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(1))  # longer than the window of 4
FAMILY = {
    "mistral": ("MistralForCausalLM", "MistralConfig", {"sliding_window": 4}),
    "qwen2": (
        "Qwen2ForCausalLM",
        "Qwen2Config",
        {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0},
    ),
}


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("family", list(FAMILY))
def test_from_hf_logits_match_beyond_the_window(family, attn):
    """transformers applies the window on both of its attention paths: the same weights without it
    give other logits from position 4 on, so the parity below is the window's."""
    model_cls, config_cls, window = FAMILY[family]
    hf = _hf_model(model_cls, _hf_config(config_cls, **window), attn)
    model = _convert(hf)
    assert (model.config.mask, model.config.window) == ("sliding_window", 4)
    with torch.no_grad():
        expected = hf(IDS).logits
        torch.testing.assert_close(model(IDS), expected, atol=1e-4, rtol=1e-4)
        full = _hf_model(model_cls, _hf_config(config_cls), attn)
        full.load_state_dict(hf.state_dict())
        unwindowed = full(IDS).logits
    torch.testing.assert_close(unwindowed[:, :4], expected[:, :4], atol=1e-5, rtol=1e-5)
    assert (unwindowed[:, 4:] - expected[:, 4:]).abs().amax(-1).min() > 1e-2


def test_mistral_generation_matches_transformers_past_the_window():
    hf = _hf_model("MistralForCausalLM", _hf_config("MistralConfig", sliding_window=4))
    model = _convert(hf)
    prompts = [[5, 17, 3, 40, 22, 9, 31], [8, 2, 60]]
    got = model.generate(prompts, max_new_tokens=10, eos_token_id=None)  # (2, 7 + 10), left-padded
    hf.generation_config.eos_token_id, hf.generation_config.pad_token_id = None, 0
    for row, prompt in zip(got, prompts, strict=True):
        with torch.no_grad():
            alone = hf.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                num_beams=1,
                max_new_tokens=10,
            )[0]
        assert row[-len(alone) :].tolist() == alone.tolist()
        _assert_not_degenerate(alone[len(prompt) :])


def test_qwen2_reads_every_layer_sliding_or_none():
    cfg = zoo.from_hf_config(
        _hf_config("Qwen2Config", use_sliding_window=True, sliding_window=4, max_window_layers=2)
    )  # layers from 2 on: none of 2
    assert (cfg.mask, cfg.window) == (None, None)
    with pytest.raises(ValueError, match=r"max_window_layers=1 .*not supported.*max_window_layers=0"):
        zoo.from_hf_config(_hf_config("Qwen2Config", use_sliding_window=True, sliding_window=4, max_window_layers=1))
    cfg = zoo.from_hf_config(_hf_config("MistralConfig", sliding_window=None))
    assert (cfg.mask, cfg.window) == (None, None)


@pytest.mark.parametrize(
    ("qkv_bias", "family", "auto_class"), [(None, "mistral", "MistralForCausalLM"), (True, "qwen2", "Qwen2ForCausalLM")]
)
def test_a_sliding_window_decoder_exports(qkv_bias, family, auto_class, tmp_path):
    transformers = pytest.importorskip("transformers")
    model = tiny_model(mask="sliding_window", window=W, n_kv_heads=2, qkv_bias=qkv_bias, tie_embeddings=False)
    assert zoo.hf.hf_exportable(model.config) == family
    assert zoo.to_hf(model, tmp_path / "out") == auto_class
    hf = getattr(transformers, auto_class).from_pretrained(tmp_path / "out").eval()
    ids = torch.randint(0, 61, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-4, rtol=1e-4)
    back = zoo.from_hf(tmp_path / "out").config
    assert (back.mask, back.window, back.qkv_bias) == ("sliding_window", W, qkv_bias)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (
            dict(arch="encoder", position="learned", norm="layernorm", norm_placement="post", ffn="gelu", bias=True),
            "mask=sliding_window (BERT has bidirectional attention)",
        ),
        (dict(bias=True), "mask=sliding_window (Llama has causal attention)"),  # Mistral has no biases
    ],
)
def test_what_no_transformers_class_computes_is_refused(overrides, named):
    cfg = tiny_config(mask="sliding_window", window=W, **overrides)
    with pytest.raises(zoo.ConfigError, match=re.escape(named)):
        zoo.hf.hf_exportable(cfg)


def test_zoo_stats_sizes_the_cache_a_window_keeps():
    """zoo.stats' KV-cache bytes are what the cache holds after 20 positions: the window's, not 20."""
    model = _windowed_decoder("rope")
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 61, (2, 20)), cache=cache)
    assert zoo.stats(model.config, seq_len=20, batch_size=2, dtype=torch.float32).kv_cache_bytes == cache.nbytes()
    plain = zoo.stats(model.config.replace(mask=None, window=None), seq_len=20, batch_size=2, dtype=torch.float32)
    assert plain.kv_cache_bytes == cache.nbytes() * 20 // (W - 1)


def test_window_pattern_is_read_by_the_mask_for_the_stack_and_the_exporters():
    from zoo.mask import windowed_layers

    cfg = tiny_config(n_layers=5, mask="sliding_window", window=4, window_pattern="LG")
    assert windowed_layers(cfg) == [True, False, True, False, True]
    assert windowed_layers(tiny_config(n_layers=3, mask="sliding_window", window=4)) == [True, True, True]
    assert windowed_layers(tiny_config(n_layers=3, mask="document", window=4, window_pattern="GL")) == [
        False,
        True,
        False,
    ]
    assert windowed_layers(tiny_config(n_layers=3)) == [False, False, False]
    cfg = tiny_config(n_layers=4, mask="sliding_window", window=4, window_pattern="LLLG")
    stack = zoo.build_model(cfg).stacks()[-1]
    assert stack.global_layers == [not w for w in windowed_layers(cfg)] == [False, False, False, True]
    assert stack.lookbacks() == [3, 3, 3, None]
