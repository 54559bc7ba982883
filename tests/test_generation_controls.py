"""generate's repeat controls (zoo.logits): repetition_penalty and no_repeat_ngram_size.

Parity with HF transformers' processors on random logits and histories, and with HF's generate on a
converted GPT-2; no repeated n-gram where the control bans them, on tiny random models whose greedy
paths loop without it (each test checks that they do, so it can fail); padding and an
encoder-decoder's start token are no history; the defaults change nothing.
"""

import warnings

import pytest
import torch
from conftest import tiny_model

import zoo
from zoo.generation import check_sampling, filter_logits
from zoo.logits import RepeatControls, ban_repeated_ngrams, penalize_repetition

ARCHS = ["decoder", "encoder_decoder"]
PROMPT = torch.tensor([[5, 17, 3, 40], [9, 2, 33, 14]])
NEW = 24


def _processors():
    processors = pytest.importorskip("transformers.generation.logits_process")
    return processors.RepetitionPenaltyLogitsProcessor, processors.NoRepeatNGramLogitsProcessor


def _looping_model(arch: str) -> zoo.ZooModel:
    return tiny_model(seed=1, arch=arch)  # greedy paths repeat a few tokens over and over


def _sequences(model: zoo.ZooModel, out: torch.Tensor) -> list[list[int]]:
    """Each row's history: a decoder's prompt and continuation, an encoder-decoder's target after its start token."""
    return out.tolist() if model.config.arch == "decoder" else out[:, 1:].tolist()


def _repeated_ngrams(seq: list[int], n: int) -> int:
    grams = [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]
    return len(grams) - len(set(grams))


def _repeated_tokens(seq: list[int]) -> int:
    return len(seq) - len(set(seq))


def _histories(B: int = 6, T: int = 14, alphabet: int = 4, seed: int = 0) -> torch.Tensor:
    """Token ids drawn from a few values, so that tokens and n-grams repeat."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, alphabet, (B, T), generator=g) * 3 + 1  # ids 1, 4, 7, 10 of V = 17


def _logits(B: int = 6, V: int = 17, seed: int = 1) -> torch.Tensor:
    return torch.randn(B, V, generator=torch.Generator().manual_seed(seed)) * 3


# ---- the processors against HF's ---------------------------------------------------------------
@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
@pytest.mark.parametrize("T", [0, 1, 14])
def test_repetition_penalty_matches_hf(penalty, T):
    hf, _ = _processors()
    ids, logits = _histories(T=T), _logits()
    got = penalize_repetition(logits, ids, penalty)
    assert torch.equal(got, hf(penalty)(ids, logits.clone()))
    assert T == 0 or not torch.equal(got, logits)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("T", [1, 2, 3, 14])
def test_no_repeat_ngram_matches_hf(n, T):
    _, hf = _processors()
    ids, logits = _histories(T=T, seed=T), _logits()
    got = ban_repeated_ngrams(logits, ids, n)
    assert torch.equal(got, hf(n)(ids, logits.clone()))
    if 2 * n <= T:  # long enough, over 4 values, for some row to end in a repeat
        assert torch.isinf(got).any()


@pytest.mark.parametrize("n", [1, 2, 3])
def test_padding_is_no_history(n):
    """Left-padded rows give what their tokens alone give with HF's processors, though the padding
    (id 1, which the rows also hold) would change them if it counted."""
    hf_penalty, hf_ngram = _processors()
    ids, logits = _histories(seed=2), _logits()
    lengths = [14, 9, 5, 3, 1, 11]
    mask = torch.arange(14)[None, :] >= 14 - torch.tensor(lengths)[:, None]  # (B, T): left padding
    padded = ids.masked_fill(~mask, 1)
    controls = RepeatControls(1.7, n)
    got = controls(logits, padded, mask)
    for b, length in enumerate(lengths):
        row, alone = logits[b : b + 1].clone(), ids[b : b + 1, 14 - length :]
        expected = hf_ngram(n)(alone, hf_penalty(1.7)(alone, row))
        assert torch.equal(got[b : b + 1], expected)
    assert not torch.equal(got, controls(logits, padded))  # counting the padding would matter


def test_defaults_return_the_logits_unchanged():
    logits = _logits().half()
    assert RepeatControls()(logits, _histories()) is logits


# ---- generate ----------------------------------------------------------------------------------
@pytest.mark.slow  # tens of seconds on 2 cores: CI's slow pass runs it
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("n", [2, 3])
def test_greedy_never_repeats_an_ngram_it_bans(arch, n):
    model = _looping_model(arch)
    free = _sequences(model, model.generate(PROMPT, NEW, eos_token_id=None))
    assert all(_repeated_ngrams(seq, n) > 0 for seq in free), "the model must loop for this test to mean anything"
    banned = _sequences(model, model.generate(PROMPT, NEW, eos_token_id=None, no_repeat_ngram_size=n))
    assert all(_repeated_ngrams(seq, n) == 0 for seq in banned)


@pytest.mark.parametrize("arch", ARCHS)
def test_repetition_penalty_repeats_fewer_tokens(arch):
    model = _looping_model(arch)
    count = lambda out: sum(_repeated_tokens(seq[-NEW:]) for seq in _sequences(model, out))  # noqa: E731
    free = count(model.generate(PROMPT, NEW, eos_token_id=None))
    assert free > NEW, "the model must loop for this test to mean anything"
    penalized = [count(model.generate(PROMPT, NEW, eos_token_id=None, repetition_penalty=p)) for p in (2.0, 3.0)]
    assert penalized[0] < free and penalized[1] < free / 4


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "mode",
    [
        {},
        {"do_sample": True, "temperature": 0.9, "top_k": 20, "top_p": 0.9},
        {"num_beams": 3},
        {"num_beams": 3, "eos_token_id": 7, "length_penalty": 0.7},
    ],
)
def test_explicit_defaults_change_nothing(arch, mode):
    model = tiny_model(arch=arch)
    kw = {"eos_token_id": None, **mode}
    run = lambda **more: model.generate(PROMPT, 12, generator=torch.Generator().manual_seed(0), **kw, **more)  # noqa: E731
    assert torch.equal(run(), run(repetition_penalty=1.0, no_repeat_ngram_size=0))


@pytest.mark.parametrize("arch", ARCHS)
def test_default_greedy_is_plain_argmax(arch):
    """The defaults leave greedy decoding what it was: the argmax of the model's logits, step by step."""
    model = tiny_model(arch=arch)
    out = model.generate(PROMPT, 8, eos_token_id=None)
    with torch.no_grad():
        if arch == "decoder":
            ids = PROMPT
            for _ in range(8):
                ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
        else:
            ids = torch.full((2, 1), model.config.decoder_start_token_id)
            for _ in range(8):
                ids = torch.cat([ids, model(PROMPT, ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ids)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.7, "top_k": 5, "top_p": 0.9}])
