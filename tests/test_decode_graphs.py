"""``generate(compile=True)`` on CUDA replays its single-token step as a CUDA graph (zoo.decoding.StaticStep);
the tokens are those of eager decoding, in every mode.

A CPU has no graphs, so these tests stand in for CUDA with ``FakeGraphs``, which keeps a graph's
contract: a capture runs nothing and returns an output buffer; each replay runs the captured call on
whatever its inputs hold then and writes that buffer; and every tensor the call reaches must still be
where it was at the capture (a graph reads fixed addresses). Most tests run the step eagerly (compiling
on a CPU builds C++); one compiles it for real."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from conftest import tiny_model
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

import zoo
import zoo.decoding
import zoo.sampling
from zoo.decoding import GRAPH_WARMUP, StaticStep, replays_graphs
from zoo.sampling import EOS_CHECK_EVERY, eos_check_interval

PROMPTS = [[5, 17, 3, 40, 22, 9, 31], [8, 2, 60], [11, 12, 13, 14, 15]]
NEW = 10


def _addresses(args: tuple[Any, ...]) -> dict[str, int]:
    """Where every tensor that a step's arguments reach is stored: tensors, and modules' parameters and buffers."""
    found = {}
    for i, arg in enumerate(args):
        if isinstance(arg, Tensor):
            found[str(i)] = arg.data_ptr()
        elif isinstance(arg, nn.Module):
            for name, t in [*arg.named_parameters(), *arg.named_buffers()]:
                found[f"{i}.{name}"] = t.data_ptr()
    return found


class FakeGraphs:
    """CUDA graphs on the CPU: ``compiled`` (what zoo.decoding compiles with) wraps each step so that a
    call during a capture only records itself; ``graph`` stands for ``torch.cuda.graph`` and ``new``
    for ``torch.cuda.CUDAGraph``."""

    def __init__(self, compile_step: Callable[[Callable[..., Tensor]], Callable[..., Tensor]] = lambda step: step):
        self.compile_step = compile_step
        self.capturing: FakeGraph | None = None
        self.captures = self.replays = 0

    def compiled(self, step: Callable[..., Tensor]) -> Callable[..., Tensor]:
        run = self.compile_step(step)

        def call(*args: Any) -> Tensor:
            if self.capturing is None:
                return run(*args)
            model, token = args[0], args[1]
            out = torch.empty(token.shape[0], model.config.vocab_size, dtype=model.embed.weight.dtype)
            self.capturing.call = (run, args, out, _addresses(args))
            return out

        return call

    def new(self) -> FakeGraph:
        return FakeGraph(self)

    @contextlib.contextmanager
    def graph(self, graph: FakeGraph) -> Iterator[None]:
        self.capturing = graph
        try:
            yield
        finally:
            self.capturing = None
            self.captures += 1


class FakeGraph:
    def __init__(self, fakes: FakeGraphs) -> None:
        self.fakes = fakes
        self.call: tuple | None = None

    def replay(self) -> None:
        run, args, out, addresses = self.call
        assert _addresses(args) == addresses, "a tensor the graph reads has moved"
        out.copy_(run(*args))
        self.fakes.replays += 1


@pytest.fixture
def fakes(monkeypatch) -> FakeGraphs:
    """Decoding as on CUDA, with FakeGraphs for the graphs and the step run eagerly."""
    fakes = FakeGraphs()
    _use(monkeypatch, fakes)
    return fakes


def _use(monkeypatch, fakes: FakeGraphs) -> None:
    monkeypatch.setattr(zoo.decoding, "replays_graphs", lambda device: True)
    monkeypatch.setattr(zoo.decoding, "compiled", fakes.compiled)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", fakes.new)
    monkeypatch.setattr(torch.cuda, "graph", fakes.graph)


def _both(model: zoo.ZooModel, prompts, seed: int | None = None, **kw) -> tuple[Tensor, Tensor]:
    """generate(compile=True) and generate(compile=False), each with a generator seeded alike."""
    kw = {"max_new_tokens": NEW, "eos_token_id": None, **kw}
    gen = (lambda: None) if seed is None else (lambda: torch.Generator().manual_seed(seed))
    return model.generate(prompts, compile=True, generator=gen(), **kw), model.generate(prompts, generator=gen(), **kw)


MODES = {
    "greedy": {},
    "sampling": dict(do_sample=True, temperature=0.8, top_k=20, top_p=0.9, seed=3),
    "repetition_penalty": dict(repetition_penalty=1.5),
    "no_repeat_ngram_size": dict(no_repeat_ngram_size=2),
    "beams": dict(num_beams=3),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_replayed_steps_decode_the_eager_tokens(fakes, arch, mode):
    """Left-padded prompts (right-padded sources) of three lengths, every decoding mode: warm-up steps,
    one capture, then replays, and the tokens of eager decoding."""
    model = tiny_model(arch=arch, position="rope", n_kv_heads=2)
    graphed, eager = _both(model, PROMPTS, **MODES[mode])
    assert graphed.unique().numel() > 3, "a constant continuation would make the comparison vacuous"
    assert torch.equal(graphed, eager)
    assert fakes.captures == 1 and fakes.replays == NEW - 1 - GRAPH_WARMUP


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_replayed_steps_read_an_int8_cache(fakes, arch):
    model = tiny_model(arch=arch, position="alibi")
    model.kv_dtype = "int8"
    assert torch.equal(*_both(model, PROMPTS))
    assert torch.equal(*_both(model, PROMPTS, num_beams=2))
    assert fakes.replays > 0


def test_replayed_steps_of_an_unpadded_batch(fakes):
    """No mask and no positions: the static step finds each position in the cache's counter."""
    model = tiny_model(position="learned")
    assert torch.equal(*_both(model, torch.randint(5, 61, (2, 6))))
    assert fakes.replays == NEW - 1 - GRAPH_WARMUP


