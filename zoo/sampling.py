"""How ``generate`` (zoo.generation) picks one token at a time without beams: greedy (the most likely
token) or sampled from the logits after temperature, top-k and top-p. The repeat controls (zoo.logits)
act on the raw logits first. Shapes: B rows (prompts), V vocabulary.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from zoo.logits import RepeatControls
from zoo.registry import ConfigError

if TYPE_CHECKING:
    from zoo.decoding import Steps


def filter_logits(
    logits: Tensor, *, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """Temperature, then keep the k most likely tokens, then the smallest set whose probability
    reaches top_p (Holtzman et al. 2020, https://arxiv.org/abs/1904.09751); everything else gets
    -inf. (B, V) -> (B, V).

    ``top_k`` 0 or None keeps every token (as in HF transformers); ``top_p`` must be in (0, 1], and
    1 or None keeps every token. ``temperature`` must be > 0 here: ``generate`` reads 0 as greedy."""
    check_sampling(temperature=temperature, top_k=top_k, top_p=top_p)
    if temperature == 0:
        raise ConfigError(
            "temperature=0 cannot scale logits; generate() decodes greedily at 0, filter_logits needs temperature > 0"
        )
    logits = logits.float() / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= top_p  # tokens after the nucleus is full
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def check_sampling(
    *,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
) -> None:
    """Raise a ConfigError naming the first sampling or repeat setting (zoo.logits) that cannot work."""
    _check_filters(temperature, top_k, top_p)
    _check_repeats(repetition_penalty, no_repeat_ngram_size)


def _check_filters(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """A ConfigError naming the first of ``filter_logits``' settings that cannot work."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not temperature >= 0:
        raise ConfigError(f"temperature={temperature!r} must be a number >= 0 (0 decodes greedily)")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 0):
        raise ConfigError(f"top_k={top_k!r} must be a whole number >= 0 (0 or null: no top-k filter)")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1):
        raise ConfigError(f"top_p={top_p!r} must be in (0, 1] (1 or null: no nucleus filter)")


def _check_repeats(penalty: float, size: int) -> None:
    """A ConfigError naming the first repeat control (zoo.logits) that cannot work."""
    if isinstance(penalty, bool) or not isinstance(penalty, numbers.Real) or not 0 < penalty < math.inf:
        raise ConfigError(
            f"repetition_penalty={penalty!r} must be a finite number > 0 (1: off; > 1 discourages repeats)"
        )
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 0:
        raise ConfigError(f"no_repeat_ngram_size={size!r} must be a whole number >= 0 (0: off)")


def checked_repeats(repetition_penalty: float, no_repeat_ngram_size: int) -> RepeatControls:
    """``generate``'s repeat controls; a ConfigError naming a setting that cannot work."""
    _check_repeats(repetition_penalty, no_repeat_ngram_size)
    return RepeatControls(float(repetition_penalty), int(no_repeat_ngram_size))


@dataclass(frozen=True)
class TokenChoice:
    """How the next token is picked from the (repeat-controlled) logits: the most likely one, or with
    ``do_sample`` one drawn by ``generator`` from ``filter_logits``' distribution."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    generator: torch.Generator | None = None

    def __call__(self, logits: Tensor) -> Tensor:
        """The token of each row: (B, V) -> (B,)."""
        if not self.do_sample:
            return logits.argmax(dim=-1)
        probs = filter_logits(logits, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p).softmax(-1)
        return torch.multinomial(probs, 1, generator=self.generator)[:, 0]

    @classmethod
    def checked(
        cls,
        do_sample: bool,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
        generator: torch.Generator | None,
    ) -> TokenChoice:
        """The choice ``generate``'s settings ask for, after a ConfigError naming one that cannot work;
        ``temperature`` 0 picks greedily even with ``do_sample``."""
        _check_filters(temperature, top_k, top_p)
        return cls(do_sample and temperature > 0, temperature, top_k, top_p, generator)


EOS_CHECK_EVERY = 16  # steps between asking an accelerator whether every row has ended


def eos_check_interval(device: torch.device) -> int:
    """Steps between two checks that every row has ended: each check waits for the device, so an
    accelerator, which runs ahead of the loop, is asked every ``EOS_CHECK_EVERY`` steps; a CPU, which
    has finished each step by the time the loop reads it, at every step."""
    return 1 if device.type == "cpu" else EOS_CHECK_EVERY


def sample(
    steps: Steps, max_new: int, eos: int | None, pad: int, repeats: RepeatControls, choose: TokenChoice
) -> Tensor:
    """Up to ``max_new`` tokens, one per step, each picked by ``choose`` from the logits that ``repeats``
    leave; a row that has produced ``eos`` is padded with ``pad`` until every row has. Returns the
    output (``steps.output()``), cut after the step where the last row ended.

    No step waits for the device but those that check whether every row has ended
    (``eos_check_interval``); the steps run past that point are cut off, so the tokens are those of a
    check at every step."""
    if max_new == 0:
        return steps.output()
    start = steps.length
    logits = steps.first()  # (B, V)
    done = None if eos is None else torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    every = eos_check_interval(logits.device)
    for step in range(1, max_new + 1):
        token = choose(repeats(logits, *steps.history()))  # (B,)
        if done is not None:
            token = token.masked_fill(done, pad)
            done |= token == eos
        if step == max_new or (done is not None and step % every == 0 and bool(done.all())):
            steps.record(token)
            break
        logits = steps.next(token)
    out = steps.output()
    return out if eos is None else out[:, : start + _ended(out[:, start:], eos)]


def _ended(generated: Tensor, eos: int) -> int:
    """How many of the tokens ``generated`` (B, n) it takes for every row to hold ``eos``; n when some
    row never does."""
    hit = generated == eos  # (B, n)
    if not bool(hit.any(dim=-1).all()):
        return generated.shape[1]
    return int(hit.int().argmax(dim=-1).max()) + 1  # argmax: each row's first eos
