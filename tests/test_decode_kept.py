"""``generate(compile=True)`` builds its static step once per model and shape and keeps it: a later call
with the same batch and capacity (an encoder-decoder: the same source bucket) replays the same graph
over the same cache, and an encoder-decoder compiles once per bucket of source lengths, not per length.

The CUDA graphs are test_decode_graphs.FakeGraphs (a CPU has none); compiling uses dynamo's counting
backend, which traces without building kernels, so the recompile count costs seconds."""

from __future__ import annotations

import functools
import gc
import weakref

import torch
from conftest import tiny_model
from test_decode_graphs import NEW, PROMPTS, FakeGraphs, _both, _use
from torch._dynamo.testing import CompileCounter

import zoo
import zoo.decoding
from zoo.decoding import GRAPH_WARMUP, KEPT_STEPS, EncoderDecoderSteps, source_bucket


def _fakes(monkeypatch) -> FakeGraphs:
    fakes = FakeGraphs()
    _use(monkeypatch, fakes)
    return fakes


def test_a_later_call_of_the_same_shape_replays_the_kept_graph(monkeypatch):
    """Other prompts of the same batch and capacity: no new capture, and the tokens of eager decoding
    (the kept cache emptied, the kept mask and padding counts refilled)."""
    fakes = _fakes(monkeypatch)
    model = tiny_model(position="rope", n_kv_heads=2)
    assert torch.equal(*_both(model, PROMPTS))
    other = [[9, 8, 7, 6], [1, 2, 3, 4, 5, 6, 7, 8, 9], [40]]  # other lengths, other padding
    graphed, eager = _both(model, other)
    assert torch.equal(graphed, eager)
    unpadded = torch.randint(5, 61, (3, 6))  # no mask: another kept step
    assert torch.equal(*_both(model, unpadded))
    assert fakes.captures == 2 and fakes.replays == 3 * (NEW - 1) - 2 * GRAPH_WARMUP


def test_an_encoder_decoder_replays_one_graph_for_sources_in_one_bucket(monkeypatch):
    fakes = _fakes(monkeypatch)
    model = tiny_model(arch="encoder_decoder", position="t5_relative")
    for source in (PROMPTS, [[3, 4], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22]]):
        graphed, eager = _both(model, source)
        assert torch.equal(graphed, eager)
    assert fakes.captures == 1


def test_kept_steps_follow_weights_changed_in_place_and_are_dropped_when_they_move(monkeypatch):
    fakes = _fakes(monkeypatch)
    model = tiny_model(position="rope")
    _both(model, PROMPTS)
    model.load_state_dict(tiny_model(seed=1).state_dict())  # in place: the kept graph reads the new weights
    graphed, eager = _both(model, PROMPTS)
    assert torch.equal(graphed, eager) and fakes.captures == 1
    model.double()  # every parameter moves: a graph of the old ones would read freed memory
    graphed, eager = _both(model, PROMPTS)
    assert torch.equal(graphed, eager) and fakes.captures == 2


def test_at_most_a_few_steps_are_kept_per_model_and_none_keeps_the_model_alive(monkeypatch):
    monkeypatch.setattr(zoo.decoding, "compiled", lambda step: step)  # (a FakeGraph holds its call's model)
    model = tiny_model()
    for batch in range(1, KEPT_STEPS + 3):
        model.generate(torch.randint(5, 61, (batch, 4)), 4, compile=True)
    assert len(zoo.decoding._KEPT[model].steps) == KEPT_STEPS
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_the_bucketed_source_gives_the_logits_of_the_unbucketed_one(monkeypatch):
    """The static step reads the encoder output padded to its bucket, the padding masked: every step's
    logits are those of the growing cache over the source as it is, up to float rounding."""
    monkeypatch.setattr(zoo.decoding, "compiled", lambda step: step)
    model = tiny_model(arch="encoder_decoder", position="t5_relative", n_kv_heads=2)
    src = torch.randint(5, 61, (2, 11))
    mask = torch.ones_like(src)
    mask[1, 7:] = 0
    with torch.inference_mode():
        static, dynamic = (EncoderDecoderSteps(model, src, mask, caching, 6) for caching in ("static", "dynamic"))
        assert static.memory.shape[1] == source_bucket(11) == 16 and dynamic.memory.shape[1] == 11
        torch.testing.assert_close(static.first(), dynamic.first(), rtol=1e-5, atol=1e-5)
        for token in torch.randint(5, 61, (5, 2)):
            torch.testing.assert_close(static.next(token), dynamic.next(token), rtol=1e-5, atol=1e-5)


def test_source_buckets_are_powers_of_two_from_16():
    assert [source_bucket(n) for n in (1, 16, 17, 32, 33, 100, 512, 513)] == [16, 16, 32, 32, 64, 128, 512, 1024]


def test_an_encoder_decoder_recompiles_once_per_source_bucket_not_per_length(monkeypatch):
    """20 source lengths from 2 to 59 tokens fall in 3 buckets (16, 32, 64): 3 compiled frames. (Before
    the buckets, every length compiled anew until dynamo's limit of 8, then ran eagerly.) Tokens as eager."""
    counter = CompileCounter()
    monkeypatch.setattr(
        zoo.decoding, "compiled", functools.cache(lambda step: torch.compile(step, backend=counter, dynamic=False))
    )
    torch._dynamo.reset()
    try:
        model = tiny_model(arch="encoder_decoder", position="rope")
        lengths = [2 + 3 * i for i in range(20)]
        gen = torch.Generator().manual_seed(0)
        for length in lengths:
            src = torch.randint(5, 61, (2, length), generator=gen)
            out = model.generate(src, 4, compile=True, eos_token_id=None)
            if length in (2, 29, 59):
                assert torch.equal(out, model.generate(src, 4, eos_token_id=None)), length
        buckets = {source_bucket(n) for n in lengths}
        assert len(buckets) == 3 and counter.frame_count == len(buckets)
    finally:
        torch._dynamo.reset()