def test_short_decoding_captures_nothing(fakes):
    """A graph pays off only after the warm-up steps: fewer new tokens than that never capture."""
    model = tiny_model()
    assert torch.equal(*_both(model, PROMPTS, max_new_tokens=GRAPH_WARMUP + 1))
    assert fakes.captures == 0


def test_a_capture_that_fails_is_one_line_once_and_decodes_without_graphs(monkeypatch, capsys):
    """One ``zoo: warning:`` line on stderr, once per process however many calls fail; the step kept for
    the next call runs compiled without trying to capture again."""
    fakes = FakeGraphs()
    _use(monkeypatch, fakes)
    monkeypatch.setattr(zoo.decoding, "_told_capture_failed", False)
    tried = []

    def refuse(graph):
        tried.append(graph)
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    monkeypatch.setattr(torch.cuda, "graph", refuse)
    model = tiny_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a line, not a warning
        graphed, eager = _both(model, PROMPTS)
        again, _ = _both(model, PROMPTS)
        _both(tiny_model(seed=1), PROMPTS)  # another model's failure: still no second line
    assert torch.equal(graphed, eager) and torch.equal(again, eager) and fakes.replays == 0
    err = capsys.readouterr().err
    assert err.count("zoo: warning:") == 1 and len(err.splitlines()) == 1, err
    assert "could not capture" in err and "operation not permitted" in err and "more detail" not in err
    assert len(tried) == 2  # once per kept step (two models), not once per call


def test_compiled_replayed_steps_decode_the_eager_tokens(monkeypatch):
    """torch.compile for real, inside FakeGraphs: the compiled step reads its inputs from the runner's
    buffers at every replay."""
    fakes = FakeGraphs(compile_step=zoo.decoding.compiled)
    _use(monkeypatch, fakes)
    model = tiny_model(position="rope", n_kv_heads=2)
    graphed, eager = _both(model, PROMPTS, repetition_penalty=1.5)
    assert torch.equal(graphed, eager) and fakes.replays == NEW - 1 - GRAPH_WARMUP


def test_graphs_are_asked_for_on_cuda_only():
    assert replays_graphs(torch.device("cuda")) and replays_graphs(torch.device("cuda", 1))
    assert not replays_graphs(torch.device("cpu")) and not replays_graphs(torch.device("meta"))


@pytest.fixture
def made(monkeypatch) -> list[StaticStep]:
    """Every StaticStep that decoding builds, as it builds them."""
    steps: list[StaticStep] = []
    init = StaticStep.__init__

    def spy(self, *args, **kw):
        init(self, *args, **kw)
        steps.append(self)

    monkeypatch.setattr(StaticStep, "__init__", spy)
    return steps


def test_on_the_cpu_compile_captures_no_graph(monkeypatch, made):
    """What CI runs: the static runner with the compiled step at every token, and no CUDA graph."""

    def no_graph():
        raise AssertionError("a CUDA graph was captured on the CPU")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", no_graph)
    monkeypatch.setattr(zoo.decoding, "compiled", lambda step: step)
    for arch in ("decoder", "encoder_decoder"):
        assert torch.equal(*_both(tiny_model(arch=arch), PROMPTS))
    assert len(made) == 2 and not any(step.graphs or step.graph is not None for step in made)
    assert all(step.calls == NEW - 1 for step in made)


