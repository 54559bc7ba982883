"""tasks.text_metrics.ChrF: torchmetrics' CHRFScore's value (an independent implementation), over several
updates, with several references, and summed over processes as torchmetrics sums its states; where a
hypothesis shares no n-gram with its reference (torchmetrics' corpus score parts there), sacrebleu's own
corpus score."""

from __future__ import annotations

import random

import pytest
import torch
from num2words import num2words
from torchmetrics.text import CHRFScore

from tasks.text_metrics import ChrF


def _pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    refs = [num2words(rng.randint(0, 100_000), lang="fr") for _ in range(n)]
    cut = [r if i % 3 == 0 else r[: rng.randint(1, len(r))] for i, r in enumerate(refs)]  # never empty
    hyps = [h + rng.choice(["", " mille", "-et-un", "!"]) for h in cut]
    return hyps, refs


def test_chrf_equals_torchmetrics_over_several_updates():
    ours, theirs = ChrF(), CHRFScore()
    for seed in range(3):
        hyps, refs = _pairs(40, seed)
        ours.update(hyps, [[r] for r in refs])
        theirs.update(hyps, [[r] for r in refs])
    assert 0.2 < float(theirs.compute()) < 0.95  # neither trivial nor perfect
    torch.testing.assert_close(ours.compute(), theirs.compute().float(), atol=1e-5, rtol=0)


def test_chrf_with_two_references_takes_the_better_and_a_perfect_match_is_one():
    hyps, refs = _pairs(20, 7)
    others = [f"{r} et plus" for r in refs]
    ours, theirs = ChrF(), CHRFScore()
    ours.update(hyps, list(zip(others, refs, strict=True)))
    theirs.update(hyps, list(zip(others, refs, strict=True)))
    torch.testing.assert_close(ours.compute(), theirs.compute().float(), atol=1e-5, rtol=0)
    perfect = ChrF()
    perfect.update(refs, [[r] for r in refs])
    assert float(perfect.compute()) == pytest.approx(1.0)


def test_chrf_counts_sum_like_one_process_and_bad_input_is_refused():
    hyps, refs = _pairs(30, 3)
    whole, a, b = ChrF(), ChrF(), ChrF()
    whole.update(hyps, [[r] for r in refs])
    a.update(hyps[:10], [[r] for r in refs[:10]])
    b.update(hyps[10:], [[r] for r in refs[10:]])
    a.counts += b.counts  # what dist_reduce_fx="sum" does over processes
    assert torch.equal(a.counts, whole.counts) and float(a.compute()) == float(whole.compute())
    with pytest.raises(ValueError, match="references for"):
        whole.update(hyps, [[r] for r in refs[:-1]])
    with pytest.raises(ValueError, match="as many references"):
        whole.update(hyps[:2], [[refs[0]], [refs[1], refs[2]]])


def test_a_hypothesis_sharing_nothing_scores_as_in_sacrebleu():
    from sacrebleu.metrics import CHRF

    hyps, refs = ["quatre mille", "", "x"], ["quatre mille deux", "un", "cent"]
    ours = ChrF()
    for h, r in zip(hyps, refs, strict=True):  # one update each: the counts add up as one corpus
        ours.update([h], [[r]])
    corpus = CHRF(word_order=2, eps_smoothing=True).corpus_score(hyps, [refs]).score / 100
    assert float(ours.compute()) == pytest.approx(corpus, abs=1e-6)
    first = ChrF()
    first.update(hyps[:1], [refs[:1]])
    assert float(ours.compute()) < float(first.compute()) - 0.05  # the missed references cost recall
