"""The ``local`` source: the user's files, a file or a folder of one format (tasks/data/formats/: .txt by
zoo, line by line; .csv, .json/.jsonl and .parquet through HF ``datasets``), read one record at a time.
Every mistake in the data is a DataError that names the file and the fix; a full disk is not the data's
fault and is raised as it is."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from tasks.data.formats import FileFormat, data_types, format_of
from tasks.data.sources.base import SOURCES, Source, renamed
from tasks.errors import DataError


@SOURCES.register("local")
class Local(Source):
    """Records from a local file or folder of one format: .txt (a record per line, paragraph or whole
    file: ``sample_by``), .csv, .json/.jsonl or .parquet (one per row). Hidden files and folders
    (.DS_Store, .git/) are skipped; any other file must be data. ``fields`` renames columns, e.g.
    ``text="sentence", label="category"``; txt files give ``text``."""

    streams = True
    renames = True

    def __init__(self, path: str | Path, sample_by: str = "line", **fields: str) -> None:
        self.path, self.sample_by, self.fields = path, sample_by, fields

    def records(self) -> Iterator[dict[str, Any]]:
        """The records one at a time, in bounded memory: .txt files as they are read, the others row by
        row from HF ``datasets``' memory-mapped Arrow cache. The files are checked before the first
        record; the data as it is read."""
        root = Path(self.path).expanduser()
        files, fmt = data_files(root, f"data.source_args.path={self.path}")
        fmt.check_sample_by(self.sample_by, self.path)
        for file in files:
            fmt.check_head(file)
        origin = str(files[0]) if len(files) == 1 else f"the {len(files)} {fmt.name()} files of {self.path}"
        return renamed(fmt.rows(files, root, self.sample_by), self.fields, origin)

    def listed(self) -> list[dict[str, Any]]:
        records = list(self.records())
        if not records:
            raise DataError(f"data.source_args.path={self.path}: no records in it; point it at your data")
        return records

    def identity(self) -> list[tuple[str, int, int]]:
        """(file, size, modification time in ns) of each data file it reads."""
        files, _ = data_files(Path(self.path).expanduser(), f"data.source_args.path={self.path}")
        return [(str(f.resolve()), (info := f.stat()).st_size, info.st_mtime_ns) for f in files]

    def size(self) -> tuple[int, int]:
        files = self.identity()
        return len(files), sum(size for _, size, _ in files)

    def windows(self) -> Callable[[float, int], Iterator[str]] | None:
        """Where its format reads parts of a file alone (.txt): seeded WINDOW_BYTES windows of its files."""
        files, fmt = data_files(Path(self.path).expanduser(), f"data.source_args.path={self.path}")
        return fmt.windows(files, self.sample_by)


def data_files(path: Path, shown: str) -> tuple[list[Path], type[FileFormat]]:
    """The non-empty data files at ``path`` (a file or a folder), all of one format, and that format."""
    if not path.exists():
        raise DataError(
            f"{shown}: no such file or folder; point it at your data (a file or a folder of {data_types()} files)"
        )
    if not path.is_file() and not path.is_dir():
        raise DataError(f"{shown}: not a regular file or folder; point it at your data")
    files = [path] if path.is_file() else visible_files(path)
    unknown = [f for f in files if format_of(f) is None]
    if unknown and path.is_file():
        raise DataError(
            f"{shown}: {path.suffix or 'a file without a suffix'} is not a data type zoo reads "
            f"({data_types()}); convert it to one of them"
        )
    if unknown:
        what = "is not a data file" if len(unknown) == 1 else "are not data files"
        raise DataError(
            f"{shown}: {_some(str(f.relative_to(path)) for f in unknown)} in the folder {what} "
            f"({data_types()}); move them out or point path at one file"
        )
    if not files:
        raise DataError(f"{shown}: the folder holds no data files ({data_types()}); point it at your data")
    files = [f for f in files if f.stat().st_size > 0]
    if not files:
        what = "the file is empty" if path.is_file() else "every data file in the folder is empty"
        raise DataError(f"{shown}: {what}; point it at your data")
    kinds: dict[type[FileFormat], list[str]] = {}
    for f in files:
        kinds.setdefault(format_of(f), []).append(f.suffix.lower())
    if len(kinds) > 1:
        mix = ", ".join(f"{len(s)} {'/'.join(sorted(set(s)))}" for s in kinds.values())
        raise DataError(
            f"{shown}: the folder mixes file types ({mix}); zoo reads one type per source: point "
            f"path at a folder (or a file) of one type"
        )
    return files, next(iter(kinds))


def visible_files(folder: Path) -> list[Path]:
    """Files under ``folder`` in sorted order, without hidden files and folders (.DS_Store, .git/)."""

    def refuse(error: OSError) -> None:
        raise DataError(
            f"{error.filename}: cannot read this folder ({error.strerror}); fix its permissions or "
            f"point data.source_args.path elsewhere"
        )

    files = []
    for root, dirs, names in os.walk(folder, onerror=refuse):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        files += [Path(root, name) for name in names if not name.startswith(".")]
    return sorted(f for f in files if f.is_file())


def _some(names: Iterable[str], shown: int = 5) -> str:
    names = list(names)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
