"""A mask's rule and a position's bias are written once, and every attention kernel computes them.

Each mask writes ``mask_mod`` and each biased position ``score_mod`` (flex_attention's forms); the
dense tensors that sdpa and math read are derived from them (``Mask.allowed``, ``Position.bias``), and a
class that writes a dense half without its own mod is refused when it is defined. The walk below takes
every registered position x mask (x the window it may read) x form x attention kernel from the
registries, so a new component is tested by default: the config refuses a combination with a
ConfigError or the model keeps the properties (kernel = math, causality, cached = uncached)."""

from __future__ import annotations

import functools
import inspect
import itertools

import pytest
import torch
from conftest import tiny_config, tiny_model
from rounding import assert_rounding_close
from torch import Tensor

import zoo
from zoo.mask import Causal, Mask
from zoo.position import Position
from zoo.registry import ARCH, ATTENTION, MASK, POSITION
from zoo.rules import MaskMod, ScoreMod

B, T = 2, 8
MASK_SETTINGS = ({}, {"window": 3})  # what a mask may read besides its name


def _combinations() -> tuple[list[tuple], list[tuple]]:
    """(accepted, refused): every (form, mask, settings, position, kernel) of the registries; a refused
    one comes with what validating its config raised."""
    accepted, refused = [], []
    for form, mask, settings, position, kernel in itertools.product(ARCH, MASK, MASK_SETTINGS, POSITION, ATTENTION):
        case = (form, mask, settings, position, kernel)
        try:
            tiny_config(arch=form, mask=mask, position=position, attention=kernel, **settings).validate()
        except Exception as error:  # noqa: BLE001 - test_refused_combinations_are_config_errors judges it
            refused.append((*case, error))
        else:
            accepted.append(case)
    return accepted, refused


ACCEPTED, REFUSED = _combinations()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Hundreds of tiny forwards: on one thread, as a second one only makes each small op wait for it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _id(case: tuple) -> str:
    form, mask, settings, position, kernel = case[:5]
    return "-".join([form, mask, *(f"{k}{v}" for k, v in settings.items()), position, kernel])


def _where(predicate) -> list:
    return [pytest.param(*case, id=_id(case)) for case in ACCEPTED if predicate(*case)]


def _main_mask(form: str, mask: str, settings: dict) -> Mask:
    """The mask of the stack that reads input_ids, as the model builds it."""
    return zoo.build_model(tiny_config(arch=form, mask=mask, **settings)).stacks()[0].mask


@functools.cache
def _model(form: str, mask: str, settings: tuple, position: str, kernel: str) -> zoo.ZooModel:
    """One tiny model per combination (seed 0: the same weights for every kernel), one block deep: the
    stack hands every block the same inputs (what several blocks do is tested in test_flex_attention.py
    and test_models.py), and flex runs eagerly on the CPU, where each attention call costs ~0.05 s."""
    return tiny_model(arch=form, mask=mask, position=position, attention=kernel, n_layers=1, **dict(settings))


def _inputs(model: zoo.ZooModel, mask: Mask) -> dict[str, Tensor]:
    """Padded token ids (left for a decoder, as generation pads; right otherwise) and what the mask
    reads: per-row prefix lengths, or the documents of packed rows (in place of padding)."""
    g = torch.Generator().manual_seed(0)
    inputs = {
        "input_ids": torch.randint(1, 61, (B, T), generator=g),
        "attention_mask": torch.ones(B, T, dtype=torch.long),
    }
    inputs["attention_mask"][1, :3] = 0 if type(model).decoding is not None else 1
    inputs["attention_mask"][1, -3:] = 1 if type(model).decoding is not None else 0
    if type(model).cross_attention:
        inputs["decoder_input_ids"] = torch.randint(1, 61, (B, 5), generator=g)
        inputs["decoder_attention_mask"] = torch.tensor([[1] * 5, [1] * 3 + [0] * 2])
    if mask.needs_prefix_len:
        inputs["prefix_len"] = torch.tensor([3, 5])  # < T - 1: the last position lies past every prefix
    if mask.documents and "document_ids" in inspect.signature(model.forward).parameters:
        del inputs["attention_mask"]
        inputs["document_ids"] = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [0, 0, 1, 1, 1, 1, 1, 1]])
    return inputs


