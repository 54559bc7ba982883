"""Generation: the cache changes speed, never tokens; padding, stopping, sampling and beam search."""

import itertools

import pytest
import torch
from conftest import tiny_model

import zoo
import zoo.decoding
from zoo.generation import filter_logits

POSITIONS = zoo.list_components()["position"]


def _assert_not_degenerate(tokens: torch.Tensor) -> None:
    assert tokens.unique().numel() > 2, "a constant continuation would make the comparison vacuous"


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_greedy_with_and_without_cache_gives_the_same_tokens(arch, position):
    model = tiny_model(arch=arch, position=position, n_kv_heads=2, tie_embeddings=False)
    prompt = torch.randint(0, 61, (3, 6))
    cached = model.generate(prompt, max_new_tokens=12, eos_token_id=None)
    uncached = model.generate(prompt, max_new_tokens=12, eos_token_id=None, use_cache=False)
    assert cached.shape == ((3, 18) if arch == "decoder" else (3, 13))
    _assert_not_degenerate(cached[:, -12:])
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_sampling_with_and_without_cache_gives_the_same_tokens(arch):
    model = tiny_model(arch=arch, position="rope")
    prompt = torch.randint(0, 61, (2, 5))
    kw = dict(max_new_tokens=10, do_sample=True, temperature=0.8, top_k=20, top_p=0.9, eos_token_id=None)
    a = model.generate(prompt, generator=torch.Generator().manual_seed(3), **kw)
    b = model.generate(prompt, generator=torch.Generator().manual_seed(3), use_cache=False, **kw)
    assert torch.equal(a, b)
    c = model.generate(prompt, generator=torch.Generator().manual_seed(4), **kw)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("position", POSITIONS)
def test_left_padded_batches_decode_like_single_prompts(position):
    model = tiny_model(position=position, tie_embeddings=False)
    prompts = [[5, 17, 3, 40, 22, 9, 31], [8, 2, 60], [11, 12, 13, 14, 15]]
    batch = model.generate(prompts, max_new_tokens=8, eos_token_id=None)
    assert batch.shape == (3, 7 + 8)
    _assert_not_degenerate(batch[:, -8:])
    for row, prompt in zip(batch, prompts, strict=True):
        alone = model.generate(torch.tensor([prompt]), max_new_tokens=8, eos_token_id=None)[0]
        assert torch.equal(row[-8:], alone[-8:])
        assert row[: 7 - len(prompt)].eq(model.config.pad_token_id).all()


def test_right_padded_sources_translate_like_single_sources():
    model = tiny_model(arch="encoder_decoder", position="learned")
    sources = [[5, 17, 3, 40, 22], [8, 2]]
    batch = model.generate(sources, max_new_tokens=6, eos_token_id=None)
    for row, src in zip(batch, sources, strict=True):
        assert torch.equal(row, model.generate(torch.tensor([src]), max_new_tokens=6, eos_token_id=None)[0])


def test_generation_stops_at_eos_and_pads_after_it():
    model = tiny_model()
    prompt = torch.randint(0, 61, (4, 3))
    free = model.generate(prompt, max_new_tokens=10, eos_token_id=None)
    eos = int(free[0, 5])  # the token row 0 produces third: make it the end of sequence
    stopped = model.generate(prompt, max_new_tokens=10, eos_token_id=eos, pad_token_id=0)
    row = stopped[0, 3:]
    first = int((row == eos).nonzero()[0])
    assert first <= 2 and row[first + 1 :].eq(0).all()
    assert torch.equal(stopped[0, : 3 + first + 1], free[0, : 3 + first + 1])


