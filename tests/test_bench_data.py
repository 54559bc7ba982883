"""scripts/bench/data.py: its smallest mode end to end (a corpus built, zoo-train run twice on it with its
own cache, the loader timed in this process, the rows written: about 20 s on 2 cores), the corpus it
builds when the text runs out, and a failed run reported as a line, not a traceback. (tests/test_bench.py
runs its --help from a checkout.)"""

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "data.py"
MB = 2**20


def _bench():
    """scripts/bench/data.py as a module (scripts/ is no package: it is loaded from its file)."""
    spec = importlib.util.spec_from_file_location("bench_data", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # tens of seconds on 2 cores: CI's slow pass runs it
def test_quick_mode_runs_zoo_train_twice_on_a_corpus_and_writes_sane_rows(tmp_path, capsys):
    out, work = tmp_path / "rows.json", tmp_path / "work"
    assert _bench().main(["--quick", "--work", str(work), "--out", str(out)]) == 0, capsys.readouterr().out[-3000:]
    printed = capsys.readouterr().out
    (row,) = json.loads(out.read_text())
    assert "error" not in row and "loader_error" not in row, row
    assert row["corpus_mb"] == 0.1 and 0.1 * MB <= row["text_bytes"] < 0.11 * MB and row["corpus_files"] == 1
    for run in ("first", "second"):
        r = row[run]
        assert r["returncode"] == 0 and 0 < r["start_s"] < r["seconds"] and 0 < r["start_cpu_s"] <= r["cpu_s"]
        assert 100 < r["peak_rss_mb"] < 8000  # a Python with torch and Lightning loaded; a tiny model
    assert row["cache_mb"] > 0 and row["cache_reused"] is True  # the second run prepared nothing
    assert row["prepare_timed_by"] == "start" and row["cores"] >= 1
    assert row["cached_setup_s"] >= 0 and row["loader_batches"] >= 1 and row["loader_tokens_per_s"] > 0
    assert "loader tok/s" in printed and "goal >= 5,000,000" in printed
    assert not (work / "corpus-0.1MB").exists() and not (work / "cache-0.1MB").exists()  # without --keep
    assert (work / "0.1MB-first.log").is_file() and (work / "0.1MB-second.log").is_file()


def test_a_corpus_larger_than_its_sources_repeats_them_each_copy_marked(tmp_path):
    bench = _bench()
    sources = [tmp_path / "a.py", tmp_path / "b.txt", tmp_path / "binary"]
    sources[0].write_text("import os\n" * 300)
    sources[1].write_text("some documentation\n" * 200)
    sources[2].write_bytes(b"\x1f\x8b\0\0" * 100)  # not text: skipped
    size_mb = 15_000 / MB  # two whole passes (6,800 bytes each, the second with a line per copy), a cut third
    built = bench.build_corpus(tmp_path / "corpus", size_mb, lambda: sources)
    text = b"".join(f.read_bytes() for f in sorted((tmp_path / "corpus").glob("*.txt")))
    assert built["bytes"] == len(text) and int(size_mb * MB) <= len(text) < size_mb * MB + 10 and built["copies"] == 3
    marked = [line for line in text.decode().splitlines() if line.startswith("# zoo-bench data: copy")]
    a, b = sources[:2]
    assert marked == [f"# zoo-bench data: copy {n} of {path}" for n, path in ((2, a), (2, b), (3, a))]
    assert bench.build_corpus(tmp_path / "corpus", size_mb, lambda: []) == built  # reused, not built again


def test_a_failed_run_is_its_last_line(tmp_path):
    run = _bench().watched(
        [
            sys.executable,
            "-c",
            "import time; print('Parameters: 1', flush=True); time.sleep(0.5); raise SystemExit('zoo: Data')",
        ],
        dict(os.environ),
        tmp_path / "run.log",
    )
    assert run["returncode"] == 1 and run["error"] == "zoo: Data"  # stderr too, without a traceback
    assert 0 < run["start_s"] < run["seconds"] and run["peak_rss_mb"] > 0  # polled while it slept
    assert (tmp_path / "run.log").read_text() == "Parameters: 1\nzoo: Data\n"
