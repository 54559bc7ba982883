"""Autoregressive generation: greedy, sampling (temperature, top-k, top-p) and beam search, with or
without the KV cache (both give the same tokens; the cache makes each step O(t) instead of O(t^2)).
In every mode a repetition penalty and a no-repeat n-gram ban (zoo.logits) can read each sequence so far.

Prompts of different lengths are left-padded (decoder) or right-padded (encoder source); position
ids are counted over real tokens only, so a padded prompt decodes exactly as it would alone.

Limits, checked before anything is allocated: a setting that cannot work is a ConfigError naming it;
a prompt without tokens, or longer than the model's positions, is a PromptError; a length whose keys
and values cannot fit in the device's memory is refused, saying how many new tokens would fit. A
model whose positions end (a learned table) stops there with a GenerationLimitWarning and returns
what it generated.
"""

from __future__ import annotations

import math
import numbers
import os
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.kv_cache import value_bytes
from zoo.logits import RepeatControls
from zoo.measuring import count_generated
from zoo.position import position_limit
from zoo.registry import ARCH, ConfigError

if TYPE_CHECKING:
    from zoo.decoding import Steps

Prompts = Tensor | Sequence[Sequence[int]] | Sequence[Tensor]


class PromptError(ValueError):
    """Prompts the model cannot read: none, one without tokens, or one longer than its positions."""


class GenerationLimitWarning(UserWarning):
    """``generate`` stopped before ``max_new_tokens``: the model's positions end there."""


def pad_sequences(
    seqs: Prompts, pad_id: int, *, left: bool, device: torch.device | None = None
) -> tuple[Tensor, Tensor]:
    """Lists of token ids -> (ids, mask), both (B, T_max); mask is 1 on tokens, 0 on padding."""
    if isinstance(seqs, Tensor):
        return seqs, torch.ones_like(seqs)
    rows = [torch.as_tensor(s, dtype=torch.long) for s in seqs]
    if not rows:
        raise PromptError("input_ids holds no prompts; pass at least one sequence of token ids")
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        span = slice(T - len(r), T) if left else slice(0, len(r))
        ids[i, span], mask[i, span] = r, 1
    return ids.to(device), mask.to(device)