def test_decoding_matches_a_loop_over_hf_processors(arch, sampling):
    """zoo.generate with both controls equals a plain loop that runs HF's processors over the history
    (a decoder's prompt and continuation, an encoder-decoder's target after the start token), then
    temperature, top-k and top-p, then takes the argmax or samples."""
    hf_penalty, hf_ngram = _processors()
    model = _looping_model(arch)
    out = model.generate(
        PROMPT,
        12,
        eos_token_id=None,
        repetition_penalty=1.4,
        no_repeat_ngram_size=2,
        do_sample=bool(sampling),
        generator=torch.Generator().manual_seed(0),
        **sampling,
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        ids = PROMPT if arch == "decoder" else torch.full((2, 1), model.config.decoder_start_token_id)
        for _ in range(12):
            logits = model(ids)[:, -1] if arch == "decoder" else model(PROMPT, ids)[:, -1]
            history = ids if arch == "decoder" else ids[:, 1:]
            logits = hf_ngram(2)(history, hf_penalty(1.4)(history, logits.float()))
            if sampling:
                probs = filter_logits(logits, **sampling).softmax(-1)
                token = torch.multinomial(probs, 1, generator=generator)
            else:
                token = logits.argmax(-1, keepdim=True)
            ids = torch.cat([ids, token], dim=1)
    assert torch.equal(out, ids)
    assert not torch.equal(
        out,
        model.generate(
            PROMPT,
            12,
            eos_token_id=None,
            do_sample=bool(sampling),
            generator=torch.Generator().manual_seed(0),
            **sampling,
        ),
    )


@pytest.mark.parametrize("controls", [{"repetition_penalty": 3.0}, {"no_repeat_ngram_size": 1}])
def test_left_padded_prompts_decode_as_alone_with_controls(controls):
    """The pad id is the short prompt's own first new token: were padding history, the batch would
    penalize or ban it."""
    model = _looping_model("decoder")
    prompts = [[5, 17, 3, 40, 22, 9, 31], [8, 2, 60]]
    alone = [model.generate(torch.tensor([p]), 8, eos_token_id=None, **controls)[0, len(p) :] for p in prompts]
    pad = int(alone[1][0])
    batch = model.generate(prompts, 8, eos_token_id=None, pad_token_id=pad, **controls)
    assert batch[1, :4].eq(pad).all()
    for row, new in zip(batch, alone, strict=True):
        assert torch.equal(row[-8:], new)


def test_the_start_token_is_no_history():
    """An encoder-decoder whose first token repeats its start token still emits it when no token may
    repeat (no_repeat_ngram_size=1): the start token is not part of the target's history."""
    model = _looping_model("encoder_decoder")
    src = PROMPT[:1]
    with torch.no_grad():
        starts = torch.arange(model.config.vocab_size)[:, None]  # every token as the start, at once
        first = model(src.expand(len(starts), -1), starts)[:, -1].argmax(-1)  # (V,)
    start = int((first == starts[:, 0]).nonzero()[0])
    model = tiny_model(seed=1, arch="encoder_decoder", decoder_start_token_id=start)
    out = model.generate(src, 4, eos_token_id=None, no_repeat_ngram_size=1)[0].tolist()
    assert out[:2] == [start, start] and len(set(out[1:])) == 4


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "mode",
    [
        {"do_sample": True, "temperature": 0.8, "top_k": 30, "top_p": 0.95},
        {"num_beams": 3},
        {"num_beams": 2, "eos_token_id": 7, "length_penalty": 0.6},
    ],
)
def test_sampling_and_beam_search_obey_the_controls_with_and_without_cache(arch, mode):
    model = _looping_model(arch)
    base = {"eos_token_id": None, **mode}
    run = lambda **kw: model.generate(PROMPT, NEW, generator=torch.Generator().manual_seed(0), **{**base, **kw})  # noqa: E731
    cached = run(repetition_penalty=1.5, no_repeat_ngram_size=2)
    assert torch.equal(cached, run(repetition_penalty=1.5, no_repeat_ngram_size=2, use_cache=False))
    eos = base["eos_token_id"]
    for seq in _sequences(model, cached):  # cut at eos: after it comes padding
        assert _repeated_ngrams(seq[: seq.index(eos)] if eos in seq else seq, 2) == 0
    assert not torch.equal(cached, run())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("position", ["rope", "learned", "t5_relative"])