def _run(model: zoo.ZooModel, inputs: dict[str, Tensor]) -> Tensor:
    if type(model).cross_attention:  # prefix_len is the encoder's
        kw = {k: v for k, v in inputs.items() if k != "prefix_len"}
        memory = model.encode(inputs["input_ids"], inputs["attention_mask"], prefix_len=inputs.get("prefix_len"))
        return model.decode(
            kw["decoder_input_ids"], memory, kw["attention_mask"], decoder_attention_mask=kw["decoder_attention_mask"]
        )
    return model(**inputs)


def test_refused_combinations_are_config_errors():
    """A combination the config cannot build says so with a ConfigError, never another exception; and
    every registered mask and position composes in some form."""
    assert REFUSED, "the walk should meet combinations that the forms refuse (a decoder's bidirectional mask)"
    wrong = [(_id(case), repr(case[-1])) for case in REFUSED if not isinstance(case[-1], zoo.ConfigError)]
    assert not wrong
    assert {case[1] for case in ACCEPTED} == set(MASK) and {case[3] for case in ACCEPTED} == set(POSITION)
    assert {case[4] for case in ACCEPTED} == set(ATTENTION) and {case[0] for case in ACCEPTED} == set(ARCH)


def _causal_input(form: str, mask: str, settings: dict) -> str | None:
    """The input whose last token no earlier output may read: a decoding stack's target, or input_ids
    under a causal mask (or a prefix mask, whose prefixes end before the last position)."""
    if ARCH.get(form).cross_attention:
        return "decoder_input_ids"  # the decoder is causal whatever the encoder's mask
    main = _main_mask(form, mask, settings)
    return "input_ids" if main.causal or main.needs_prefix_len else None


@functools.cache
def _outputs(form: str, mask: str, settings: tuple, position: str, kernel: str, *, changed: bool = False) -> Tensor:
    """The model's outputs on :func:`_inputs`; ``changed``: with the last token of the causal input
    changed. Computed once per combination (flex runs eagerly on the CPU: each call costs)."""
    model = _model(form, mask, settings, position, kernel)
    inputs = _inputs(model, _main_mask(form, mask, dict(settings)))
    if changed:
        name = _causal_input(form, mask, dict(settings))
        inputs[name] = inputs[name].clone()
        inputs[name][:, -1] = (inputs[name][:, -1] + 7) % 60 + 1
    with torch.no_grad():
        return _run(model, inputs)


@pytest.mark.parametrize(("form", "mask", "settings", "position", "kernel"), _where(lambda *c: c[4] != "math"))
def test_every_kernel_computes_what_math_does(form, mask, settings, position, kernel):
    key = (form, mask, tuple(sorted(settings.items())), position)
    assert_rounding_close(_outputs(*key, kernel), _outputs(*key, "math"), _model(*key, "math"))


@pytest.mark.parametrize(
    ("form", "mask", "settings", "position", "kernel"), _where(lambda *c: _causal_input(*c[:3]) is not None)
)
def test_a_future_token_leaves_past_outputs_unchanged(form, mask, settings, position, kernel):
    key = (form, mask, tuple(sorted(settings.items())), position, kernel)
    before, after = _outputs(*key), _outputs(*key, changed=True)
    assert_rounding_close(after[:, :-1], before[:, :-1], _model(*key))
    assert not torch.allclose(after[:, -1], before[:, -1])  # the change does reach its own position


@pytest.mark.parametrize(
    ("form", "mask", "settings", "position", "kernel"), _where(lambda *c: ARCH.get(c[0]).decoding is not None)
)
def test_cached_decoding_equals_the_full_forward(form, mask, settings, position, kernel):
    """A prompt of 3 (left-padded in row 1) then one token a step through the KV cache, against one
    forward; the cache starts too small (it must grow) and the sliding window's bounds it."""
    model = _model(form, mask, tuple(sorted(settings.items())), position, kernel)
    n = 5
    tokens = torch.randint(1, 61, (B, n), generator=torch.Generator().manual_seed(1))
    keep = torch.ones(B, n, dtype=torch.long)
    keep[1, :2] = 0
    prefix = {"prefix_len": 3} if _main_mask(form, mask, settings).needs_prefix_len else {}
    cache = model.new_cache(capacity=4)
    with torch.no_grad():
        if type(model).cross_attention:
            memory = model.encode(torch.randint(1, 61, (B, 6)), **prefix)
            full = model.decode(tokens, memory, decoder_attention_mask=keep)
            steps = [model.decode(tokens[:, :3], memory, decoder_attention_mask=keep[:, :3], cache=cache)]
            steps += [
                model.decode(tokens[:, t : t + 1], memory, decoder_attention_mask=keep[:, : t + 1], cache=cache)
                for t in range(3, n)
            ]
        else:
            full = model(tokens, keep, **prefix)
            steps = [model(tokens[:, :3], keep[:, :3], cache=cache, **prefix)]
            steps += [model(tokens[:, t : t + 1], keep[:, : t + 1], cache=cache, **prefix) for t in range(3, n)]
    assert_rounding_close(torch.cat(steps, dim=1), full, model)


