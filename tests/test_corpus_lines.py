"""A run on its own corpus says what it does with it (issue 43, the walk's frictions): one line when it
prepares the corpus (the corpus, the cache, its files and MB) followed by a bar in MB/s, whatever the
size and wherever the output goes; one line when it reuses the cache (the folder, its tokens, the date
it was prepared). Only rank 0 of a distributed run speaks."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest
from lightning.pytorch.utilities import rank_zero_only
from real_commands import run
from test_prepared import corpus, module, stores

PREPARING = re.compile(r"^preparing (\S+) into (\S+): 3 files, (\d+\.\d+) MB$", re.MULTILINE)
BAR = re.compile(r"^tokenizing .* (\d+\.\d+)/\1 MB \d+\.\d+ MB/s", re.MULTILINE)
REUSING = re.compile(r"^reusing (\S+): ([\d,]+) tokens, prepared (\d{4}-\d\d-\d\d \d\d:\d\d)$", re.MULTILINE)


def test_preparing_then_reusing_a_corpus_says_each_in_one_line(tmp_path, capsys):
    text, cache = corpus(tmp_path / "text"), tmp_path / "cache"
    module(text, cache).setup("fit")
    first = capsys.readouterr().out  # not a terminal: the bar's last state, printed once
    (said,) = PREPARING.findall(first)
    assert said[:2] == (str(text), str(cache))
    assert float(said[2]) == pytest.approx(sum(f.stat().st_size for f in text.iterdir()) / 1e6, abs=1e-3)
    assert len(BAR.findall(first)) == 1 and "\x1b" not in first  # no terminal codes in a file or a pipe
    assert not REUSING.search(first)

    module(text, cache).setup("fit")
    second = capsys.readouterr().out
    (store,) = stores(cache)
    ((folder, count, date),) = REUSING.findall(second)
    assert second.count("\n") == 1 and folder == str(store)
    assert int(count.replace(",", "")) == sum(s["tokens"] for s in _meta(store)["splits"].values())
    assert abs((datetime.now() - datetime.strptime(date, "%Y-%m-%d %H:%M")).total_seconds()) < 600


def test_a_cache_from_before_the_date_was_kept_says_the_time_of_its_files(tmp_path, capsys):
    text, cache = corpus(tmp_path / "text"), tmp_path / "cache"
    module(text, cache).setup("fit")
    (store,) = stores(cache)
    meta = _meta(store)
    del meta["prepared"]  # as earlier versions wrote it
    (store / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    capsys.readouterr()
    module(text, cache).setup("fit")
    ((_, _, date),) = REUSING.findall(capsys.readouterr().out)
    assert date == datetime.fromtimestamp((store / "meta.json").stat().st_mtime).strftime("%Y-%m-%d %H:%M")


def test_a_corpus_read_as_records_counts_them(tmp_path, capsys):
    text = corpus(tmp_path / "text")
    module(text, tmp_path / "cache", max_records=300).setup("fit")
    out = capsys.readouterr().out
    assert re.search(rf"^preparing {re.escape(str(text))} into \S+: 300 records, \d+\.\d+ MB$", out, re.MULTILINE)


def test_other_ranks_say_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(rank_zero_only, "rank", 1)  # as a process Lightning's launcher started
    text, cache = corpus(tmp_path / "text"), tmp_path / "cache"
    module(text, cache).setup("fit")
    module(text, cache).setup("fit")
    assert capsys.readouterr().out == ""


TINY = [
    "data=local_text",
    "data.vocab_size=300",
    "data.seq_len=16",
    "model.d_model=32",
    "model.n_heads=2",
    "model.n_layers=1",
    "trainer.max_steps=2",
    "trainer.limit_val_batches=1",
    "trainer.num_sanity_val_steps=0",
    "test=false",
]


@pytest.mark.slow
def test_zoo_train_on_its_own_corpus_says_it_prepares_then_reuses(tmp_path):
    text, cache = corpus(tmp_path / "text"), tmp_path / "cache"
    given = [*TINY, f"data.source_args.path={text}", f"data.cache_dir={cache}"]
    first = run("train", *given, f"hydra.run.dir={tmp_path / 'a'}", cwd=tmp_path)  # output to a pipe, as in CI
    assert first.returncode == 0, first.stderr[-3000:]
    assert len(PREPARING.findall(first.stdout)) == 1 and len(BAR.findall(first.stdout)) == 1
    assert not REUSING.search(first.stdout)
    second = run("train", *given, f"hydra.run.dir={tmp_path / 'b'}", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    (reused,) = REUSING.findall(second.stdout)
    assert reused[0] == str(stores(cache)[0])
    assert not PREPARING.search(second.stdout) and "tokenizing" not in second.stdout


def _meta(store: Path) -> dict:
    return json.loads((store / "meta.json").read_text(encoding="utf-8"))
