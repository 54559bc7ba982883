"""zoo-bench at a tiny size: every part runs and reports what the README quotes (no timing asserted)."""

import json
import math

import pytest

pytest.importorskip("transformers")

from tasks.cli.bench import run  # noqa: E402


@pytest.mark.slow
def test_bench_tiny_runs_every_part(tmp_path):
    out = tmp_path / "bench.json"
    result = run(["--only", "train", "generate", "memory", "--families", "gpt2", "--precisions", "fp32",
                   "--layers", "1", "--d-model", "32", "--heads", "2", "--vocab", "128", "--batch", "2",
                   "--length", "16", "--rounds", "1", "--steps", "1", "--new-tokens", "4",
                   "--cache-lengths", "8", "32", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert saved["config"]["families"] == ["gpt2"]
    names = [r["name"] for r in saved["results"]]
    assert names[0] == "train gpt2 fp32"
    assert any(n.startswith("generate gpt2 batch 8") for n in names)
    assert any(n.startswith("zoo cache vs recompute, 32") for n in names)
    for r in saved["results"]:
        assert r["zoo_tokens_per_s"] > 0 and r["hf_tokens_per_s"] > 0
        assert math.isclose(r["ratio"], r["zoo_tokens_per_s"] / r["hf_tokens_per_s"])
    memory = saved["peak_memory_mib"]
    assert set(memory) == {"gpt2 fp32 zoo", "gpt2 fp32 hf"}
    assert all(v > 0 for v in memory.values())  # a training step allocates
    assert [r["name"] for r in result["results"]] == names  # what it returns is what it saved
