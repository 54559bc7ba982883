"""The benchmarks of scripts/bench/ at a tiny size: every part runs and reports what the README quotes (no
timing asserted), and each script runs from a checkout as ``python scripts/bench/<name>.py``."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench"


def _script(name: str):
    """scripts/bench/<name>.py as a module (scripts/ is no package: it is loaded from its file)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["hf_compare", "device", "flex", "text_metrics", "data"])
def test_each_script_runs_from_a_checkout(name):
    out = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), "--help"], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(f"usage: scripts/bench/{name}.py") and "--json" in out.stdout


@pytest.mark.slow
def test_bench_tiny_runs_every_part(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "bench.json"
    result = _script("hf_compare").run(
        [
            "--only",
            "train",
            "generate",
            "memory",
            "--families",
            "gpt2",
            "--precisions",
            "fp32",
            "--layers",
            "1",
            "--d-model",
            "32",
            "--heads",
            "2",
            "--vocab",
            "128",
            "--batch",
            "2",
            "--length",
            "16",
            "--rounds",
            "1",
            "--steps",
            "1",
            "--new-tokens",
            "4",
            "--cache-lengths",
            "8",
            "32",
            "--json",
            str(out),
        ]
    )
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


@pytest.mark.slow
def test_device_bench_tiny_on_the_cpu():
    """The dry run of scripts/gpu_check.sh, compile off only (inductor on a CPU takes minutes)."""
    device = _script("device")
    row = device.bench_device_training("gpt-tiny", batch=2, length=16, steps=1, compile=False, device="cpu")
    assert row["preset"] == "gpt-tiny" and row["tokens_per_s"] > 0 and row["model_tflops_per_s"] > 0
    assert row["mfu"] is None and row["peak_memory_gib"] is None  # no peak FLOP/s known for a CPU


def test_flex_bench_tiny_on_the_cpu(tmp_path):
    """The dry run of scripts/gpu_check.sh's flex step: every length and run, flex on FlexMods (the mods path
    that the GPU times), auto and sdpa on dense masks (auto picks flex on CUDA only)."""
    flex = _script("flex")
    out = tmp_path / "flex.json"
    rows = flex.flex_main(
        [
            "--device",
            "cpu",
            "--tokens",
            "32",
            "--lengths",
            "8",
            "16",
            "--steps",
            "1",
            "--d-model",
            "64",
            "--n-layers",
            "1",
            "--json",
            str(out),
        ]
    )
    assert json.loads(out.read_text()) == rows
    assert [(r["length"], r["position"], r["attention"]) for r in rows] == [
        (length, *run) for length in (8, 16) for run in flex.RUNS
    ]
    assert all(r["flex_mods"] == (r["attention"] == "flex") for r in rows)
    assert all(r["tokens_per_s"] > 0 and not r["train"] for r in rows)
    assert [r["vs_rope"] for r in rows if r["position"] == "rope"] == [1.0, 1.0]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lora", "memory"])
def test_memory_scripts_run_tiny_from_a_checkout(name, tmp_path):
    """Each variant runs in its own process from the file (as a user runs it); same weights on each side."""
    pytest.importorskip("transformers")
    out = tmp_path / f"{name}.json"
    args = ["--layers=1", "--d-model=32", "--heads=2", "--vocab=64", "--batch=1", "--length=16", f"--out={out}"]
    args += ["--loss-chunk=5"] if name == "memory" else []  # 16 tokens in chunks of 5, 5, 5 and 1
    done = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), *args], capture_output=True, text=True, timeout=300, cwd="/"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    if name == "lora":
        assert results["lora"]["trainable"] < results["full"]["trainable"]
        assert math.isclose(results["lora"]["first_loss"], results["full"]["first_loss"], rel_tol=1e-6)  # B = 0
    else:
        losses = {round(r["loss"], 4) for r in results}
        assert len(results) == 6 and len(losses) == 1  # the six variants compute one function
        assert {r["loss_kind"] for r in results if r["side"] == "zoo"} == {"whole", "chunked"}


