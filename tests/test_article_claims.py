"""The article study's statistics over seeds (scripts/article/seeds.py) on known numbers, the verdicts of
experiments 3 (FFN variants) and 4 (the 1/sqrt(d_k) scale) given numbers that must produce each of them,
and a ``--quick`` run of both through the driver."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # the study runs from a checkout, as the package ``article``
from article import driver, ffn, scale, seeds  # noqa: E402
from article.common import VERDICTS  # noqa: E402


# ---- seeds.py ------------------------------------------------------------------------------------
def test_mean_std_and_interval_of_known_numbers() -> None:
    assert seeds.mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)  # sample std: divides by n - 1
    lo, hi = seeds.interval([1.0, 2.0, 3.0])
    half = 4.3027 / math.sqrt(3)  # t(0.975, df=2) * s / sqrt(n)
    assert lo == pytest.approx(2 - half, abs=1e-4) and hi == pytest.approx(2 + half, abs=1e-4)
    lo, hi = seeds.interval([5.0, 7.0])  # df=1: t = 12.7062, s = sqrt(2), n = 2: half-width t
    assert (lo, hi) == pytest.approx((6.0 - 12.7062, 6.0 + 12.7062), abs=1e-4)
    assert seeds.interval([3.0, 3.0, 3.0]) == (3.0, 3.0)


def test_one_value_has_no_spread_and_an_unbounded_interval() -> None:
    mean, std = seeds.mean_std([4.5])
    assert mean == 4.5 and math.isnan(std)
    assert seeds.interval([4.5]) == (-math.inf, math.inf)
    assert not seeds.separated(seeds.interval([4.5]), seeds.interval([100.0, 100.1]))
    with pytest.raises(ValueError, match="no values"):
        seeds.summarize([])


def test_t_quantiles_match_student_t() -> None:
    stats = pytest.importorskip("scipy.stats")
    for df in range(1, 80):
        assert seeds.t_quantile(df) == pytest.approx(float(stats.t.ppf(0.975, df)), abs=1e-4), df
    with pytest.raises(ValueError, match="df=0"):
        seeds.t_quantile(0)


def test_t_quantiles_fall_towards_the_normal_one() -> None:
    values = [seeds.t_quantile(df) for df in range(1, 200)]
    assert all(a > b for a, b in zip(values, values[1:], strict=False))
    assert seeds.t_quantile(100_000) == pytest.approx(seeds.Z_975, abs=1e-4)


def test_separated_both_ways() -> None:
    assert seeds.separated((0.0, 1.0), (2.0, 3.0)) and seeds.separated((2.0, 3.0), (0.0, 1.0))
    assert not seeds.separated((0.0, 2.0), (1.0, 3.0)) and not seeds.separated((1.0, 3.0), (0.0, 2.0))
    assert not seeds.separated((0.0, 3.0), (1.0, 2.0))  # one inside the other
    assert not seeds.separated((0.0, 1.0), (1.0, 2.0))  # touching ends overlap


def test_fmt() -> None:
    assert seeds.fmt([4.113, 4.123, 4.133]) == "4.123 ± 0.010 (n=3)"
    assert seeds.fmt([4.1234], digits=2) == "4.12 (n=1)"


# ---- experiment 3: the FFN verdict ---------------------------------------------------------------
def test_ffn_verdict_agrees_when_swiglu_is_lower_and_separated() -> None:
    assert ffn.verdict([5.00, 5.01, 5.02], [5.20, 5.21, 5.22]) == "agrees"


def test_ffn_verdict_does_not_when_gelu_is_lower_and_separated() -> None:
    assert ffn.verdict([5.20, 5.21, 5.22], [5.00, 5.01, 5.02]) == "does not"


def test_ffn_verdict_not_separable_when_the_intervals_overlap() -> None:
    assert ffn.verdict([5.00, 5.10, 5.20], [5.05, 5.15, 5.25]) == "not separable at this scale"
    assert ffn.verdict([5.0], [6.0]) == "not separable at this scale"  # one seed decides nothing
    # the same means with three times the spread no longer separate (t = 4.3 at n = 3)
    assert ffn.verdict([4.95, 5.0, 5.05], [5.35, 5.4, 5.45]) == "agrees"
    assert ffn.verdict([4.85, 5.0, 5.15], [5.25, 5.4, 5.55]) == "not separable at this scale"


def test_ffn_pairwise_table_from_the_record() -> None:
    record = {"data": {"seeds": [0, 1, 2], "final_val_loss": {
        "relu": [5.30, 5.31, 5.32], "gelu": [5.20, 5.21, 5.22], "swiglu": [5.00, 5.01, 5.02], "geglu": [5.2, 5.3, 5.1]
    }}}  # fmt: skip
    text = "\n".join(ffn.page_tables(record))
    assert "| swiglu - gelu | -0.2000 | yes |" in text
    assert "| geglu - gelu | -0.0100 | no |" in text
    assert text.count("\n| ") == 5  # header + four gated-plain pairs
    assert ffn.page_tables({"data": {"final_val_loss": {"gelu": 5.1, "swiglu": 5.3}}}) == []  # one-seed record


# ---- experiment 4: the 1/sqrt(d_k) scale's verdict -----------------------------------------------
def _probes(unscaled_entropy: tuple[float, float], grad_factor: tuple[float, float]) -> dict:
    """Probe records at d_k 16 and 256: scaled entropy 4.4 and gradient factor 0.137 at both widths."""
    return {
        "scaled": {16: (4.4, 0.137, 0.0, 1.0), 256: (4.4, 0.137, 0.0, 1.0)},
        "unscaled": {d: (e, g, 0.5, 1.0) for d, e, g in zip((16, 256), unscaled_entropy, grad_factor, strict=True)},
    }


def test_scale_saturates_reads_the_probe() -> None:
    assert scale.saturates(_probes((1.8, 0.3), (0.28, 0.12)), [16, 256])
    assert not scale.saturates(_probes((1.8, 1.6), (0.28, 0.12)), [16, 256])  # entropy barely falls
    assert not scale.saturates(_probes((1.8, 0.3), (0.28, 0.20)), [16, 256])  # the softmax still passes more
    assert not scale.saturates(_probes((4.6, 4.5), (0.28, 0.12)), [16, 256])  # no lower than the scaled one


def test_scale_saturates_on_the_real_probe_at_unit_variance() -> None:
    dims = list(scale.QUICK_DIMS)
    res = {
        key: {d: scale.attention_probe(d, scaled=key == "scaled", init_std=None, seq_len=64) for d in dims}
        for key in ("scaled", "unscaled")
    }
    assert scale.saturates(res, dims)


def test_scale_trains_better_each_way() -> None:
    low, high = [5.78, 5.79, 5.80], [6.05, 6.06, 6.07]
    assert scale.trains_better(low, high) == "scaled"
    assert scale.trains_better(high, low) == "unscaled"
    assert scale.trains_better([5.57, 5.58, 5.59], [5.575, 5.58, 5.585]) is None  # overlapping intervals
    assert scale.trains_better(low, [6.0, math.nan, 6.1]) == "scaled"  # a diverged unscaled run
    assert scale.trains_better([math.inf, 5.0, 5.0], low) == "unscaled"
    assert scale.trains_better([math.nan, 5.0], [5.0, math.nan]) is None


@pytest.mark.parametrize(
    ("saturation", "better", "expected"),
    [
        (True, "scaled", "agrees"),
        (True, None, "partial"),
        (True, "unscaled", "partial"),
        (False, "scaled", "partial"),
        (False, "unscaled", "does not"),
        (False, None, "not separable at this scale"),
    ],
)
def test_scale_verdict(saturation: bool, better: str | None, expected: str) -> None:
    assert scale.verdict(saturation, better) == expected


def test_scale_training_table_from_the_record() -> None:
    training = {"scaled": {"256": [5.78, 5.79, 5.80]}, "unscaled": {"256": [6.05, 6.06, 6.07]}}
    text = "\n".join(scale.page_tables({"data": {"seeds": [0, 1, 2], "training": training}}))
    assert "| 256 | 5.7900 ± 0.0100 (n=3) | 6.0600 ± 0.0100 (n=3) | +0.2700 | yes |" in text
    assert scale.page_tables({"data": {"scaled": {}}}) == []  # a record from before the training comparison


# ---- the quick run of experiments 3 and 4 --------------------------------------------------------
@pytest.mark.slow
def test_quick_run_of_experiments_3_and_4_writes_the_page_and_figures(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    driver.run(only=[3, 4], out=out, work=work, quick=True)
    results = json.loads((out / "results.json").read_text())
    text = (out / "README.md").read_text()
    for number, png in ((3, "3_ffn.png"), (4, "4_scale.png")):
        record = results["experiments"][str(number)]
        assert record["agreement"] in VERDICTS
        assert record["figure"] == png and (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"## {number}. {record['title']}" in text and f"({png})" in text
        assert len(record["data"]["seeds"]) == 2
    final = results["experiments"]["3"]["data"]["final_val_loss"]
    assert set(final) == set(ffn.QUICK_FFNS) and all(len(v) == 2 and all(map(math.isfinite, v)) for v in final.values())
    assert "intervals separate" in text  # experiment 3's pairwise table