def test_the_end_of_every_row_is_checked_seldom_on_an_accelerator():
    assert eos_check_interval(torch.device("cpu")) == 1
    assert eos_check_interval(torch.device("cuda")) == EOS_CHECK_EVERY > 1


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
@pytest.mark.parametrize("sampled", [False, True])
def test_checking_for_eos_seldom_gives_the_tokens_of_checking_at_every_step(monkeypatch, arch, sampled):
    """Steps run past the one where every row ended are cut off: the output stops where a check at
    every step stops it. (Greedy decoding of a tiny model repeats itself: its eos ends some rows only.)"""
    model = tiny_model(arch=arch, position="learned")
    kw = dict(do_sample=True, temperature=1.5) if sampled else {}
    gen = lambda: torch.Generator().manual_seed(1)  # noqa: E731
    free = model.generate(PROMPTS, 20, eos_token_id=None, generator=gen(), **kw)
    start = free.shape[1] - 20
    eos, ends = _eos(free[:, start:])
    assert len(set(ends)) > 1, "rows that end together would not show a late check"
    last = None if None in ends else max(ends) + 1  # the step where every row has ended
    assert last is not None or not sampled, "sampling should end every row"
    late = next(k for k in (4, 5) if last is None or last % k)  # no check at that very step
    outs = []
    for every in (1, late):
        monkeypatch.setattr(zoo.sampling, "eos_check_interval", lambda device, every=every: every)
        outs.append(model.generate(PROMPTS, 20, eos_token_id=eos, pad_token_id=0, generator=gen(), **kw))
    assert torch.equal(outs[0], outs[1])
    assert outs[0].shape[1] == start + (20 if last is None else last)  # stopped where the last row ended


def _eos(generated: Tensor) -> tuple[int, list[int | None]]:
    """The token of ``generated`` (B, n) that, as eos, ends rows at the most different steps, then the
    most rows, soonest; and the step where each row ends (None: never)."""
    best = None
    for token in generated.unique().tolist():
        ends = [int(f[0]) if len(f) else None for f in ((row == token).nonzero() for row in generated)]
        found = [e for e in ends if e is not None]
        key = (len(set(found)), len(found), -max(found))
        if best is None or key > best[0]:
            best = key, token, ends
    return best[1], best[2]


class _Syncs(TorchDispatchMode):
    """Counts the reads of a tensor's value by the host (``item``, ``int``, ``bool``): each waits for the
    device."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("eos", [None, 7])
def test_the_loop_waits_for_the_device_no_more_often_for_more_tokens(fakes, monkeypatch, eos):
    """As on CUDA (graphs, the end of every row checked every EOS_CHECK_EVERY steps): the host reads
    no value at any step, so decoding 12 tokens reads as many as decoding 4."""
    monkeypatch.setattr(zoo.sampling, "eos_check_interval", lambda device: EOS_CHECK_EVERY)
    model = tiny_model(position="rope")
    prompt = torch.randint(8, 61, (2, 5))  # no padding: an eager step reads no mask
    counts = []
    for new in (4, 12):
        with _Syncs() as syncs:
            model.generate(prompt, new, compile=True, eos_token_id=eos)
        counts.append(syncs.count)
    assert counts[0] == counts[1]


def _capture_fails(error: BaseException) -> None:
    raise AssertionError(f"the CUDA graph capture failed: {error}") from error


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_compile_replays_a_captured_graph(monkeypatch, made):
    """The real capture: padded prompts, greedy, a repetition penalty and beams (reordered in place under
    the graph), in float32. The graph gives the tokens of the same compiled step run without a graph
    (not of eager decoding: inductor's kernels round differently, and a near-tie on a random model
    would flip a token); a failed capture is an error here, not a line and a slower path. A second
    call of the same shape replays the kept graph."""
    monkeypatch.setattr(zoo.decoding, "capture_failed", _capture_fails)
    model = tiny_model(position="rope", n_kv_heads=2).cuda()
    kw_cases = ({}, dict(repetition_penalty=1.5), dict(num_beams=2))
    graphed = [model.generate(PROMPTS, NEW, compile=True, eos_token_id=None, **kw) for kw in kw_cases]
    assert len(made) == 2 and all(step.graph is not None for step in made)  # beams: another batch
    again = model.generate(PROMPTS, NEW, compile=True, eos_token_id=None)
    assert len(made) == 2 and torch.equal(again, graphed[0])  # kept: no new step, no new capture
    monkeypatch.setattr(zoo.decoding, "replays_graphs", lambda device: False)
    for kw, tokens in zip(kw_cases, graphed, strict=True):
        plain = model.generate(PROMPTS, NEW, compile=True, eos_token_id=None, **kw)
        assert torch.equal(tokens, plain), kw
    assert not any(step.graphs or step.graph is not None for step in made[2:])  # those ran without a graph