@pytest.mark.slow
def test_decoding_bench_tiny_reports_eager_against_eager(tmp_path):
    """scripts/bench/decoding.py at a tiny size: every variant decodes the same tokens, and each row
    carries its ratio to transformers' eager generate (the equal-precision comparison) and to the faster HF."""
    decoding = _script("decoding")
    out = decoding.main(
        ["--layers", "1", "--d-model", "32", "--heads", "2", "--vocab", "64", "--batches", "1"]
        + ["--new-tokens", "4", "--rounds", "1", "--warmup", "1", "--json", str(tmp_path / "d.json")]
    )
    rows = {row["variant"]: row for row in out["rows"]}
    assert set(rows) == set(decoding.VARIANTS) and all(row["same_tokens"] for row in rows.values())
    assert rows["hf"]["vs_hf_eager"] == 1.0
    for row in rows.values():
        assert row["vs_hf_eager"] == pytest.approx(row["tokens_per_s"] / rows["hf"]["tokens_per_s"])
    assert json.loads((tmp_path / "d.json").read_text())["rows"][0]["vs_hf_eager"] == rows["zoo"]["vs_hf_eager"]


def test_optimizer_bench_tiny_times_both_optimizers_from_a_checkout(tmp_path):
    """scripts/bench/optimizers.py, run from its file: both sides train the same model with the shipped
    optimizer settings, each with its own optimizer.step() time."""
    out = tmp_path / "optimizers.json"
    args = ["--layers=1", "--d-model=32", "--heads=2", "--vocab=64", "--batch=2", "--length=16", "--rounds=2"]
    done = subprocess.run(
        [sys.executable, str(BENCH / "optimizers.py"), *args, "--steps=2", f"--out={out}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    for name in ("muon", "adamw"):
        assert result[name]["tokens_per_s"] > 0 and result[name]["optimizer_step_ms"] > 0
    assert result["step_time_muon_over_adamw"] == pytest.approx(
        result["adamw"]["tokens_per_s"] / result["muon"]["tokens_per_s"]
    )
    assert "a training step under muon takes" in done.stdout


def test_text_metrics_bench_reports_both_sides_on_the_same_batch(tmp_path):
    out = tmp_path / "text_metrics.json"
    result = _script("text_metrics").run(["--sentences", "12", "--rounds", "2", "--json", str(out)])
    assert json.loads(out.read_text()) == result
    zoo_side, theirs = result["zoo ChrF"], result["torchmetrics CHRFScore"]
    assert zoo_side["ms_per_batch"] > 0 and theirs["ms_per_batch"] > 0 and result["speedup"] > 0
    assert 0 < zoo_side["score"] < 1 and math.isclose(zoo_side["score"], theirs["score"], abs_tol=1e-5)


@pytest.mark.slow
def test_data_bench_runs_zoo_train_twice_on_a_corpus_it_builds(tmp_path):
    """scripts/bench/data.py at a tiny size: the corpus built, both runs of zoo-train (the second from the
    cache), the cached setup and the loader timed; every figure the README's table quotes is in the row."""
    out = tmp_path / "data.json"
    args = ["--sizes", "0.3", "--steps", "2", "--batches", "5", "--work", str(tmp_path / "work"), "--json", str(out)]
    done = subprocess.run([sys.executable, str(BENCH / "data.py"), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    assert row["text_bytes"] >= 0.3 * 2**20 and row["cache_mb"] > 0
    for run in ("first", "second"):
        assert "error" not in row[run] and row[run]["seconds"] > 0 and row[run]["peak_rss_mb"] > 100
    assert row["loader_tokens_per_s"] > 0 and row["cached_setup_s"] > 0
    assert not (tmp_path / "work" / "corpus-0.3MB").exists()  # removed without --keep
