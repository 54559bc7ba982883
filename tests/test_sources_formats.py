"""Data sources and file formats are registered classes: a new one is one class and a registration, and
then reads through the same paths as the built-ins (``load_records``, ``stream_records``, the argument
checks); every suffix belongs to one format, and a registry takes only its base's subclasses."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tasks.data.formats import FORMATS, FileFormat, Rows, format_of
from tasks.data.sources import SOURCES, Source, load_records, source_identity, stream_records
from tasks.errors import DataError


def test_each_suffix_is_read_by_one_format():
    suffixes = [s for name in FORMATS.names() for s in FORMATS.get(name).suffixes]
    assert len(suffixes) == len(set(suffixes))
    for name in FORMATS.names():
        for suffix in FORMATS.get(name).suffixes:
            assert format_of(Path(f"data{suffix.upper()}")) is FORMATS.get(name)
    assert format_of(Path("notes.md")) is None


def test_a_registry_takes_only_its_base():
    with pytest.raises(TypeError, match="not a subclass"):
        SOURCES.register("not_a_source")(dict)
    with pytest.raises(TypeError, match="not a subclass"):
        FORMATS.register("not_a_format")(dict)


@pytest.fixture
def pipes_format():
    """A format of its own: .pipes files, each line ``text|label``."""

    class Pipes(FileFormat):
        suffixes = (".pipes",)

        @classmethod
        def rows(cls, files: list[Path], root: Path, sample_by: str) -> Rows:
            rows = (
                dict(zip(("text", "label"), line.split("|"), strict=True))
                for f in files
                for line in f.read_text().splitlines()
            )
            return Rows(rows, ["text", "label"])

    FORMATS.register("pipes")(Pipes)
    yield Pipes
    FORMATS.unregister("pipes")


def test_a_new_format_is_read_by_the_local_source(tmp_path, pipes_format):
    (tmp_path / "a.pipes").write_text("one|x\ntwo|y\n")
    records = load_records("local", path=str(tmp_path / "a.pipes"), needs=("text", "label"))
    assert [(r["text"], r["label"]) for r in records] == [("one", "x"), ("two", "y")] and all(r["key"] for r in records)
    renamed = load_records("local", path=str(tmp_path / "a.pipes"), needs=("text",), text="label")
    assert [r["text"] for r in renamed] == ["x", "y"]
    with pytest.raises(DataError, match="only .txt files are read by paragraph, and .* holds pipes files"):
        load_records("local", path=str(tmp_path / "a.pipes"), sample_by="paragraph")
    (tmp_path / "b.txt").write_text("three\n")
    with pytest.raises(DataError, match=r"mixes file types \(1 .pipes, 1 .txt\)"):
        load_records("local", path=str(tmp_path))


@pytest.fixture
def countdown_source():
    """A source of its own: ``n`` records counting down, read one at a time."""

    @dataclass
    class Countdown(Source):
        n: int = 3
        streams = True

        def records(self) -> Iterator[dict[str, Any]]:
            return ({"key": str(i), "text": f"{i} to go"} for i in range(self.n, 0, -1))

        def identity(self) -> Any:
            return ["countdown", self.n]

    SOURCES.register("countdown")(Countdown)
    yield Countdown
    SOURCES.unregister("countdown")


def test_a_new_source_reads_and_is_checked_like_the_others(countdown_source):
    assert [r["text"] for r in load_records("countdown", n=2)] == ["2 to go", "1 to go"]
    assert [r["key"] for r in stream_records("countdown", needs=("text",), n=3)] == ["3", "2", "1"]
    assert source_identity("countdown", {"n": 4}) == (["countdown", 4], None)
    with pytest.raises(DataError, match=r"data.source_args.n=-1 must be a whole number > 0"):
        load_records("countdown", n=-1)
    with pytest.raises(DataError, match=r"takes no argument 'nn'; it takes n \(did you mean 'n'\?\)"):
        load_records("countdown", nn=2)
    with pytest.raises(DataError, match="have no field 'label'"):
        load_records("countdown", needs=("label",))