# --- a rule written once: refused halves, derived dense forms, fast paths that agree ---------------


def test_a_position_that_writes_only_a_dense_bias_is_refused_when_defined():
    """flex would drop such a bias (it reads score_mod): the class is refused as it is defined."""
    with pytest.raises(TypeError, match="score_mod"):

        class OnlyBias(Position):  # noqa: F841
            def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
                return (q_pos[:, None] - k_pos[None, :]).float()[None]

    with pytest.raises(TypeError, match="score_mod"):  # a new bias over an inherited mod: flex would read the old

        class NewBias(POSITION.get("alibi")):  # noqa: F841
            def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
                return torch.zeros(self.n_heads, q_pos.shape[0], k_pos.shape[0])


def test_a_mask_that_writes_only_a_dense_rule_is_refused_when_defined():
    """flex would lose it (it reads mask_mod): causality gone, or documents merged."""
    with pytest.raises(TypeError, match="mask_mod"):

        class OnlyAllowed(Mask):  # noqa: F841
            def allowed(self, q_pos: Tensor, k_pos: Tensor, prefix_len=None) -> Tensor:
                return k_pos[None, :] <= q_pos[:, None]

    with pytest.raises(TypeError, match="mask_mod"):  # narrower than the causal mod it inherits

        class Narrower(Causal):  # noqa: F841
            def allowed(self, q_pos: Tensor, k_pos: Tensor, prefix_len=None) -> Tensor:
                return (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] > q_pos[:, None] - 2)

    with pytest.raises(TypeError, match="documents_mod"):

        class OwnDocuments(Causal):  # noqa: F841
            def within_documents(self, allowed: Tensor | None, document_ids: Tensor) -> Tensor:
                return document_ids[:, None, :, None] == document_ids[:, None, None, :]

    class FastPath(Causal):  # both halves in one class: a dense fast path, allowed
        def mask_mod(self, prefix_len=None) -> MaskMod:
            return lambda b, h, q, kv: kv <= q

        def allowed(self, q_pos: Tensor, k_pos: Tensor, prefix_len=None) -> Tensor:
            return k_pos[None, :] <= q_pos[:, None]

    with pytest.raises(TypeError, match="allowed"):  # a new mod under an inherited fast path

        class NewMod(FastPath):  # noqa: F841
            def mask_mod(self, prefix_len=None) -> MaskMod:
                return lambda b, h, q, kv: kv < q


class _Steps(Position):
    """A bias written only as a score_mod: a per-head penalty on keys more than 2 positions away."""

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads

    @classmethod
    def from_config(cls, cfg: zoo.ModelConfig, *, causal: bool) -> _Steps:
        return cls(cfg.n_heads)

    def score_mod(self, device: torch.device) -> ScoreMod:
        return lambda score, b, h, q, kv: score - 0.5 * (h + 1) * ((q - kv).abs() > 2)


class _Skip(Mask):
    """A mask written only as a mask_mod: causal, without the key just before each query."""

    causal = True

    def mask_mod(self, prefix_len=None) -> MaskMod:
        return lambda b, h, q, kv: (kv <= q) & (kv != q - 1)


@pytest.fixture
def one_half_components():
    """``_Steps`` and ``_Skip`` registered for one test."""
    POSITION.register("test_steps")(_Steps)
    MASK.register("test_skip")(_Skip)
    yield
    POSITION.unregister("test_steps")
    MASK.unregister("test_skip")


@pytest.mark.parametrize("arch", ["decoder", "encoder"])
def test_a_rule_written_only_as_a_mod_holds_under_every_kernel(arch, one_half_components):
    """The dense kernels derive it: they compute what flex does, and not what the model without it does."""
    inputs = {"input_ids": torch.randint(1, 61, (B, T), generator=torch.Generator().manual_seed(0))}
    out = {}
    for kernel, (position, mask) in itertools.product(ATTENTION, [("test_steps", "test_skip"), ("none", "causal")]):
        with torch.no_grad():
            out[kernel, position] = tiny_model(arch=arch, position=position, mask=mask, attention=kernel)(**inputs)
    reference = tiny_model(arch=arch)
    for kernel in ATTENTION:
        assert_rounding_close(out[kernel, "test_steps"], out["flex", "test_steps"], reference, msg=kernel)
    assert not torch.allclose(out["math", "test_steps"], out["math", "none"], atol=1e-3)


