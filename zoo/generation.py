"""Autoregressive generation: greedy, sampling (temperature, top-k, top-p) and beam search, with or
without the KV cache (both give the same tokens; the cache makes each step O(t) instead of O(t^2)).
In every mode a repetition penalty and a no-repeat n-gram ban (zoo.logits) can read each sequence so far:
a decoder's prompt and continuation, an encoder-decoder's target after its start token, never padding;
beam search applies them to each beam's log-probabilities, as HF transformers does.

Prompts of different lengths are left-padded (decoder) or right-padded (encoder source); position
ids are counted over real tokens only, so a padded prompt decodes exactly as it would alone.

Limits, checked before anything is allocated: a setting that cannot work is a ConfigError naming it;
a prompt without tokens, or longer than the model's positions, is a PromptError; a length whose keys
and values cannot fit in the device's memory is refused, saying how many new tokens would fit. A
model whose positions end (a learned table) stops there with a GenerationLimitWarning and returns
what it generated.

``generate`` reads the prompts with zoo.prompts, gets each step's logits from the form's steps
(zoo.decoding) and picks the tokens with zoo.sampling or zoo.beam_search.
"""

from __future__ import annotations

import numbers
import time
import warnings
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from zoo.beam_search import beam_search, check_beams
from zoo.decoding import Steps, steps_of
from zoo.kv_cache import value_bytes
from zoo.logits import RepeatControls
from zoo.measuring import count_generated, free_bytes
from zoo.prompts import PromptError, Prompts, pad_sequences, padded_prompts
from zoo.registry import ARCH, ConfigError
from zoo.sampling import TokenChoice, check_sampling, checked_repeats, filter_logits, sample

if TYPE_CHECKING:
    from zoo.zoo_model import ZooModel

__all__ = [
    "GenerationLimitWarning",
    "generate",
    "PromptError",
    "Prompts",
    "check_sampling",
    "filter_logits",
    "pad_sequences",
]


class GenerationLimitWarning(UserWarning):
    """``generate`` stopped before ``max_new_tokens``: the model's positions end there."""


