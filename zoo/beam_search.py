"""Beam search for ``generate`` (zoo.generation): keep the K best prefixes of each source by total
log-probability; a prefix that ends in eos becomes a finished hypothesis scored by
logprob / length**length_penalty (length: its new tokens). A source is done when it has K hypotheses
and no live beam can beat the worst of them at its current length.

Shapes: B sources, K beams per source (rows b * K + k of the decoding state), V vocabulary.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.logits import RepeatControls
from zoo.registry import ConfigError

if TYPE_CHECKING:
    from zoo.decoding import Steps

Hypotheses = list[tuple[float, Tensor]]  # (score, new tokens), best first


MAX_BEAMS = 1024
"""The most beams zoo searches with: each is one more sequence decoded at every step, and beams past a
few dozen rarely help (wider beams translate worse, Koehn and Knowles 2017, https://arxiv.org/abs/1706.03872)."""


def check_beams(num_beams: int, vocab_size: int, new: int) -> None:
    """A ConfigError for more beams than ``MAX_BEAMS``, or than there are distinct continuations of
    ``new`` tokens: the beams beyond them repeat others, and a huge count only runs long."""
    if num_beams > MAX_BEAMS:
        raise ConfigError(
            f"num_beams={num_beams} is more than the {MAX_BEAMS} beams zoo searches with (each is one more "
            f"sequence decoded at every step); use at most {MAX_BEAMS} (4 to 8 is usual)"
        )
    if num_beams > 1 and new > 0 and new * math.log(vocab_size) < math.log(num_beams):
        most = vocab_size**new
        raise ConfigError(
            f"num_beams={num_beams} is more than the {most} distinct continuations of {new} new tokens "
            f"over the model's {vocab_size}-token vocabulary: the other beams cannot be distinct; use at "
            f"most {most} (4 to 8 is usual)"
        )


def beam_search(
    steps: Steps,
    batch: int,
    K: int,
    max_new: int,
    eos: int | None,
    pad: int,
    length_penalty: float,
    repeats: RepeatControls,
) -> Tensor:
    """Up to ``max_new`` tokens after each of ``batch`` sources, whose K beams are the rows of
    ``steps``: each prompt followed by its best hypothesis, right-padded with ``pad``. ``repeats`` act
    on each beam's log-probabilities (as in HF transformers), so its scores add what they leave."""
    if max_new == 0:
        return steps.output()[::K]
    beams = _Beams(batch, K, steps.ids.shape[1], eos, length_penalty, device=steps.ids.device)
    logits = steps.first()  # (B*K, V)
    for step in range(max_new):
        logp = repeats(F.log_softmax(logits.float(), dim=-1), *steps.history())  # (B*K, V)
        order, tokens = beams.advance(logp, steps.ids, step + 1, pad)  # (B*K,) each
        if all(beams.done):
            break
        steps.reorder(order)
        if step == max_new - 1:
            steps.record(tokens)
            break
        logits = steps.next(tokens)
    beams.close(steps.ids)
    return _join_best(steps.output()[::K, : beams.prompt_len], beams.finished, pad)


class _Beams:
    """The search's state: the live beams' total log-probabilities ``scores`` (B, K), each source's
    finished hypotheses (at most K, best first) and whether it is ``done``."""

    def __init__(
        self, batch: int, K: int, prompt_len: int, eos: int | None, length_penalty: float, *, device: torch.device
    ) -> None:
        self.K, self.prompt_len, self.eos, self.length_penalty = K, prompt_len, eos, length_penalty
        self.scores = torch.full((batch, K), float("-inf"), device=device)
        self.scores[:, 0] = 0.0  # all beams start identical: expand only the first
        self.finished: list[Hypotheses] = [[] for _ in range(batch)]
        self.done = [False] * batch

    def advance(self, logp: Tensor, ids: Tensor, length: int, pad: int) -> tuple[Tensor, Tensor]:
        """Extend every beam by one token, given its log-probabilities ``logp`` (B*K, V) and the
        output so far ``ids`` (B*K, T), ``length`` new tokens long after this step. Returns the rows
        the new beams continue (B*K,) and their tokens (B*K,); a done source keeps ``pad``."""
        batch, K = self.scores.shape
        V = logp.shape[-1]
        cand = (self.scores[:, :, None] + logp.view(batch, K, V)).view(batch, K * V)
        top_scores, top_index = cand.topk(2 * K, dim=-1)  # (B, 2K)
        beam_src = torch.zeros(batch, K, dtype=torch.long, device=cand.device)
        beam_tok = torch.full((batch, K), pad, dtype=torch.long, device=cand.device)
        new_scores = torch.full((batch, K), float("-inf"), device=cand.device)
        for b in range(batch):
            if self.done[b]:
                continue
            kept = self._keep(b, top_scores[b].tolist(), top_index[b].tolist(), V, ids, length)
            for k, (src, tok, score) in enumerate(kept):
                beam_src[b, k], beam_tok[b, k], new_scores[b, k] = src, tok, score
            finished = self.finished[b]
            best_live = new_scores[b].max().item()
            if len(finished) == K and best_live / length**self.length_penalty <= finished[-1][0]:
                self.done[b] = True
        self.scores = new_scores
        order = (torch.arange(batch, device=cand.device)[:, None] * K + beam_src).view(-1)
        return order, beam_tok.view(-1)

    def _keep(
        self, b: int, scores: list[float], index: list[int], V: int, ids: Tensor, length: int
    ) -> list[tuple[int, int, float]]:
        """Source ``b``'s candidates, best first (``index`` = beam * V + token), up to the K best
        (beam, token, score) that go on; those that end in eos become hypotheses instead."""
        kept: list[tuple[int, int, float]] = []
        for score, i in zip(scores, index, strict=True):
            src, tok = divmod(i, V)
            if self.eos is not None and tok == self.eos:
                prefix = ids[b * self.K + src, self.prompt_len :]
                hyp = torch.cat([prefix, prefix.new_tensor([tok])])
                _add_hypothesis(self.finished[b], self.K, score / length**self.length_penalty, hyp)
                continue
            kept.append((src, tok, score))
            if len(kept) == self.K:
                break
        return kept

    def close(self, ids: Tensor) -> None:
        """The sources that ran out of length: their live beams (rows of ``ids``) compete too."""
        for b, done in enumerate(self.done):
            if done:
                continue
            for k in range(self.K):
                if self.scores[b, k] > float("-inf"):
                    hyp = ids[b * self.K + k, self.prompt_len :]
                    score = self.scores[b, k].item() / len(hyp) ** self.length_penalty
                    _add_hypothesis(self.finished[b], self.K, score, hyp)


def _join_best(prompts: Tensor, finished: list[Hypotheses], pad: int) -> Tensor:
    """Each prompt (B, T) followed by its best hypothesis, right-padded with ``pad``: (B, T + longest)."""
    best = [hyps[0][1] for hyps in finished]
    B, T = prompts.shape
    out = torch.full((B, T + max(len(h) for h in best)), pad, dtype=torch.long, device=prompts.device)
    out[:, :T] = prompts
    for b, hyp in enumerate(best):
        out[b, T : T + len(hyp)] = hyp
    return out


def _add_hypothesis(hyps: Hypotheses, K: int, score: float, tokens: Tensor) -> None:
    """Insert into a best-first list holding at most K hypotheses."""
    hyps.append((score, tokens))
    hyps.sort(key=lambda h: h[0], reverse=True)
    del hyps[K:]
