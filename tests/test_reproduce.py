"""zoo-reproduce: the measurement helpers have the properties the results page relies on, and the
``--quick`` mode of every experiment runs end to end and writes its table and figure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import zoo
from tasks.cli import reproduce as R


# ---- helpers: properties -------------------------------------------------------------------------
@pytest.mark.parametrize(("dtype", "n_heads", "n_kv_heads"),
                         [(torch.float32, 4, 4), (torch.bfloat16, 4, 2), (torch.float16, 4, 1)])
def test_kv_formula_equals_measured_cache_bytes(dtype: torch.dtype, n_heads: int, n_kv_heads: int) -> None:
    model = zoo.create_model("llama-tiny", seed=0, vocab_size=64, d_model=32, n_layers=3, n_heads=n_heads,
                             n_kv_heads=n_kv_heads).to(dtype).eval()
    for seq_len in (1, 7, 40):
        cache = R.fill_cache(model, seq_len, batch=2)
        used, allocated = R.measured_cache_bytes(cache)
        cfg = model.config
        formula = R.kv_formula(cfg.n_layers, cfg.kv_heads, cfg.dim_head, seq_len, dtype.itemsize, batch=2)
        assert used == formula == zoo.stats(cfg, seq_len=seq_len, batch_size=2, dtype=dtype).kv_cache_bytes
        assert allocated >= used


def test_kv_formula_is_the_articles_7b_figure() -> None:
    assert R.kv_formula(32, 32, 128, 4096, 2) == 2 * 32 * 32 * 128 * 4096 * 2 == 2_147_483_648


@pytest.mark.slow
def test_preset_table_has_a_row_per_preset_with_exact_counts() -> None:
    table = R.preset_table()
    assert [r["name"] for r in table] == zoo.list_models()
    counts = {r["name"]: r["params"] for r in table}
    assert counts["gpt2"] == 124_439_808  # HF gpt2
    assert counts["llama2-7b"] == 6_738_415_616  # HF Llama-2-7b
    assert counts["gpt-tiny"] == zoo.count_parameters(zoo.create_model("gpt-tiny"))
    for name, shape in R.ARTICLE_TABLE.items():  # the article's own rows are presets with its sizes
        row = next(r for r in table if r["name"] == name)
        assert {k: row[k] for k in shape} == shape
    gpt2 = next(r for r in table if r["name"] == "gpt2")
    assert 0.6 < gpt2["ffn_share"] < 0.7  # 8d^2 of 12d^2 per block, plus biases


def test_every_published_figure_names_a_preset() -> None:
    assert set(R.PUBLISHED_PARAMS) <= set(zoo.list_models())


def test_diverged() -> None:
    assert not R.diverged([6.0, 5.0, 4.0, 3.5])
    assert R.diverged([6.0, 5.0, float("nan"), 3.0])
    assert R.diverged([6.0, 5.0, 4.0, float("inf")])
    assert R.diverged([6.0, 7.0, 8.0, 9.0])
    assert not R.diverged([6.0, 5.0, 4.0, 3.5, 3.4, 3.3])
    assert R.diverged([])


def test_diverged_looks_at_the_end_not_the_middle() -> None:
    assert not R.diverged([6.0, 9.0, 12.0, 5.0, 4.0, 3.0])
    assert R.diverged([6.0, 3.0, 3.0, 7.0, 7.0, 7.0])


def test_perplexity_of_a_uniform_model_is_the_vocabulary_size() -> None:
    model = zoo.create_model("gpt-tiny", vocab_size=50, max_seq_len=32)
    assert model.lm_head is None  # tied head
    with torch.no_grad():
        model.embed.weight.zero_()  # zero logits everywhere
    blocks = torch.randint(0, 50, (5, 17))
    assert R.perplexity(model, blocks, batch_size=2) == pytest.approx(50.0, rel=1e-4)


def test_attention_probe_uniform_when_weights_are_zero() -> None:
    entropy, jacobian, saturated, _ = R.attention_probe(32, scaled=False, init_std=1e-12, seq_len=64)
    assert entropy == pytest.approx(math.log(64), abs=1e-4)
    assert saturated == 0.0
    assert jacobian == pytest.approx(math.sqrt(1 / 64 - 2 / 64**2 + 1 / 64**2), rel=1e-3)


def test_attention_probe_unscaled_saturates_with_width() -> None:
    narrow = R.attention_probe(16, scaled=False, init_std=None)
    wide = R.attention_probe(256, scaled=False, init_std=None)
    scaled_wide = R.attention_probe(256, scaled=True, init_std=None)
    assert wide[0] < narrow[0] < scaled_wide[0]
    assert wide[2] > narrow[2]


def test_eval_blocks_cut_the_same_text(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = torch.arange(1000)

    class FakeData:
        datasets = {"test": type("D", (), {"items": stream[: 3 * 257].view(3, 257)})()}

        def setup(self, stage: str) -> None:
            pass

    monkeypatch.setattr("tasks.cli.common.load_task", lambda ckpt: (None, {}))
    monkeypatch.setattr("tasks.cli.common.data_module", lambda info, task, seq_len: FakeData())
    blocks = R.eval_blocks(Path("unused"), [32, 64, 256], max_tokens=700)
    for n, b in blocks.items():
        assert b.shape[1] == n + 1
        assert torch.equal(b.flatten(), stream[: b.numel()])
        assert b.numel() > 700 - (n + 1)
    with pytest.raises(ValueError, match="fewer than"):
        R.eval_blocks(Path("unused"), [32], max_tokens=5000)


def test_page_lists_every_experiment(tmp_path: Path) -> None:
    result = R.Result(9, "A title", "a claim", "a setup", ["a", "b"], [[1, 2]], "9.png", "seen", "partial", 1.5)
    results = {"experiments": {"9": result.to_dict()},
               "meta": {"command": "zoo-reproduce", "date": "today", "machine": "m", "threads": 1,
                        "total_seconds": 60.0}}
    text = R.write_page(tmp_path, results).read_text()
    assert "## 9. A title" in text and "| 1 | 2 |" in text and "![A title](9.png)" in text
    assert "**Agrees with the article:** partial" in text


# ---- the quick run of all six --------------------------------------------------------------------
@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("article")
    R.main(["--quick", "--out", str(out), "--work", str(tmp_path_factory.mktemp("runs"))])
    return out, json.loads((out / "results.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("number", sorted(R.EXPERIMENTS))
def test_quick_mode_writes_table_and_figure(quick: tuple[Path, dict], number: int) -> None:
    out, results = quick
    record = results["experiments"][str(number)]
    assert record["rows"] and all(len(row) == len(record["headers"]) for row in record["rows"])
    assert record["agreement"] in ("yes", "no", "partial")
    png = out / record["figure"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    page = (out / "README.md").read_text()
    assert f"## {number}. {record['title']}" in page and f"({record['figure']})" in page


@pytest.mark.slow
def test_quick_mode_numbers_are_sane(quick: tuple[Path, dict]) -> None:
    _, results = quick
    ppl = results["experiments"]["1"]["data"]["ppl"]
    assert {"rope", "alibi", "rope+PI"} <= set(ppl)
    assert all(math.isfinite(v) and v > 1 for d in ppl.values() for v in d.values())
    memory = results["experiments"]["5"]["data"]["memory"]
    assert all(m["measured"] == m["formula"] == m["zoo_stats"] for m in memory)
    assert len(results["experiments"]["6"]["rows"]) == len(zoo.list_models())
    assert results["meta"]["quick"] is True


def test_a_run_writes_outside_the_committed_page_unless_asked(tmp_path, monkeypatch):
    from tasks.cli import reproduce

    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs" / "article").mkdir(parents=True)
    reproduce.main(["--quick", "--only", "6"])
    assert not list((tmp_path / "docs" / "article").iterdir())  # the committed page is left alone
    (page,) = (tmp_path / "outputs" / "reproduce").glob("*/README.md")
    assert "6" in page.read_text()
