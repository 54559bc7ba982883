"""Experiments 1 and 2 of the article study: their measurements have the properties the page relies on, and
each verdict follows the numbers it is given (every outcome can come out)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

import zoo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # the study runs from a checkout, as the package ``article``
from article import extrapolation, induction, norm, norm_probe, positions, switches  # noqa: E402


# ---- experiment 1 --------------------------------------------------------------------------------
def test_copy_rows_repeat_a_segment_and_score_what_it_determines() -> None:
    rows, scored = induction.copy_rows(20, 64, train_length=32, generator=torch.Generator().manual_seed(0))
    assert rows.shape == (20, 64) and scored.shape == (20, 63)
    for row, mask in zip(rows, scored, strict=True):
        k = int((~mask).sum()) + 1  # targets 1..k-1 are the first segment's
        assert 4 <= k <= 8  # L/8 .. L/4 of the training length, whatever the row's length
        assert torch.equal(row[k:], row[:-k])  # period k: every scored target equals the token k before it
        assert mask[k - 1 :].all() and not mask[: k - 1].any()


def test_copy_accuracy_splits_inside_and_past_the_training_length() -> None:
    model = induction.decoder("rope", induction.CopySetup(d_model=32), 64, seed=0)
    acc = induction.copy_accuracy(model, 32, 32, rows=4, seed=0)
    assert math.isnan(acc["past"]) and 0 <= acc["inside"] <= 1 and acc["all"] == acc["inside"]
    acc = induction.copy_accuracy(model, 64, 32, rows=4, seed=0)
    assert all(0 <= acc[k] <= 1 for k in ("all", "inside", "past"))


def test_sliding_window_with_the_stride_of_its_window_is_block_perplexity() -> None:
    model = zoo.create_model("gpt-tiny", vocab_size=50, max_seq_len=64, seed=0).eval()
    stream = torch.randint(0, 50, (16 * 8 + 1,), generator=torch.Generator().manual_seed(0))
    windows = stream.unfold(0, 17, 16)  # the same predictions, windows sharing their edge token
    assert extrapolation.sliding_perplexity(model, stream, 16, 16) == pytest.approx(
        extrapolation.perplexity(model, windows), rel=1e-6
    )
    losses = extrapolation.token_losses(model, windows)
    assert extrapolation.loss_by_position(model, windows, 4) == pytest.approx(
        losses.mean(0).view(4, 4).mean(1).tolist()
    )


def test_rope_scaled_keeps_the_weights_and_changes_only_the_scaling() -> None:
    model = zoo.create_model("gpt-tiny", vocab_size=50, max_seq_len=64, position="rope", seed=0).eval()
    assert extrapolation.rope_scaled(model, "yarn", 1.0, 16) is model
    scaled = extrapolation.rope_scaled(model, "yarn", 4.0, 16)
    assert scaled.config.rope_scaling == "yarn" and scaled.config.rope_original_max_len == 16
    tokens = torch.randint(0, 50, (1, 12))
    assert not torch.allclose(scaled(tokens), model(tokens))
    assert all(
        torch.equal(a, b) for a, b in zip(scaled.state_dict().values(), model.state_dict().values(), strict=True)
    )


FLAT = {"sinusoidal": 0.0, "learned": 0.0, "rope": 0.0, "alibi": 0.0, "t5_relative": 0.0}


@pytest.mark.parametrize(
    ("rise", "copy", "expected"),
    [
        (
            {**FLAT, "sinusoidal": 0.5, "learned": 0.4, "rope": 0.3, "t5_relative": 0.1},
            {"alibi": 0.99, "learned": 0.3},
            "agrees",
        ),
        (FLAT, {"alibi": 0.99, "learned": 0.3}, "partial"),  # nothing rises: only ALiBi's and the copy claims hold
        ({**FLAT, "alibi": 0.5, "t5_relative": 0.9}, {"alibi": 0.3, "learned": 0.9}, "does not"),
    ],
)
def test_positions_verdict_follows_the_numbers(rise: dict, copy: dict, expected: str) -> None:
    agreement, seen = positions.verdict(rise, copy)
    assert agreement == expected
    assert f"alibi {rise['alibi']:+.3f}" in seen


# ---- experiment 2 --------------------------------------------------------------------------------
def test_diverged() -> None:
    assert not norm.diverged([6.0, 5.0, 4.0, 3.5])
    assert norm.diverged([6.0, 5.0, float("nan"), 3.0])
    assert norm.diverged([6.0, 7.0, 8.0, 9.0])
    assert norm.diverged([])


def test_grad_norms_have_one_value_per_layer_and_the_step_moves_the_output() -> None:
    model = norm_probe.narrow_decoder("post", 3, seed=0, d_model=32)
    grads = norm_probe.ffn_grad_norms(model, norm_probe.batch(0, rows=2, length=8))
    assert len(grads) == 3 and all(g > 0 and math.isfinite(g) for g in grads)
    assert norm_probe.output_change(model, norm_probe.batch(0, rows=2, length=8)) > 0


def _run(placement: str, depth: int, diverged: bool, last: float = 5.0) -> dict:
    return {"placement": placement, "depth": depth, "lr": 1e-2, "warmup": 0, "diverged": diverged, "last": last}


@pytest.mark.parametrize(
    ("post_growth", "post_steps", "post_diverges", "expected"),
    [(4.0, 100.0, True, "agrees"), (4.0, 1.0, False, "partial"), (1.0, 1.0, False, "does not")],
)
def test_norm_verdict_follows_the_numbers(post_growth, post_steps, post_diverges, expected) -> None:
    growth = {"pre": {24: 1.0}, "post": {24: post_growth}}
    steps = {"pre": {6: 1.0, 48: 2.0}, "post": {6: 1.0, 48: post_steps}}
    sweep = [_run("pre", 24, False), _run("post", 24, post_diverges), _run("deepnorm", 24, False)]
    agreement, seen = norm.verdict(growth, steps, sweep)
    assert agreement == expected
    assert ("DeepNorm failed too in 0 of those 1" in seen) == post_diverges


def test_a_post_norm_run_that_does_not_train_counts_as_failed() -> None:
    growth, steps = {"pre": {24: 1.0}, "post": {24: 1.0}}, {"pre": {6: 1.0, 48: 2.0}, "post": {6: 1.0, 48: 1.0}}
    stuck = [_run("pre", 24, False, last=5.0), _run("post", 24, False, last=5.0 + norm.FAIL_MARGIN + 0.01)]
    assert norm.verdict(growth, steps, stuck)[0] == "partial"
    close = [_run("pre", 24, False, last=5.0), _run("post", 24, False, last=5.0 + norm.FAIL_MARGIN - 0.01)]
    assert norm.verdict(growth, steps, close)[0] == "does not"


# ---- experiment 8: today's switches ----------------------------------------------------------------------
BASE = [4.50, 4.52, 4.51]


@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        ([4.30, 4.31, 4.29], "lower"),  # intervals apart, below the baseline
        ([4.70, 4.72, 4.71], "higher"),
        ([4.49, 4.55, 4.45], "not separable"),  # overlapping intervals
        ([4.30], "not separable"),  # one seed: an unbounded interval separates nothing
    ],
)
def test_a_switch_stands_against_the_baseline_by_its_interval(variant: list, expected: str) -> None:
    assert switches.standing(variant, BASE) == expected


@pytest.mark.parametrize(
    ("standings", "expected"),
    [
        ({"qk_norm": "lower", "dyt": "lower"}, "agrees"),
        ({"qk_norm": "lower", "dyt": "not separable"}, "partial"),
        ({"qk_norm": "lower", "dyt": "higher"}, "partial"),
        ({"qk_norm": "higher", "dyt": "not separable"}, "does not"),
        ({"qk_norm": "not separable", "dyt": "not separable"}, "not separable at this scale"),
    ],
)
def test_switches_verdict_follows_the_standings(standings: dict, expected: str) -> None:
    assert switches.verdict(standings) == expected


def test_every_switch_is_one_override_set_of_its_experiment_and_composes() -> None:
    from article.common import compose_train

    from tasks.cli.schemas import model_config, register_configs

    register_configs()
    assert switches.VARIANTS["baseline"] == [] and set(switches.QUICK_VARIANTS) <= set(switches.VARIANTS)
    for name, overrides in switches.VARIANTS.items():
        cfg = compose_train(["experiment=ablation_switches", *overrides, "paths.output_dir=/unused"])
        assert cfg.task_name == "ablation_switches", name
        model_config(cfg.model).validate()  # every variant builds
