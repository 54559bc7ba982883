"""Generation limits in the library: lengths that cannot fit are refused before anything is
allocated, learned positions stop where their table ends (keeping the tokens, with a warning), empty
and all-padding prompts are refused, and sampling settings that cannot work are ConfigErrors naming
them. zoo-generate and zoo-attention on the same mistakes: tests/test_generate_limits_verbs.py."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from conftest import tiny_model

import zoo
from zoo.generation import GenerationLimitWarning, PromptError, filter_logits


# ---- the library ---------------------------------------------------------------------------------
def test_a_length_that_cannot_fit_is_refused_before_anything_is_allocated(monkeypatch):
    model = tiny_model(position="rope")
    monkeypatch.setattr(model, "new_cache", lambda *a, **k: pytest.fail("a cache was allocated"))
    with pytest.raises(zoo.ConfigError, match=r"max_new_tokens=1000000000000 cannot fit") as error:
        model.generate(torch.tensor([[5, 6, 7]]), 10**12)
    fits = int(re.search(r"at most (\d+) new tokens fit", str(error.value)).group(1))
    assert 0 < fits < 10**12
    with pytest.raises(zoo.ConfigError, match=r"at most (\d+) new tokens") as beams:  # 4 beams: a quarter fits
        model.generate(torch.tensor([[5, 6, 7]]), 10**12, num_beams=4)
    assert int(re.search(r"at most (\d+)", str(beams.value)).group(1)) < fits


@pytest.mark.parametrize(
    "arch,beams,use_cache",
    [("decoder", 1, True), ("decoder", 1, False), ("decoder", 3, True), ("encoder_decoder", 1, True)],
)
def test_learned_positions_stop_at_the_table_keep_the_tokens_and_warn(arch, beams, use_cache):
    model = tiny_model(arch=arch, position="learned", max_seq_len=10)
    prompt = torch.randint(5, 61, (2, 6))
    start = 6 if arch == "decoder" else 1  # tokens the output holds before the new ones
    kw = dict(eos_token_id=None, num_beams=beams, use_cache=use_cache)
    with pytest.warns(GenerationLimitWarning, match=f"stopped after {10 - start} of max_new_tokens=50"):
        out = model.generate(prompt, 50, **kw)
    assert out.shape == (2, 10)  # as many tokens as the positions can number
    assert torch.equal(out, model.generate(prompt, 10 - start, **kw))  # the same tokens a fitting request gives
    if beams == 1:  # a text that ends (eos) before the table is not cut short: no warning
        kw["eos_token_id"] = int(out[0, start])  # the first token row 0 picks
        with warnings.catch_warnings():
            warnings.simplefilter("error", GenerationLimitWarning)
            assert model.generate(prompt[:1], 50, **kw).shape == (1, start + 1)


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_a_prompt_longer_than_the_positions_is_a_prompt_error(arch):
    model = tiny_model(arch=arch, position="learned", max_seq_len=8)
    with pytest.raises(PromptError, match="is 9 tokens long but the model's positions end at 8"):
        model.generate(torch.randint(5, 61, (1, 9)), 2)


@pytest.mark.parametrize("prompts", [[], [[]], [[5, 6], []], torch.zeros(2, 0, dtype=torch.long)])
def test_empty_prompts_are_refused(prompts):
    with pytest.raises(PromptError, match="no prompts|has no tokens"):
        tiny_model().generate(prompts, 3)


def test_a_prompt_that_is_all_padding_is_refused():
    with pytest.raises(PromptError, match="prompt 1 of input_ids has no tokens"):
        tiny_model().generate(torch.tensor([[5, 6], [0, 0]]), 3, attention_mask=torch.tensor([[1, 1], [0, 0]]))


def test_max_positions_asks_the_position_class():
    assert tiny_model(position="learned", max_seq_len=10).max_positions == 10
    assert tiny_model(position="rope", max_seq_len=10).max_positions is None  # rope numbers any position
    assert tiny_model(arch="encoder", position="learned", max_seq_len=12).max_positions == 12


def test_temperature_zero_is_greedy():
    model = tiny_model()
    prompt = torch.randint(5, 61, (2, 4))
    greedy = model.generate(prompt, 8, eos_token_id=None)
    assert torch.equal(model.generate(prompt, 8, eos_token_id=None, do_sample=True, temperature=0.0), greedy)


def test_top_k_zero_or_none_keeps_every_token():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isfinite(filter_logits(logits, top_k=0)).all()
    torch.testing.assert_close(filter_logits(logits, top_k=0), filter_logits(logits, top_k=None))
    model, prompt = tiny_model(), torch.randint(5, 61, (2, 4))
    sample = lambda top_k: model.generate(
        prompt,
        8,
        eos_token_id=None,
        do_sample=True,
        top_k=top_k,  # noqa: E731
        generator=torch.Generator().manual_seed(1),
    )
    assert torch.equal(sample(0), sample(None))


@pytest.mark.parametrize(
    "setting,message",
    [
        (dict(top_p=0.0), "top_p=0.0 must be in (0, 1]"),
        (dict(top_p=1.5), "top_p=1.5"),
        (dict(top_p=float("nan")), "top_p=nan"),
        (dict(top_k=-1), "top_k=-1 must be a whole number >= 0"),
        (dict(top_k=2.5), "top_k=2.5"),
        (dict(temperature=-0.5), "temperature=-0.5 must be a number >= 0"),
        (dict(temperature="hot"), "temperature='hot'"),
        (dict(num_beams=0), "num_beams=0 must be a whole number >= 1"),
        (dict(max_new_tokens=-1), "max_new_tokens=-1 must be a whole number >= 0"),
        (dict(max_new_tokens="10"), "max_new_tokens='10'"),
    ],
)
def test_settings_that_cannot_work_are_config_errors_naming_them(setting, message):
    kw = {"max_new_tokens": 4, "do_sample": True, **setting}
    with pytest.raises(zoo.ConfigError, match=re.escape(message)):
        tiny_model().generate(torch.tensor([[5, 6]]), **kw)
