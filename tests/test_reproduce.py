"""The article study (scripts/article): the measurement helpers have the properties the results page relies
on, the page writer renders the committed records as the committed page, and the ``--quick`` mode of every
experiment runs end to end and writes its table and figure."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import zoo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # the study runs from a checkout, as the package ``article``
from article import driver, kv_cache, norm, page, positions, scale, sizes  # noqa: E402
from article.common import VERDICTS, Result  # noqa: E402


# ---- helpers: properties -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dtype", "n_heads", "n_kv_heads"), [(torch.float32, 4, 4), (torch.bfloat16, 4, 2), (torch.float16, 4, 1)]
)
def test_zoo_stats_kv_bytes_equal_a_measured_cache(dtype: torch.dtype, n_heads: int, n_kv_heads: int) -> None:
    model = (
        zoo.create_model(
            "llama-tiny", seed=0, vocab_size=64, d_model=32, n_layers=3, n_heads=n_heads, n_kv_heads=n_kv_heads
        )
        .to(dtype)
        .eval()
    )
    for seq_len in (1, 7, 40):
        used, allocated = kv_cache.measured_cache_bytes(kv_cache.fill_cache(model, seq_len, batch=2))
        assert used == zoo.stats(model.config, seq_len=seq_len, batch_size=2, dtype=dtype).kv_cache_bytes
        assert allocated >= used


@pytest.mark.slow
def test_preset_table_has_a_row_per_preset_with_exact_counts() -> None:
    table = sizes.preset_table()
    assert [r["name"] for r in table] == zoo.list_models()
    counts = {r["name"]: r["params"] for r in table}
    assert counts["gpt2"] == 124_439_808  # HF gpt2
    assert counts["llama2-7b"] == 6_738_415_616  # HF Llama-2-7b
    assert counts["gpt-tiny"] == zoo.count_parameters(zoo.create_model("gpt-tiny"))
    for name, shape in sizes.ARTICLE_TABLE.items():  # the article's own rows are presets with its sizes
        row = next(r for r in table if r["name"] == name)
        assert {k: row[k] for k in shape} == shape
    gpt2 = next(r for r in table if r["name"] == "gpt2")
    assert 0.6 < gpt2["ffn_share"] < 0.7  # 8d^2 of 12d^2 per block, plus biases


def test_every_published_figure_names_a_preset() -> None:
    assert set(sizes.PUBLISHED_PARAMS) <= set(zoo.list_models())


def test_diverged() -> None:
    assert not norm.diverged([6.0, 5.0, 4.0, 3.5])
    assert norm.diverged([6.0, 5.0, float("nan"), 3.0])
    assert norm.diverged([6.0, 5.0, 4.0, float("inf")])
    assert norm.diverged([6.0, 7.0, 8.0, 9.0])
    assert not norm.diverged([6.0, 5.0, 4.0, 3.5, 3.4, 3.3])
    assert norm.diverged([])


def test_diverged_looks_at_the_end_not_the_middle() -> None:
    assert not norm.diverged([6.0, 9.0, 12.0, 5.0, 4.0, 3.0])
    assert norm.diverged([6.0, 3.0, 3.0, 7.0, 7.0, 7.0])


def test_perplexity_of_a_uniform_model_is_the_vocabulary_size() -> None:
    model = zoo.create_model("gpt-tiny", vocab_size=50, max_seq_len=32)
    assert model.lm_head is None  # tied head
    with torch.no_grad():
        model.embed.weight.zero_()  # zero logits everywhere
    blocks = torch.randint(0, 50, (5, 17))
    assert positions.perplexity(model, blocks, batch_size=2) == pytest.approx(50.0, rel=1e-4)


def test_attention_probe_uniform_when_weights_are_zero() -> None:
    entropy, jacobian, saturated, _ = scale.attention_probe(32, scaled=False, init_std=1e-12, seq_len=64)
    assert entropy == pytest.approx(math.log(64), abs=1e-4)
    assert saturated == 0.0
    assert jacobian == pytest.approx(math.sqrt(1 / 64 - 2 / 64**2 + 1 / 64**2), rel=1e-3)


def test_attention_probe_unscaled_saturates_with_width() -> None:
    narrow = scale.attention_probe(16, scaled=False, init_std=None)
    wide = scale.attention_probe(256, scaled=False, init_std=None)
    scaled_wide = scale.attention_probe(256, scaled=True, init_std=None)
    assert wide[0] < narrow[0] < scaled_wide[0]
    assert wide[2] > narrow[2]


def test_blocks_cut_from_the_longest_are_what_the_data_module_cuts_at_each_length() -> None:
    from tasks.data import LMDataModule

    def test_split(seq_len: int, tokenizer: object = None) -> LMDataModule:  # experiment 1's quick-mode data
        dm = LMDataModule(
            source="stdlib_code",
            source_args={"max_files": 40},
            vocab_size=512,
            seq_len=seq_len,
            val_fraction=0.02,
            test_fraction=0.02,
        )
        dm.tokenizer = tokenizer
        dm.setup("test")
        return dm

    longest = test_split(64)
    items = longest.datasets["test"].items
    blocks = positions.cut_blocks(items, [16, 32, 64], None)
    assert torch.equal(blocks[64], items)
    for n in (16, 32):
        own = test_split(n, longest.tokenizer).datasets["test"].items  # the same text cut at length n
        assert blocks[n].shape[1] == n + 1 and len(blocks[n]) > 0.9 * len(own)
        assert torch.equal(blocks[n], own[: len(blocks[n])])
    for n, b in positions.cut_blocks(items, [16, 64], max_tokens=1000).items():  # a prefix of the same text
        assert torch.equal(b, blocks[n][: len(b)]) and 1000 - (n + 1) < b.numel() <= 1000
    with pytest.raises(ValueError, match="fewer than"):
        positions.cut_blocks(items, [16], max_tokens=items.numel() + 1)


# ---- the page ------------------------------------------------------------------------------------
def test_page_lists_every_experiment_with_the_tables_its_module_adds(tmp_path: Path) -> None:
    result = Result(9, "A title", "a claim", "a setup", ["a", "b"], [[1, 2]], "9.png", "seen", "partial", 1.5)
    results = {
        "experiments": {"9": result.to_dict()},
        "meta": {"command": "run.py", "date": "today", "machine": "m", "threads": 1, "total_seconds": 60.0},
    }
    text = page.write_page(tmp_path, results).read_text()
    assert "## 9. A title" in text and "| 1 | 2 |" in text and "![A title](9.png)" in text
    assert "**Verdict:** partial. Seeds: 9 " in text
    module = SimpleNamespace(page_tables=lambda record: [f"more about {record['title']}", ""])
    text = page.write_page(tmp_path, results, {9: module}).read_text()
    assert text.index("| 1 | 2 |") < text.index("more about A title") < text.index("![A title](9.png)")


def _without_cache_table(text: str) -> list[str]:
    """The page without experiment 5's table of cache bytes (its formula column now is zoo.stats')."""
    lines = text.split("\n")
    start = lines.index("Cache bytes, measured against the formula:") + 2
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return lines[:start] + lines[end:]


def test_the_committed_records_render_as_the_committed_page(tmp_path: Path) -> None:
    committed = ROOT / "docs" / "article"
    results = json.loads((committed / "results.json").read_text())
    text = page.write_page(tmp_path, results, driver.EXPERIMENTS).read_text()
    assert _without_cache_table(text) == _without_cache_table((committed / "README.md").read_text())
    assert "| float32 | 32 | 131072 | 131072 | 131072 | yes |" in text  # measured, zoo.stats, allocated


def test_the_script_runs_from_another_directory(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "article" / "run.py"), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "--quick" in done.stdout and "--only" in done.stdout


# ---- the quick run of all six --------------------------------------------------------------------
@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("article")
    driver.main(["--quick", "--out", str(out), "--work", str(tmp_path_factory.mktemp("runs"))])
    return out, json.loads((out / "results.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("number", sorted(driver.EXPERIMENTS))
def test_quick_mode_writes_table_and_figure(quick: tuple[Path, dict], number: int) -> None:
    out, results = quick
    record = results["experiments"][str(number)]
    assert record["rows"] and all(len(row) == len(record["headers"]) for row in record["rows"])
    assert record["agreement"] in VERDICTS
    png = out / record["figure"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    page_text = (out / "README.md").read_text()
    assert f"## {number}. {record['title']}" in page_text and f"({record['figure']})" in page_text


@pytest.mark.slow
def test_quick_mode_numbers_are_sane(quick: tuple[Path, dict]) -> None:
    _, results = quick
    ppl = results["experiments"]["1"]["data"]["ppl"]
    assert {"rope", "alibi", "rope+linear", "rope+ntk", "rope+yarn"} <= set(ppl)
    assert all(math.isfinite(v) and v > 1 for d in ppl.values() for v in d.values())
    memory = results["experiments"]["5"]["data"]["memory"]
    assert memory and all(m["measured"] == m["zoo_stats"] <= m["allocated"] for m in memory)
    assert len(results["experiments"]["6"]["rows"]) == len(zoo.list_models())
    assert results["meta"]["quick"] is True


def test_a_run_writes_outside_the_committed_page_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs" / "article").mkdir(parents=True)
    driver.main(["--quick", "--only", "6"])
    assert not list((tmp_path / "docs" / "article").iterdir())  # the committed page is left alone
    (page_path,) = (tmp_path / "outputs" / "reproduce").glob("*/README.md")
    assert "## 6. The article's size table" in page_path.read_text()