def _scalar_mask(mod: MaskMod, q_pos: Tensor, k_pos: Tensor, rows: int) -> Tensor:
    """``mod`` called on one (b, q, kv) at a time, as flex_attention reads it: (rows, Tq, Tk)."""

    def at(*idx: int) -> Tensor:
        return mod(*(torch.tensor(i) for i in idx))

    return torch.stack(
        [torch.stack([torch.stack([at(b, 0, int(q), int(kv)) for kv in k_pos]) for q in q_pos]) for b in range(rows)]
    ).bool()


def _scalar_bias(mod: ScoreMod, q_pos: Tensor, k_pos: Tensor, heads: int) -> Tensor:
    """``mod`` on a zero score at one (h, q, kv) at a time: (H, Tq, Tk)."""

    def at(h: int, q: int, kv: int) -> Tensor:
        return mod(torch.zeros(()), torch.tensor(0), torch.tensor(h), torch.tensor(q), torch.tensor(kv))

    return torch.stack(
        [torch.stack([torch.stack([at(h, int(q), int(kv)) for kv in k_pos]) for q in q_pos]) for h in range(heads)]
    ).float()


def _components() -> list:
    """Every (mask, position) instance a stack of an accepted combination holds, once per kind."""
    seen = {}
    for form, mask, settings, position, _kernel in ACCEPTED:
        for stack in _model(form, mask, tuple(sorted(settings.items())), position, "math").stacks():
            for part in (stack.mask, stack.position):
                seen.setdefault(
                    repr(type(part)) + repr(vars(part).get("window")) + repr(getattr(part, "bidirectional", None)), part
                )
    return [pytest.param(part, id=type(part).__name__ + str(i)) for i, part in enumerate(seen.values())]


@pytest.mark.parametrize("part", _components())
def test_dense_rules_equal_their_mod_read_one_pair_at_a_time(part):
    """What sdpa and math read (derived, or a class's own fast path) is what flex computes, for a full
    forward and for queries P..P+T-1 of a KV cache."""
    for past, n in ((0, 6), (4, 3)):
        q_pos, k_pos = torch.arange(n) + past, torch.arange(past + n)
        if isinstance(part, Mask):
            for prefix_len in [3, torch.tensor([2, 5])] if part.needs_prefix_len else [None]:
                mod, rows = part.mask_mod(prefix_len), len(prefix_len) if isinstance(prefix_len, Tensor) else 1
                dense = part.allowed(q_pos, k_pos, prefix_len)
                expected = _scalar_mask(mod, q_pos, k_pos, rows) if mod else torch.ones(rows, n, past + n).bool()
                assert torch.equal(
                    torch.ones_like(expected) if dense is None else dense.expand_as(expected[:, None]).squeeze(1),
                    expected,
                )
        else:
            mod, dense = part.score_mod(q_pos.device), part.bias(q_pos, k_pos)
            assert (mod is None) == (dense is None) == (not part.has_bias)
            if mod is not None:
                torch.testing.assert_close(dense, _scalar_bias(mod, q_pos, k_pos, part.n_heads))
    if isinstance(part, Mask) and part.documents:
        ids = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 2, 2]])
        expected = _scalar_mask(part.documents_mod(None, ids), torch.arange(5), torch.arange(5), 2)
        assert torch.equal(part.within_documents(None, ids)[:, 0], expected)


@pytest.mark.parametrize(
    "part",
    [p for p in _components() if isinstance(p.values[0], Position) and type(p.values[0]).bias is not Position.bias],
)
def test_a_hand_written_bias_trains_as_its_score_mod_does(part):
    """A fast path's gradient equals the derived form's (``Position.bias``, evaluated from score_mod)."""
    q_pos, k_pos = torch.arange(3) + 4, torch.arange(7)
    weight = torch.randn(part.n_heads, 3, 7, generator=torch.Generator().manual_seed(0))
    grads = []
    for bias in (type(part).bias, Position.bias):
        part.zero_grad()
        (bias(part, q_pos, k_pos) * weight).sum().backward()
        grads.append([p.grad.clone() for p in part.parameters()])
    assert grads[0] and all(torch.allclose(a, b) for a, b in zip(*grads, strict=True))