def test_greedy_with_and_without_cache_agree_with_controls(arch, position):
    model = tiny_model(arch=arch, position=position, n_kv_heads=2)
    prompts = [[5, 17, 3, 40, 22], [8, 2]]
    kw = dict(eos_token_id=None, repetition_penalty=1.3, no_repeat_ngram_size=3)
    assert torch.equal(model.generate(prompts, 12, **kw), model.generate(prompts, 12, use_cache=False, **kw))


# ---- settings ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value",
    [
        ("repetition_penalty", 0),
        ("repetition_penalty", -1.0),
        ("repetition_penalty", float("nan")),
        ("repetition_penalty", float("inf")),
        ("repetition_penalty", True),
        ("repetition_penalty", "1.2"),
        ("repetition_penalty", None),
        ("no_repeat_ngram_size", -1),
        ("no_repeat_ngram_size", 2.0),
        ("no_repeat_ngram_size", True),
        ("no_repeat_ngram_size", "3"),
        ("no_repeat_ngram_size", None),
    ],
)
def test_bad_values_are_config_errors_naming_the_field(field, value):
    with pytest.raises(zoo.ConfigError, match=f"^{field}=") as caught:
        tiny_model().generate(PROMPT, 2, **{field: value})
    assert "\n" not in str(caught.value)
    with pytest.raises(zoo.ConfigError, match=f"^{field}="):
        check_sampling(temperature=1.0, top_k=None, top_p=None, **{field: value})


def test_good_values_pass_the_check():
    check_sampling(temperature=1.0, top_k=None, top_p=None, repetition_penalty=0.5, no_repeat_ngram_size=4)
    check_sampling(temperature=1.0, top_k=None, top_p=None, repetition_penalty=2, no_repeat_ngram_size=0)


# ---- HF transformers' generate -----------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt2():
    """A tiny random HF GPT-2 (greedy paths that vary) and its zoo conversion."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=4,
            vocab_size=100,
            n_positions=64,
            bos_token_id=1,
            eos_token_id=2,
            initializer_range=0.2,
        )
    ).eval()
    hf.generation_config.eos_token_id, hf.generation_config.pad_token_id = None, 0  # run every step, as zoo
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hf, zoo.from_hf(hf)


@pytest.mark.parametrize(
    "kw",
    [
        {"repetition_penalty": 1.5},
        {"no_repeat_ngram_size": 1},
        {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3},
        {"num_beams": 3, "repetition_penalty": 1.5},
        {"num_beams": 3, "no_repeat_ngram_size": 2},
        {"num_beams": 4, "repetition_penalty": 2.0, "no_repeat_ngram_size": 2},
    ],
)
def test_generate_matches_hf_generate_on_gpt2(gpt2, kw):
    """Beam search included: HF applies the controls to each beam's log-probabilities, as zoo does."""
    hf, model = gpt2
    ids = torch.randint(3, 100, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16, **kw)
    got = model.generate(ids, 16, eos_token_id=None, **kw)
    assert got.tolist() == expected.tolist()
    assert not torch.equal(got, model.generate(ids, 16, eos_token_id=None, num_beams=kw.get("num_beams", 1)))
