""".txt files read by line, by paragraph or by document (``data.source_args.sample_by``), a training
order held in machine integers, and a data module's ids joined at C speed: the same records, keys,
orders and ids as the straightforward Python they replace."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import tasks.data.formats.text as text_files
import tasks.data.formats.utf8 as utf8
from tasks.data.loading import ShuffledBatchSampler, _mix
from tasks.data.prepared import joined
from tasks.data.sources import load_records
from tasks.data.sources.base import keyed
from tasks.errors import DataError

TEXT = "  \n\ndef f(x):\r\n    return x\r\n\r\n  \n\nclass A:\n    pass\n\n\n# the end\n"


def _local(path: Path, **args: str) -> list[dict]:
    return load_records("local", path=str(path), **args)


@pytest.fixture(params=[1 << 20, 3], ids=["whole", "3-byte chunks"])
def chunked(request, monkeypatch):
    """Read files in chunks of this many bytes: breaks and blank lines across chunk borders."""
    monkeypatch.setattr(utf8, "CHUNK_BYTES", request.param)


def test_a_document_is_a_file_with_its_line_breaks_and_one_group(tmp_path, chunked):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_bytes(TEXT.encode())
    (tmp_path / "a.txt").write_text("one line, no break")
    records = _local(tmp_path, sample_by="document")
    assert [r["text"] for r in records] == ["one line, no break", TEXT.replace("\r\n", "\n")]
    assert [(r["key"], r["group"]) for r in records] == [("a.txt#0", "a.txt"), ("sub/b.txt#0", "sub/b.txt")]


def test_a_long_document_is_cut_at_line_ends_into_pieces_of_one_split(tmp_path, monkeypatch, chunked):
    monkeypatch.setattr(text_files, "MAX_RECORD_CHARS", 12)
    text = "".join(f"line {i}\n" for i in range(20))
    (tmp_path / "long.txt").write_text(text)
    records = _local(tmp_path / "long.txt", sample_by="document")
    pieces = [r["text"] for r in records]
    assert "".join(pieces) == text and all(len(p) <= 12 and p.endswith("\n") for p in pieces)
    assert {r["group"] for r in records} == {"long.txt"} and len({r["key"] for r in records}) == len(records)


def test_paragraphs_end_at_blank_or_whitespace_lines_and_are_never_empty(tmp_path, chunked):
    (tmp_path / "a.txt").write_bytes(TEXT.encode())
    records = _local(tmp_path / "a.txt", sample_by="paragraph")
    assert [r["text"] for r in records] == ["def f(x):\n    return x", "class A:\n    pass", "# the end"]
    assert records[1]["key"] == '{"text": "class A:\\n    pass"}#1'  # as a line's: the text, then its place


def test_a_line_records_key_is_the_rows_as_before(tmp_path):
    long = "é" * 300
    (tmp_path / "a.txt").write_text(f'short\n{long}\n"quoted"\n')
    records = _local(tmp_path / "a.txt")
    rows = [{"text": t} for t in ("short", long, '"quoted"')]
    assert records == list(keyed(rows, {}))


def test_sample_by_is_checked_in_one_line(tmp_path):
    (tmp_path / "a.txt").write_text("x\n")
    (tmp_path / "d.jsonl").write_text('{"text": "x"}\n')
    for path, value, said in [
        (tmp_path / "a.txt", "sentence", "choose one of line, paragraph, document"),
        (tmp_path / "d.jsonl", "document", "only .txt files are read by document"),
    ]:
        with pytest.raises(DataError) as caught:
            _local(path, sample_by=value)
        assert f"data.source_args.sample_by={value}" in str(caught.value) and said in str(caught.value)
        assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("n", "size", "world", "rank"), [(1000, 7, 1, 0), (1001, 8, 3, 2), (5, 2, 2, 1)])
def test_the_order_is_a_shuffled_lists_held_in_four_bytes_an_index(n, size, world, rank):
    sampler = ShuffledBatchSampler(n, size, seed=3, world=world, rank=rank)
    order = list(range(n))
    random.Random(_mix(3, 0)).shuffle(order)
    mine = order[: n // world * world][rank::world]
    assert list(sampler) == [mine[i : i + size] for i in range(0, len(mine) - size + 1, size)]
    assert sampler.shard(n, random.Random(0)).itemsize == 4 and len(sampler) == len(mine) // size
    sampler.resume(1, 2)
    assert list(sampler) == list(ShuffledBatchSampler(n, size, seed=3, world=world, rank=rank).epoch_batches(1))[2:]


@pytest.mark.parametrize("end", [None, 7])
def test_joined_ids_are_the_rows_one_after_the_other(end):
    rows = [[3, 4], [], [65535, 1, 2], [9]]
    ids, lengths = joined(rows, end)
    tail = [] if end is None else [end]
    assert ids.tolist() == [i for row in rows for i in row + tail]
    assert lengths.tolist() == [len(row) + len(tail) for row in rows]
    assert joined([], end)[0].tolist() == []


def test_a_tokenizers_sample_of_a_large_txt_corpus_reads_seeded_windows_of_whole_lines(tmp_path, monkeypatch):
    from tasks.data import LMDataModule

    monkeypatch.setattr(text_files, "WINDOW_BYTES", 64)
    lines = [f"line {i} " + "x" * (i % 13) for i in range(3000)]
    for part in range(3):
        (tmp_path / f"part{part}.txt").write_text("\r\n".join(lines[part::3]) + "\r\n")
    dm = LMDataModule(source="local", source_args={"path": str(tmp_path)}, cache_dir=str(tmp_path / "cache"))
    corpus = dm.corpus()
    corpus.records_of = lambda: pytest.fail("the sample read the records")  # windows only
    budget = corpus.size // 5
    sample = list(corpus.sample(budget, seed=4))
    assert sample == list(corpus.sample(budget, seed=4)) != list(corpus.sample(budget, seed=5))
    assert set(sample) <= set(lines) and len(set(sample)) == len(sample)  # whole lines, each once
    taken = sum(len(t) for t in sample)
    assert budget / 2 < taken <= budget