def filter_logits(
    logits: Tensor, *, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """Temperature, then keep the k most likely tokens, then the smallest set whose probability
    reaches top_p (Holtzman et al. 2020); everything else gets -inf. (B, V) -> (B, V).

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
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not temperature >= 0:
        raise ConfigError(f"temperature={temperature!r} must be a number >= 0 (0 decodes greedily)")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 0):
        raise ConfigError(f"top_k={top_k!r} must be a whole number >= 0 (0 or null: no top-k filter)")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1):
        raise ConfigError(f"top_p={top_p!r} must be in (0, 1] (1 or null: no nucleus filter)")
    penalty, size = repetition_penalty, no_repeat_ngram_size
    if isinstance(penalty, bool) or not isinstance(penalty, numbers.Real) or not 0 < penalty < math.inf:
        raise ConfigError(
            f"repetition_penalty={penalty!r} must be a finite number > 0 (1: off; > 1 discourages repeats)"
        )
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 0:
        raise ConfigError(f"no_repeat_ngram_size={size!r} must be a whole number >= 0 (0: off)")


def _check_beams(num_beams: int, vocab_size: int, new: int) -> None:
    """A ConfigError for more beams than there are distinct continuations of ``new`` tokens: the
    beams beyond them repeat others, and a huge count only runs long."""
    if num_beams > 1 and new > 0 and new * math.log(vocab_size) < math.log(num_beams):
        most = vocab_size**new
        raise ConfigError(
            f"num_beams={num_beams} is more than the {most} distinct continuations of {new} new tokens "
            f"over the model's {vocab_size}-token vocabulary: the other beams cannot be distinct; use at "
            f"most {most} (4 to 8 is usual)"
        )


def _check_counts(max_new_tokens: int, num_beams: int) -> None:
    for name, value, least in (("max_new_tokens", max_new_tokens, 0), ("num_beams", num_beams, 1)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            raise ConfigError(f"{name}={value!r} must be a whole number >= {least}")


class GenerationMixin:
    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model's position encodings can number (a learned table ends at
        its ``max_len``); None when they are unbounded."""
        return position_limit(self.config)

    def generate(
        self,
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
        """Continue ``input_ids`` by up to ``max_new_tokens`` tokens.

        Args:
            input_ids: (B, T) tensor, or a list of token-id sequences of different lengths; every
                prompt needs at least one token (else a PromptError).
            attention_mask: (B, T), 1 = token, 0 = padding (left padding for decoders).
            do_sample: sample from the filtered distribution; False (or ``temperature=0``) is greedy.
            temperature: > 0 scales the logits before sampling; 0 means greedy, as in other tools.
            top_k: sample among the k most likely tokens; 0 or None: no top-k filter (as in HF).
            top_p: nucleus sampling, in (0, 1]; 1 or None: no nucleus filter.
            eos_token_id: stop a sequence at this token; -1 (default) means ``config.eos_token_id``,
                None never stops early. Finished sequences are padded with ``pad_token_id``.
            num_beams: >= 1, at most the distinct continuations (vocabulary size ** new tokens); > 1
                runs beam search (scores divided by length**length_penalty).
            repetition_penalty: > 0, 1 is off: every token already in the sequence has a positive logit
                divided by it and a negative one multiplied (CTRL; > 1 discourages repeats). The sequence
                is a decoder's prompt and continuation, an encoder-decoder's target after its start
                token, never padding; beam search applies it to each beam's log-probabilities, as HF does.
            no_repeat_ngram_size: n > 0 lets no n-gram occur twice in that sequence; 0 is off.
            compile: decode with a static KV cache (every position allocated up front) and a
                ``torch.compile``d single-token step, which keeps its shapes from step to step, so it
                compiles once per model, batch and length bucket (zoo.decoding). The tokens are those of
                ``compile=False``; the first call pays the compile time. Needs ``use_cache``.

        Returns:
            decoder: (B, T + n) prompt and continuation; encoder_decoder: (B, 1 + n) starting with
            ``decoder_start_token_id``. The output never holds more tokens than the model's
            positions can number (``max_positions``): generation stops there, n < max_new_tokens,
            with a GenerationLimitWarning. A prompt longer than that is a PromptError, and a length
            whose keys and values cannot fit in the device's free memory a ConfigError.
        """
        cfg = self.config
        steps_cls = self._steps_class()
        _check_counts(max_new_tokens, num_beams)
        if compile and not use_cache:
            raise ConfigError("compile=True decodes with a static KV cache; set use_cache=True (or compile=False)")
        check_sampling(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            repetition_penalty=repetition_penalty,
            no_repeat_ngram_size=no_repeat_ngram_size,
        )
        repeats = RepeatControls(float(repetition_penalty), int(no_repeat_ngram_size))
        do_sample = do_sample and temperature > 0
        eos = cfg.eos_token_id if eos_token_id == -1 else eos_token_id
        pad = cfg.pad_token_id if pad_token_id is None else pad_token_id
        device = self.embed.weight.device
        ids, mask = _prompts(input_ids, attention_mask, pad, steps_cls.left_pad, device)
        start = steps_cls.held(ids.shape[1])  # tokens the output holds before the new ones
        new = self._room(ids.shape[1], start, max_new_tokens, steps_cls.prompt)
        _check_beams(num_beams, cfg.vocab_size, new)
        self._check_memory(ids.shape[0] * num_beams, start, new, max_new_tokens, device)
        caching = "static" if compile else "dynamic" if use_cache else None
        started = time.perf_counter()
        with torch.inference_mode():  # no autograd bookkeeping at all (no_grad still counts versions and views)
            out = self._decode(
                steps_cls,
                ids,
                mask,
                new,
                num_beams=num_beams,
                caching=caching,
                eos=eos,
                pad=pad,
                length_penalty=length_penalty,
                repeats=repeats,
                do_sample=do_sample,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                generator=generator,
            )
        out = out.clone()  # an ordinary tensor: the ids may feed a later forward that autograd records
        count_generated((out.shape[1] - start) * out.shape[0], time.perf_counter() - started)
        if new < max_new_tokens and _stopped_by_length(out[:, start:], new, eos):
            warnings.warn(
                f"generation stopped after {new} of max_new_tokens={max_new_tokens} new tokens: the model "
                f"numbers at most {self.max_positions} positions (max_seq_len) and {steps_cls.holds} took "
                f"{start}",
                GenerationLimitWarning,
                stacklevel=3,
            )
        return out

    def _decode(
        self,
        steps_cls: type[Steps],
        ids: Tensor,
        mask: Tensor,
        new: int,
        *,
        num_beams: int,
        caching: str | None,
        eos: int | None,
        pad: int,
        length_penalty: float,
        repeats: RepeatControls,
        **sampling: Any,
    ) -> Tensor:
        """Up to ``new`` tokens after ``ids`` (B, T), in eval mode: beam search for ``num_beams`` > 1,
        else greedy or sampled (``sampling``: the keywords of ``_sample``). ``caching``: None (recompute
        every step), "dynamic" or "static" (zoo.decoding)."""
        was_training = self.training
        self.eval()
        try:
            if num_beams == 1:
                return _sample(steps_cls(self, ids, mask, caching, new), new, eos, pad, repeats, **sampling)
            index = torch.arange(ids.shape[0], device=ids.device).repeat_interleave(num_beams)
            steps = steps_cls(self, ids[index], mask[index], caching, new)
            return _beam_search(steps, ids.shape[0], num_beams, new, eos, pad, length_penalty, repeats)
        finally:
            self.train(was_training)

    def _steps_class(self) -> type[Steps]:
        """How this form decodes (its ``decoding``, zoo.decoding); a TypeError for a form that cannot."""
        steps_cls = type(self).decoding
        if steps_cls is None:
            able = " or ".join(repr(name) for name in ARCH.names() if ARCH.get(name).decoding is not None)
            raise TypeError(f"an {self.config.arch} does not generate; use arch={able}")
        return steps_cls

    def _room(self, width: int, start: int, max_new: int, what: str) -> int:
        """How many of ``max_new`` tokens the positions leave room for; a PromptError when even the
        input (``what``: the decoder's prompt, the encoder-decoder's source) is longer than they can number."""
        limit = self.max_positions
        if limit is None:
            return max_new
        if width > limit:
            raise PromptError(
                f"the {what} is {width} tokens long but the model's positions end at {limit} "
                f"(max_seq_len={limit}); shorten it"
            )
        return min(max_new, limit - start)

    def _check_memory(self, rows: int, start: int, new: int, max_new: int, device: torch.device) -> None:
        """Refuse, before allocating, a length whose keys and values (the KV cache: 2 x layers x
        kv_heads x head_dim per position and sequence) and token ids cannot fit in free memory."""
        free = _free_bytes(device)
        if free is None:
            return
        cfg = self.config
        layers = len(self.stacks()[-1].blocks)
        per_value = value_bytes(self.kv_dtype, cfg.resolved_head_dim, self.embed.weight.element_size())
        per_position = rows * (2 * layers * cfg.resolved_n_kv_heads * per_value + 8)
        if (start + new) * per_position <= free:
            return
        fits = max(0, free // per_position - start)
        raise ConfigError(
            f"max_new_tokens={max_new} cannot fit: {rows} sequence(s) of {start + new} positions "
            f"need {(start + new) * per_position / 2**30:.3g} GiB for keys, values and ids, and "
            f"{device.type} has {free / 2**30:.3g} GiB free; at most {fits} new tokens fit "
            f"(fewer prompts or beams leave room for more)"
        )


def _prompts(
    input_ids: Prompts, attention_mask: Tensor | None, pad: int, left: bool, device: torch.device
) -> tuple[Tensor, Tensor]:
    """The prompts as (ids, mask), both (B, T), padded on the ``left`` or the right; a PromptError
    for none or one without tokens."""
    ids, mask = pad_sequences(input_ids, pad, left=left, device=device)
    if attention_mask is not None:
        mask = attention_mask.to(device)
    _check_prompts(mask)
    return ids, mask


def _check_prompts(mask: Tensor) -> None:
    """Every prompt has at least one token. mask: (B, T), 1 = token."""
    if mask.shape[0] == 0:
        raise PromptError("input_ids holds no prompts; pass at least one sequence of token ids")
    empty = (mask.sum(-1) == 0).nonzero()[:, 0].tolist()
    if empty:
        raise PromptError(
            f"prompt {empty[0]} of input_ids has no tokens ({len(empty)} empty in all); give "
            f"every prompt at least one token"
        )


def _stopped_by_length(generated: Tensor, new: int, eos: int | None) -> bool:
    """Whether generation ran all ``new`` steps with some sequence not yet ended by ``eos``."""
    if generated.shape[1] < new:
        return False
    return eos is None or not bool((generated == eos).any(dim=-1).all())


def _free_bytes(device: torch.device) -> int | None:
    """Memory the device can still give, in bytes; None where zoo cannot tell."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type == "cpu":
        return _available_ram()
    return None


def _available_ram() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), else the physical memory, else None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _sample(
    steps: Steps,
    max_new: int,
    eos: int | None,
    pad: int,
    repeats: RepeatControls,
    *,
    do_sample: bool,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    generator: torch.Generator | None,
) -> Tensor:
    """Greedy or sampled decoding; ``repeats`` act on the raw logits, before temperature, top-k, top-p."""
    if max_new == 0:
        return steps.output()
    logits = steps.first()  # (B, V)
    done = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    for step in range(max_new):
        logits = repeats(logits, *steps.history())
        if do_sample:
            probs = filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p).softmax(-1)
            token = torch.multinomial(probs, 1, generator=generator)[:, 0]
        else:
            token = logits.argmax(dim=-1)
        token = token.masked_fill(done, pad)
        if eos is not None:
            done |= token == eos
        if step == max_new - 1 or (eos is not None and bool(done.all())):
            steps.ids = torch.cat([steps.ids, token[:, None]], dim=1)
            break
        logits = steps.next(token)
    return steps.output()


def _beam_search(
    steps: Steps,
    batch: int,
    K: int,
    max_new: int,
    eos: int | None,
    pad: int,
    length_penalty: float,
    repeats: RepeatControls,
) -> Tensor:
    """Keep the K best prefixes per source by total log-probability; a prefix ending in eos becomes
    a finished hypothesis scored by logprob / length**length_penalty. A source is done when it has K
    hypotheses and no live beam can beat the worst of them at its current length. ``repeats`` act on
    each beam's log-probabilities (as in HF transformers), so its scores add what they leave."""
    if max_new == 0:
        return steps.output()[::K]
    device = steps.ids.device
    logits = steps.first()  # (B*K, V)
    V = logits.shape[-1]
    scores = torch.full((batch, K), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    finished: list[list[tuple[float, Tensor]]] = [[] for _ in range(batch)]
    done = [False] * batch
    prompt_len = steps.ids.shape[1]
    for step in range(max_new):
        logp = repeats(F.log_softmax(logits.float(), dim=-1), *steps.history()).view(batch, K, V)
        cand = (scores[:, :, None] + logp).view(batch, K * V)
        top_scores, top_index = cand.topk(2 * K, dim=-1)  # (B, 2K)
        beam_src = torch.zeros(batch, K, dtype=torch.long, device=device)
        beam_tok = torch.full((batch, K), pad, dtype=torch.long, device=device)
        new_scores = torch.full((batch, K), float("-inf"), device=device)
        length = step + 1
        for b in range(batch):
            if done[b]:
                continue
            kept = 0
            for score, index in zip(top_scores[b].tolist(), top_index[b].tolist(), strict=True):
                src, tok = divmod(index, V)
                if eos is not None and tok == eos:
                    prefix = steps.ids[b * K + src, prompt_len:]
                    hyp = torch.cat([prefix, prefix.new_tensor([tok])])
                    _add_hypothesis(finished[b], K, score / length**length_penalty, hyp)
                    continue
                beam_src[b, kept], beam_tok[b, kept], new_scores[b, kept] = src, tok, score
                kept += 1
                if kept == K:
                    break
            best_live = new_scores[b].max().item()
            if len(finished[b]) == K and best_live / length**length_penalty <= finished[b][-1][0]:
                done[b] = True
        if all(done):
            break
        order = (torch.arange(batch, device=device)[:, None] * K + beam_src).view(-1)
        steps.reorder(order)
        scores = new_scores
        if step == max_new - 1:
            steps.ids = torch.cat([steps.ids, beam_tok.view(-1, 1)], dim=1)
            break
        logits = steps.next(beam_tok.view(-1))
    for b in range(batch):  # sources that ran out of length: their live beams compete too
        if not done[b]:
            for k in range(K):
                if scores[b, k] > float("-inf"):
                    hyp = steps.ids[b * K + k, prompt_len:]
                    _add_hypothesis(finished[b], K, scores[b, k].item() / len(hyp) ** length_penalty, hyp)
    return _join_best(steps.output()[::K, :prompt_len], finished, pad)


def _join_best(prompts: Tensor, finished: list[list[tuple[float, Tensor]]], pad: int) -> Tensor:
    """Each prompt (B, T) followed by its best hypothesis, right-padded with ``pad``: (B, T + longest)."""
    best = [hyps[0][1] for hyps in finished]
    B, T = prompts.shape
    out = torch.full((B, T + max(len(h) for h in best)), pad, dtype=torch.long, device=prompts.device)
    out[:, :T] = prompts
    for b, hyp in enumerate(best):
        out[b, T : T + len(hyp)] = hyp
    return out


def _add_hypothesis(hyps: list[tuple[float, Tensor]], K: int, score: float, tokens: Tensor) -> None:
    """Insert into a best-first list holding at most K hypotheses."""
    hyps.append((score, tokens))
    hyps.sort(key=lambda h: h[0], reverse=True)
    del hyps[K:]
