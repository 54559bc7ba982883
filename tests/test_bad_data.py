"""Bad data ends in one DataError that names the file (and line, column or field) and the fix:
missing paths, empty folders and files, binary and non-UTF-8 files, malformed JSON Lines, missing
columns, mixed or unknown file types, unknown sources and arguments, bad tokenizer files. Long
lines are cut into bounded records; hidden files are skipped; Ctrl-C still stops a load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tasks.data.formats.text as text_files
import tasks.data.formats.utf8 as utf8
from tasks.data.sources import load_records
from tasks.data.tokenizers import load_or_train, train_tokenizer
from tasks.errors import DataError


def _local(path: Path, **fields: str) -> list[dict]:
    return load_records("local", path=str(path), **fields)


def _refused(path: Path, **fields: str) -> str:
    """The one-line message of the DataError that loading ``path`` raises."""
    with pytest.raises(DataError) as caught:
        _local(path, **fields)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_missing_path_names_the_field(tmp_path):
    message = _refused(tmp_path / "nope")
    assert message.startswith(f"data.source_args.path={tmp_path / 'nope'}: ") and "no such file" in message


def test_empty_folders_and_files_are_refused_and_empty_files_in_a_folder_skipped(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / ".DS_Store").write_bytes(b"\x00\x01")  # hidden files do not count as data
    assert "holds no data files" in _refused(tmp_path / "d")
    (tmp_path / "d" / "a.txt").write_text("")
    assert "every data file in the folder is empty" in _refused(tmp_path / "d")
    assert "empty" in _refused(tmp_path / "d" / "a.txt")
    (tmp_path / "d" / "b.txt").write_text("one\ntwo\n")
    assert [r["text"] for r in _local(tmp_path / "d")] == ["one", "two"]


def test_binary_and_non_utf8_files_are_named_with_the_byte(tmp_path):
    (tmp_path / "bin.txt").write_bytes(b"GIF89a\x00\x00\x01")
    message = _refused(tmp_path / "bin.txt")
    assert str(tmp_path / "bin.txt") in message and "binary" in message and "byte 6" in message
    (tmp_path / "latin.txt").write_bytes(b"ok\ncaf\xe9\n")
    message = _refused(tmp_path / "latin.txt")
    assert str(tmp_path / "latin.txt") in message and "byte 6" in message and "UTF-8" in message
    big = tmp_path / "late.csv"  # the bad byte lies past the head that is checked before HF datasets reads it
    big.write_bytes(b"text\n" + b"hello\n" * 20_000 + b"caf\xe9\n")
    assert f"{big}: byte {5 + 6 * 20_000 + 3} (0xe9)" in _refused(big)


def test_malformed_json_lines_name_the_file_and_line(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "fine"}\n')
    (tmp_path / "b.jsonl").write_text('{"text": "fine"}\n\n{"text": "broken"\n{"text": "x"}\n')
    assert _refused(tmp_path).startswith(f"{tmp_path / 'b.jsonl'} line 3: not valid JSON")
    (tmp_path / "b.jsonl").write_text('{"text": "fine"}\n["a", "list"]\n')
    assert _refused(tmp_path).startswith(f"{tmp_path / 'b.jsonl'} line 2: a JSON list")
    (tmp_path / "b.jsonl").write_text('{"text": "fine"}\n')
    assert [r["text"] for r in _local(tmp_path)] == ["fine", "fine"]


def test_a_missing_column_names_the_one_wanted_the_ones_found_and_the_override(tmp_path):
    csv = tmp_path / "a.csv"
    csv.write_text("sentence,category\nhello there,greeting\n")
    message = _refused(csv, text="text")
    assert message.startswith("data.source_args.text=text: ") and "sentence, category" in message
    with pytest.raises(
        DataError,
        match=r"no field 'text' \(they have: category, sentence\); map a column to it "
        r"with data.source_args.text=<column>",
    ):
        load_records("local", path=str(csv), needs=("text",))
    assert load_records("local", path=str(csv), text="sentence", needs=("text",))[0]["text"] == "hello there"
    with pytest.raises(DataError, match=r"data.source=numbers: .* no field 'text'"):
        load_records("numbers", n=5, needs=("text",))


def test_translation_columns_named_source_and_target_can_be_mapped(tmp_path):
    (tmp_path / "pairs.jsonl").write_text('{"en": "one", "de": "eins"}\n')
    records = load_records("local", path=str(tmp_path / "pairs.jsonl"), source="en", target="de")
    assert (records[0]["source"], records[0]["target"]) == ("one", "eins")


def test_a_50_mb_line_becomes_bounded_records_that_join_back(tmp_path):
    text = "lorem ipsum dolor sit amet " * (50 * 2**20 // 27)  # ~50 MB and not one line break
    (tmp_path / "one_line.txt").write_text(text)
    pieces = [r["text"] for r in _local(tmp_path / "one_line.txt")]
    assert len(pieces) >= 50 and max(map(len, pieces)) <= text_files.MAX_RECORD_CHARS
    assert "".join(pieces) == text


def test_lines_split_like_before_and_long_ones_are_cut_after_a_space(tmp_path, monkeypatch):
    monkeypatch.setattr(text_files, "MAX_RECORD_CHARS", 16)
    monkeypatch.setattr(utf8, "CHUNK_BYTES", 5)  # line breaks and characters across chunk borders
    long = "wörd " * 10
    (tmp_path / "a.txt").write_bytes(f"first\r\n\r\nsecond\rthird\n{long}\nlast".encode())
    records = _local(tmp_path / "a.txt")
    texts = [r["text"] for r in records]
    assert texts[:4] == ["first", "", "second", "third"] and texts[-1] == "last"
    pieces = texts[4:-1]
    assert "".join(pieces) == long and all(len(p) <= 16 and p.endswith(" ") for p in pieces)
    assert [r["key"] for r in records] == [json.dumps({"text": t})[:200] + f"#{i}" for i, t in enumerate(texts)]


def test_hidden_files_and_folders_are_skipped(tmp_path):
    (tmp_path / ".git" / "objects").mkdir(parents=True)
    (tmp_path / ".git" / "objects" / "ab").write_bytes(b"\x78\x9c\x00binary")
    (tmp_path / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("from b\n")
    (tmp_path / "a.txt").write_text("from a\n")
    assert [r["text"] for r in _local(tmp_path)] == ["from a", "from b"]


def test_parquet_is_read_as_parquet_and_a_mix_of_types_is_refused(tmp_path):
    import pandas as pd

    pd.DataFrame({"text": ["p1", "p2"], "label": ["x", "y"]}).to_parquet(tmp_path / "a.parquet")
    (tmp_path / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    assert [(r["text"], r["label"]) for r in _local(tmp_path)] == [("p1", "x"), ("p2", "y")]
    (tmp_path / "b.txt").write_text("plain text\n")
    message = _refused(tmp_path)
    assert "mixes file types" in message and ".parquet" in message and ".txt" in message
    (tmp_path / "b.txt").unlink()
    (tmp_path / "c.parquet").write_text("not parquet")
    assert _refused(tmp_path).startswith(f"{tmp_path / 'c.parquet'}: not a parquet file")


def test_unsupported_file_types_are_named(tmp_path):
    (tmp_path / "a.txt").write_text("data\n")
    (tmp_path / "notes.md").write_text("# notes\n")
    assert "notes.md" in _refused(tmp_path)
    (tmp_path / "paper.pdf").write_bytes(b"%PDF-1.4")
    assert ".pdf" in _refused(tmp_path / "paper.pdf")


def test_errors_of_hf_datasets_name_the_file_but_ctrl_c_still_stops(tmp_path, monkeypatch):
    import datasets

    (tmp_path / "a.csv").write_text("text\nfine\n")
    (tmp_path / "b.csv").write_text("text,n\n1,2\n3,4,5\n")
    message = _refused(tmp_path)
    assert message.startswith(f"{tmp_path / 'b.csv'}: ") and "line 3" in message

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(datasets, "load_dataset", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _local(tmp_path / "a.csv")


def test_unknown_sources_and_arguments_name_the_field_and_the_choices(tmp_path):
    with pytest.raises(DataError, match=r"^data.source=locl: .*did you mean 'local'"):
        load_records("locl", path=str(tmp_path))
    with pytest.raises(DataError, match=r"^data.source_args.n_files=3: .* it takes max_files"):
        load_records("stdlib_code", n_files=3)
    with pytest.raises(DataError, match=r"^data.source_args.path is missing"):
        load_records("local")
    with pytest.raises(DataError, match=r"^data.source_args.locale_dir="):
        load_records("gettext", locale_dir=str(tmp_path))


def test_bad_tokenizer_files_name_data_tokenizer_path(tmp_path):
    from tokenizers import Tokenizer, models

    with pytest.raises(DataError, match=r"^data.tokenizer_path=.*: no such file"):
        load_or_train(tmp_path / "nope.json", [], "bpe", 0)
    (tmp_path / "notes.txt").write_text("not a tokenizer")
    with pytest.raises(DataError, match=r"^data.tokenizer_path=.*: not a tokenizer file"):
        load_or_train(tmp_path / "notes.txt", [], "bpe", 0)
    Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token="a")).save(str(tmp_path / "t.json"))
    with pytest.raises(DataError, match=r"^data.tokenizer_path=.*special tokens"):
        load_or_train(tmp_path / "t.json", [], "bpe", 0)
    with pytest.raises(DataError, match=r"^data.tokenizer_kind=sentencepiece"):
        train_tokenizer(["a b"], "sentencepiece", 50)


@pytest.mark.slow
def test_zoo_train_on_a_missing_path_ends_in_one_line(tmp_path):
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-m", "tasks.cli.train", "data=local_text", f"data.source_args.path={tmp_path / 'missing'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("zoo: ")]
    assert len(errors) == 1 and errors[0].startswith(f"zoo: DataError: data.source_args.path={tmp_path / 'missing'}: ")