def test_top_k_one_is_greedy():
    model = tiny_model()
    prompt = torch.randint(0, 61, (2, 4))
    greedy = model.generate(prompt, max_new_tokens=8, eos_token_id=None)
    sampled = model.generate(prompt, max_new_tokens=8, eos_token_id=None, do_sample=True, top_k=1)
    assert torch.equal(greedy, sampled)


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda **kw: torch.isfinite(filter_logits(logits, **kw))[0].tolist()
    assert kept(top_k=2) == [True, True, False, False]
    assert kept(top_p=0.5) == [True, False, False, False]
    assert kept(top_p=0.7) == [True, True, False, False]
    assert kept(top_p=0.96) == [True, True, True, True]
    torch.testing.assert_close(filter_logits(logits, temperature=2.0), logits / 2)
    with pytest.raises(ValueError, match="temperature"):
        filter_logits(logits, temperature=0.0)


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_beam_search_with_enough_beams_finds_the_most_likely_sequence(arch):
    model = tiny_model(arch=arch, vocab_size=4, pad_token_id=0, init_std=0.5)
    src = torch.tensor([[1, 3, 2]])
    n = 3
    best = model.generate(src, max_new_tokens=n, num_beams=16, eos_token_id=None)

    def logprob(seq: tuple[int, ...]) -> float:
        if arch == "decoder":
            ids = torch.cat([src, torch.tensor([seq])], dim=1)
            logp = model(ids[:, :-1]).log_softmax(-1)[0, -n:]
        else:
            dec = torch.tensor([[0, *seq[:-1]]])
            logp = model(src, dec).log_softmax(-1)[0]
        return sum(logp[i, t].item() for i, t in enumerate(seq))

    scores = {seq: logprob(seq) for seq in itertools.product(range(4), repeat=n)}
    assert tuple(best[0, -n:].tolist()) == max(scores, key=scores.get)


def test_beam_search_cache_parity_and_eos_handling():
    model = tiny_model(arch="encoder_decoder", position="t5_relative")
    src = [[5, 6, 7, 8], [9, 10]]
    a = model.generate(src, max_new_tokens=8, num_beams=4, eos_token_id=3, length_penalty=0.6)
    b = model.generate(src, max_new_tokens=8, num_beams=4, eos_token_id=3, length_penalty=0.6, use_cache=False)
    assert torch.equal(a, b)
    assert a[:, 0].eq(model.config.decoder_start_token_id).all()
    for row in a[:, 1:]:
        hits = (row == 3).nonzero()
        if len(hits):
            assert row[int(hits[0]) + 1 :].eq(model.config.pad_token_id).all()


def test_encoders_do_not_generate():
    with pytest.raises(TypeError, match="encoder does not generate"):
        tiny_model(arch="encoder").generate(torch.zeros(1, 3, dtype=torch.long))


def test_learned_positions_stop_generation_at_the_table_with_a_warning():
    model = tiny_model(position="learned", max_seq_len=10)
    with pytest.warns(zoo.generation.GenerationLimitWarning, match="stopped after 4 of max_new_tokens=8"):
        out = model.generate(torch.zeros(1, 6, dtype=torch.long), max_new_tokens=8, eos_token_id=None)
    assert out.shape == (1, 10)


def test_more_beams_than_distinct_continuations_are_refused():
    model = tiny_model(vocab_size=4, pad_token_id=0)
    src = torch.tensor([[1, 3, 2]])
    assert model.generate(src, max_new_tokens=2, num_beams=16, eos_token_id=None).shape == (1, 5)  # 4 ** 2 = 16
    with pytest.raises(zoo.ConfigError, match=r"num_beams=17 is more than the 16 distinct continuations of 2 new"):
        model.generate(src, max_new_tokens=2, num_beams=17, eos_token_id=None)
    with pytest.raises(zoo.ConfigError, match=r"num_beams=1000000000 "):  # refused before anything is allocated
        tiny_model().generate(src, max_new_tokens=3, num_beams=10**9)


@pytest.mark.parametrize("compile_", [False, True])
def test_generated_ids_feed_a_forward_that_autograd_records(compile_, monkeypatch):
    """generate decodes under inference_mode; what it returns is an ordinary tensor, so a training step
    on generated text (self-training, RL from samples) can save it for backward."""
    monkeypatch.setattr(zoo.decoding, "compiled", lambda step: step)
    model = tiny_model(position="rope")
    out = model.generate(torch.randint(5, 61, (2, 4)), 6, eos_token_id=None, compile=compile_)
    assert not out.is_inference() and not torch.is_inference_mode_enabled()
    model.train()
    model(out).logsumexp(-1).mean().backward()
    assert model.embed.weight.grad is not None