def _check_settings(max_new_tokens: int, num_beams: int, *, compile: bool, use_cache: bool) -> None:
    """A ConfigError for a count that is not a whole number at least its least (``max_new_tokens`` 0,
    ``num_beams`` 1), or for ``compile`` without ``use_cache``."""
    for name, value, least in (("max_new_tokens", max_new_tokens, 0), ("num_beams", num_beams, 1)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            raise ConfigError(f"{name}={value!r} must be a whole number >= {least}")
    if compile and not use_cache:
        raise ConfigError("compile=True decodes with a static KV cache; set use_cache=True (or compile=False)")


def generate(
    model: ZooModel,
    input_ids: Prompts,
    max_new_tokens: int = 20,
    *,
    attention_mask: Tensor | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
    eos_token_id: int | None = -1,
    pad_token_id: int | None = None,
    use_cache: bool = True,
    compile: bool = False,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Continue ``input_ids`` by up to ``max_new_tokens`` tokens (the module docstring has the limits).

    Args:
        input_ids: (B, T) tensor or a list of token-id sequences of different lengths, each of at least one token.
        attention_mask: (B, T), 1 = token, 0 = padding (left padding for decoders).
        do_sample: sample from the filtered distribution; False (or ``temperature=0``) is greedy.
        temperature: > 0 scales the logits before sampling; 0 means greedy, as in other tools.
        top_k: sample among the k most likely tokens; 0 or None: no top-k filter (as in HF).
        top_p: nucleus sampling, in (0, 1]; 1 or None: no nucleus filter.
        eos_token_id: stop a sequence at this token; -1 (default) means ``config.eos_token_id``, None never stops
            early. Finished sequences are padded with ``pad_token_id``.
        num_beams: >= 1, at most the distinct continuations (vocabulary size ** new tokens); > 1 runs beam search
            (scores divided by length**length_penalty).
        repetition_penalty: > 0, 1 is off: every token already in the sequence (the module docstring says which)
            has a positive logit divided by it and a negative one multiplied (CTRL; > 1 discourages repeats).
        no_repeat_ngram_size: n > 0 lets no n-gram occur twice in that sequence; 0 is off.
        compile: decode with a static KV cache and a ``torch.compile``d single-token step, compiled once per model,
            batch and length bucket (an encoder-decoder's: and source bucket) and kept for later calls of the same
            shape (zoo.decoding), giving the tokens of ``compile=False``; on CUDA the step is captured once as a
            CUDA graph and replayed at every token (``zoo.decoding.StaticStep``). Needs ``use_cache``.

    Returns:
        decoder: (B, T + n) prompt and continuation; encoder_decoder: (B, 1 + n) starting with
        ``decoder_start_token_id``. n < max_new_tokens where eos ends every sequence, or where the model's
        positions end (``max_positions``), then with a GenerationLimitWarning.
    """
    steps_cls = _steps_class(
        model,
    )
    _check_settings(max_new_tokens, num_beams, compile=compile, use_cache=use_cache)
    choose = TokenChoice.checked(do_sample, temperature, top_k, top_p, generator)
    repeats = checked_repeats(repetition_penalty, no_repeat_ngram_size)
    eos = model.config.eos_token_id if eos_token_id == -1 else eos_token_id
    pad = model.config.pad_token_id if pad_token_id is None else pad_token_id
    ids, mask = padded_prompts(input_ids, attention_mask, pad, steps_cls.left_pad, model.embed.weight.device)
    start, new = _lengths(model, steps_cls, ids, max_new_tokens, num_beams)
    caching = "static" if compile else "dynamic" if use_cache else None
    started = time.perf_counter()
    out = _decode(model, steps_cls, ids, mask, new, caching, eos, pad, repeats, choose, num_beams, length_penalty)
    count_generated((out.shape[1] - start) * out.shape[0], time.perf_counter() - started)
    if new < max_new_tokens and _stopped_by_length(out[:, start:], new, eos):
        _warn_cut_short(model, new, max_new_tokens, steps_cls, start)
    return out


def _decode(
    model: ZooModel,
    steps_cls: type[Steps],
    ids: Tensor,
    mask: Tensor,
    new: int,
    caching: str | None,
    eos: int | None,
    pad: int,
    repeats: RepeatControls,
    choose: TokenChoice,
    num_beams: int,
    length_penalty: float,
) -> Tensor:
    """Up to ``new`` tokens after ``ids`` (B, T), in eval mode: beam search for ``num_beams`` > 1
    (zoo.beam_search), else each token picked by ``choose`` (zoo.sampling). ``caching``: None
    (recompute every step), "dynamic" or "static" (zoo.decoding)."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():  # no autograd bookkeeping at all (no_grad still counts versions and views)
            if num_beams == 1:
                out = sample(steps_cls(model, ids, mask, caching, new), new, eos, pad, repeats, choose)
            else:
                index = torch.arange(ids.shape[0], device=ids.device).repeat_interleave(num_beams)
                steps = steps_cls(model, ids[index], mask[index], caching, new)
                out = beam_search(steps, ids.shape[0], num_beams, new, eos, pad, length_penalty, repeats)
    finally:
        model.train(was_training)
    return out.clone()  # an ordinary tensor: the ids may feed a later forward that autograd records


def _steps_class(model: ZooModel) -> type[Steps]:
    """How this form decodes (its ``decoding``, zoo.decoding); a TypeError for a form that cannot."""
    steps_cls = steps_of(type(model))
    if steps_cls is None:
        able = " or ".join(repr(name) for name in ARCH.names() if ARCH.get(name).decoding is not None)
        raise TypeError(f"an {model.config.arch} does not generate; use arch={able}")
    return steps_cls


def _lengths(model: ZooModel, steps_cls: type[Steps], ids: Tensor, max_new: int, num_beams: int) -> tuple[int, int]:
    """How many tokens the output holds before the new ones, and how many of ``max_new`` new ones the
    positions leave room for. Refuses, before anything is allocated, an input the positions cannot
    number (a PromptError), more beams than distinct continuations or a length that cannot fit in
    memory (a ConfigError)."""
    start = steps_cls.held(ids.shape[1])
    new = _room(model, ids.shape[1], start, max_new, steps_cls.prompt)
    check_beams(num_beams, model.config.vocab_size, new)
    _check_memory(model, ids.shape[0] * num_beams, start, new, max_new, model.embed.weight.device)
    return start, new


def _room(model: ZooModel, width: int, start: int, max_new: int, what: str) -> int:
    """How many of ``max_new`` tokens the positions leave room for; a PromptError when even the
    input (``what``: the decoder's prompt, the encoder-decoder's source) is longer than they can number."""
    limit = model.max_positions
    if limit is None:
        return max_new
    if width > limit:
        raise PromptError(
            f"the {what} is {width} tokens long but the model's positions end at {limit} "
            f"(max_seq_len={limit}); shorten it"
        )
    return min(max_new, limit - start)


def _check_memory(model: ZooModel, rows: int, start: int, new: int, max_new: int, device: torch.device) -> None:
    """Refuse, before allocating, a length whose keys and values (the KV cache: 2 x layers x
    kv_heads x head_dim per position and sequence), token ids and one step's float32 logits and
    log-probabilities (2 x vocab_size per sequence) cannot fit in free memory."""
    free = free_bytes(device)
    if free is None:
        return
    cfg = model.config
    layers = len(model.stacks()[-1].blocks)
    per_value = value_bytes(model.kv_dtype, cfg.resolved_head_dim, model.embed.weight.element_size())
    per_position = rows * (2 * layers * cfg.resolved_n_kv_heads * per_value + 8)
    per_step = rows * cfg.vocab_size * 2 * 4
    if (start + new) * per_position + per_step <= free:
        return
    fits = max(0, (free - per_step) // per_position - start)
    raise ConfigError(
        f"max_new_tokens={max_new} cannot fit: {rows} sequence(s) of {start + new} positions "
        f"need {((start + new) * per_position + per_step) / 2**30:.3g} GiB for keys, values, ids and logits, and "
        f"{device.type} has {free / 2**30:.3g} GiB free; at most {fits} new tokens fit "
        f"(fewer prompts or beams leave room for more)"
    )


def _warn_cut_short(model: ZooModel, new: int, max_new: int, steps_cls: type[Steps], start: int) -> None:
    """A GenerationLimitWarning, attributed to the code that called ``generate``'s caller."""
    warnings.warn(
        f"generation stopped after {new} of max_new_tokens={max_new} new tokens: the model "
        f"numbers at most {model.max_positions} positions (max_seq_len) and {steps_cls.holds} took "
        f"{start}",
        GenerationLimitWarning,
        stacklevel=5,
    )


def _stopped_by_length(generated: Tensor, new: int, eos: int | None) -> bool:
    """Whether generation ran all ``new`` steps with some sequence not yet ended by ``eos``."""
    if generated.shape[1] < new:
        return False
    return eos is None or not bool((generated == eos).any(dim=-1).all())
