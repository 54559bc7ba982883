"""What a file format is (:class:`FileFormat`) and the registry of them (:data:`FORMATS`): the suffixes
it reads, the ways it cuts a file into records (``data.source_args.sample_by``), a look at a file's head
that refuses one plainly not of the format, and its rows. The formats read through HF ``datasets``
share ``DatasetsFormat`` (hf_datasets.py). Add a format with one module and ``@FORMATS.register(name)``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import zoo
from tasks.errors import DataError


@dataclass(frozen=True)
class Rows:
    """A format's rows of some files: ``rows`` (read as they are iterated), the ``columns`` each has, and
    whether they are ``keyed`` records already (a key, and a group where a file is one)."""

    rows: Iterable[dict[str, Any]]
    columns: list[str]
    keyed: bool = False


class FileFormat(ABC):
    """A data file format: the ``suffixes`` it reads, the ways it cuts a file into records
    (``samples_by``, the choices of ``data.source_args.sample_by``; the first is the default), what it
    checks of a file before reading it (``check_head``), its rows, and where it can, seeded windows of
    its files read alone (a tokenizer's sample of a corpus larger than it)."""

    suffixes: ClassVar[tuple[str, ...]]
    samples_by: ClassVar[tuple[str, ...]] = ("line",)
    unit: ClassVar[str] = "a record per row"  # what one record is, for the error of a sample_by it lacks

    @classmethod
    def check_head(cls, file: Path) -> None:
        """A DataError naming ``file`` when it is plainly not of this format (read before the rest); by
        default none, for a format that checks its files as it reads them."""
        return None

    @classmethod
    @abstractmethod
    def rows(cls, files: list[Path], root: Path, sample_by: str) -> Rows:
        """The rows of ``files`` (all of this format; ``root``: the path they were found at)."""

    @classmethod
    def windows(cls, files: list[Path], sample_by: str) -> Callable[[float, int], Iterator[str]] | None:
        """A function (share, seed) -> the texts of a seeded ``share`` of the files' windows, read alone;
        None where the format cannot read parts of a file alone."""
        return None

    @classmethod
    def check_sample_by(cls, sample_by: str, path: str | Path) -> None:
        """A DataError naming ``data.source_args.sample_by`` unless this format cuts files that way."""
        if sample_by in cls.samples_by:
            return
        takers = [FORMATS.get(name) for name in FORMATS.names() if sample_by in FORMATS.get(name).samples_by]
        if not takers:
            cutting = [FORMATS.get(name) for name in FORMATS.names() if len(FORMATS.get(name).samples_by) > 1]
            choices = dict.fromkeys(way for f in cutting for way in f.samples_by)
            raise DataError(
                f"data.source_args.sample_by={sample_by}: not a way to read {_suffixes(cutting)} files; "
                f"choose one of {', '.join(choices)}"
            )
        raise DataError(
            f"data.source_args.sample_by={sample_by}: only {_suffixes(takers)} files are read by {sample_by}, "
            f"and {path} holds {cls.name()} files ({cls.unit}); remove data.source_args.sample_by"
        )

    @classmethod
    def name(cls) -> str:
        """The name the format is registered under."""
        return next(name for name in FORMATS.names() if FORMATS.get(name) is cls)


FORMATS: zoo.Registry[type[FileFormat]] = zoo.Registry("file format")
"""File formats by name (text, csv, json, parquet); register yours with ``@FORMATS.register(name)``."""
FORMATS.bind(FileFormat)


def format_of(file: Path) -> type[FileFormat] | None:
    """The format that reads ``file`` by its suffix (any case), or None."""
    suffix = file.suffix.lower()
    return next((f for f in map(FORMATS.get, FORMATS.names()) if suffix in f.suffixes), None)


def data_types() -> str:
    """The suffixes of every format, for an error that lists what zoo reads."""
    return _suffixes([FORMATS.get(name) for name in FORMATS.names()])


def _suffixes(formats: Iterable[type[FileFormat]]) -> str:
    return ", ".join(s for f in formats for s in f.suffixes)
