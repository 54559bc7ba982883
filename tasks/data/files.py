"""Reading the user's data: local files (.txt by zoo, line by line; .csv, .json/.jsonl and .parquet through
HF ``datasets``) and hub datasets. Every mistake in the data is a DataError that names the file and the fix;
a full disk is not the data's fault and is raised as it is."""

from __future__ import annotations

import codecs
import errno
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tasks.data.text_files import SAMPLES_BY, decode, decoded, open_data, row_text, text_records, windows
from tasks.errors import DataError

# ---- local files ---------------------------------------------------------------------------------
READERS = {".txt": "text", ".csv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
"""Data file suffix -> how it is read: .txt by zoo (line by line), the others by HF ``datasets``."""
DATA_TYPES = ", ".join(READERS)
HEAD_BYTES = 1 << 13  # how much of a csv/json/parquet file is checked before HF datasets reads it
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}  # writing HF datasets' cache failed


def local_records(path: str | Path, sample_by: str = "line", **fields: str) -> list[dict[str, Any]]:
    """Records from a local file or folder of one type: .txt (a record per line, paragraph or whole
    file: ``sample_by``), .csv, .json/.jsonl or .parquet (one per row, through HF ``datasets``).
    Hidden files and folders (.DS_Store, .git/) are skipped; any other file must be data. Bad data
    raises a DataError naming the file.

    ``fields`` renames columns, e.g. ``text="sentence", label="category"``; txt files give ``text``.
    """
    records = list(iter_local_records(path, sample_by, **fields))
    if not records:
        raise DataError(f"data.source_args.path={path}: no records in it; point it at your data")
    return records


def iter_local_records(path: str | Path, sample_by: str = "line", **fields: str) -> Iterator[dict[str, Any]]:
    """The records of :func:`local_records` one at a time, in bounded memory: .txt files as they are
    read, the others row by row from HF ``datasets``' memory-mapped Arrow cache. The files are checked
    before the first record; the data as it is read."""
    shown = f"data.source_args.path={path}"
    files = _data_files(Path(path).expanduser(), shown)
    reader = READERS[files[0].suffix.lower()]
    if sample_by not in SAMPLES_BY:
        raise DataError(
            f"data.source_args.sample_by={sample_by}: not a way to read .txt files; choose one of "
            f"{', '.join(SAMPLES_BY)}"
        )
    if sample_by != "line" and reader != "text":
        raise DataError(
            f"data.source_args.sample_by={sample_by}: only .txt files are read by {sample_by}, and "
            f"{path} holds {reader} files (a record per row); remove data.source_args.sample_by"
        )
    for file in files if reader != "text" else ():  # zoo checks .txt files as it reads them
        _check_head(file, reader)
    origin = str(files[0]) if len(files) == 1 else f"the {len(files)} {reader} files of {path}"
    if reader == "text":
        records = text_records(files, Path(path).expanduser(), sample_by)
        return _iter_records(records, ["text"], fields, origin, keyed=True)
    dataset = _read_with_datasets(reader, files)
    return _iter_records(dataset, dataset.column_names, fields, origin)


def text_windows(path: str | Path, sample_by: str = "line", **_: Any) -> Callable[[float, int], Iterator[str]] | None:
    """For .txt files at ``path``: a function (share, seed) -> the texts of a seeded ``share`` of their
    WINDOW_BYTES windows, read alone (a tokenizer's sample of a corpus larger than it, without reading
    the rest); None for other files."""
    files = _data_files(Path(path).expanduser(), f"data.source_args.path={path}")
    if READERS[files[0].suffix.lower()] != "text":
        return None
    return lambda share, seed: windows(files, sample_by, share, seed)


def local_extent(path: str | Path) -> tuple[int, int]:
    """How many data files are at ``path``, and their bytes."""
    files = local_identity(path)
    return len(files), sum(size for _, size, _ in files)


def local_identity(path: str | Path) -> list[tuple[str, int, int]]:
    """What says whether the data at ``path`` changed, without reading it: (file, size, modification
    time in ns) of each data file :func:`iter_local_records` reads."""
    files = _data_files(Path(path).expanduser(), f"data.source_args.path={path}")
    return [(str(f.resolve()), (info := f.stat()).st_size, info.st_mtime_ns) for f in files]


def _data_files(path: Path, shown: str) -> list[Path]:
    """The non-empty data files at ``path`` (a file or a folder), all of one reader."""
    if not path.exists():
        raise DataError(
            f"{shown}: no such file or folder; point it at your data (a file or a folder of {DATA_TYPES} files)"
        )
    if not path.is_file() and not path.is_dir():
        raise DataError(f"{shown}: not a regular file or folder; point it at your data")
    files = [path] if path.is_file() else _visible_files(path)
    unknown = [f for f in files if f.suffix.lower() not in READERS]
    if unknown and path.is_file():
        raise DataError(
            f"{shown}: {path.suffix or 'a file without a suffix'} is not a data type zoo reads "
            f"({DATA_TYPES}); convert it to one of them"
        )
    if unknown:
        what = "is not a data file" if len(unknown) == 1 else "are not data files"
        raise DataError(
            f"{shown}: {_some(str(f.relative_to(path)) for f in unknown)} in the folder {what} "
            f"({DATA_TYPES}); move them out or point path at one file"
        )
    if not files:
        raise DataError(f"{shown}: the folder holds no data files ({DATA_TYPES}); point it at your data")
    files = [f for f in files if f.stat().st_size > 0]
    if not files:
        what = "the file is empty" if path.is_file() else "every data file in the folder is empty"
        raise DataError(f"{shown}: {what}; point it at your data")
    kinds: dict[str, list[str]] = {}
    for f in files:
        kinds.setdefault(READERS[f.suffix.lower()], []).append(f.suffix.lower())
    if len(kinds) > 1:
        mix = ", ".join(f"{len(s)} {'/'.join(sorted(set(s)))}" for s in kinds.values())
        raise DataError(
            f"{shown}: the folder mixes file types ({mix}); zoo reads one type per source: point "
            f"path at a folder (or a file) of one type"
        )
    return files


def _visible_files(folder: Path) -> list[Path]:
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


def _check_head(file: Path, reader: str) -> None:
    """Refuse a file that is plainly not of its type: binary or non-UTF-8 text, or parquet without PAR1."""
    with open_data(file) as f:
        head = f.read(HEAD_BYTES)
    if reader == "parquet":
        if not head.startswith(b"PAR1"):
            raise DataError(f"{file}: not a parquet file (it does not start with PAR1); convert it or rename it")
        return
    decode(file, codecs.getincrementaldecoder("utf-8")(), head, 0, final=len(head) < HEAD_BYTES)


def _read_with_datasets(reader: str, files: list[Path]) -> Any:
    """``files`` as one HF ``datasets`` Dataset; when they cannot be read, a DataError naming the file
    (and for JSON the line) at fault."""
    try:
        return _load_quietly(reader, files)
    except Exception as error:
        if _disk_error(error):
            raise
        for file in files:
            _diagnose(reader, file, alone=len(files) > 1)
        where = files[0] if len(files) == 1 else f"the {reader} files of {files[0].parent}"
        raise DataError(
            f"{where}: HF datasets cannot read {'it' if len(files) == 1 else 'them together'} "
            f"({_cause(error)}); fix the data or point data.source_args.path at other files"
        ) from error


def _load_quietly(reader: str, files: list[Path]) -> Any:
    """load_dataset without its progress bars and error logs (a failure is reported in one line)."""
    import datasets

    verbosity, bars = datasets.logging.get_verbosity(), datasets.is_progress_bar_enabled()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(reader, data_files=[str(f) for f in files], split="train")
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()


def _diagnose(reader: str, file: Path, *, alone: bool) -> None:
    """Raise a DataError naming what is wrong with ``file``, if this finds it: not UTF-8, a JSON line
    that does not parse, or (``alone``) a file HF datasets cannot read by itself."""
    if reader in ("csv", "json"):
        for _ in decoded(file):
            pass
    if reader == "json":
        _check_json(file)
    if alone:
        try:
            _load_quietly(reader, [file])
        except Exception as error:
            if _disk_error(error):
                raise
            raise DataError(
                f"{file}: HF datasets cannot read it ({_cause(error)}); fix the file or move it out"
            ) from error


def _check_json(file: Path) -> None:
    """A DataError at the first line of a JSON Lines file that is not a JSON object (a .json file may
    also be one JSON document)."""
    if file.suffix.lower() == ".json":
        try:
            json.loads(file.read_text(encoding="utf-8"))
            return
        except json.JSONDecodeError as error:
            if not error.msg.startswith("Extra data"):  # more than one document: JSON Lines
                raise DataError(f"{file} line {error.lineno}: not valid JSON ({error.msg}); fix it") from None
    with file.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(
                    f"{file} line {number}: not valid JSON ({error.msg}); fix or remove the line "
                    f"(JSON Lines: one object per line)"
                ) from None
            if not isinstance(value, dict):
                raise DataError(
                    f"{file} line {number}: a JSON {type(value).__name__}, not an object; write one "
                    f'object per line, e.g. {{"text": "..."}}'
                )


def _cause(error: BaseException) -> str:
    """The first line of the error under HF datasets' wrapper, e.g. pandas' or pyarrow's."""
    chain = [error]
    while (nxt := chain[-1].__cause__ or chain[-1].__context__) is not None and len(chain) < 10:
        chain.append(nxt)
    inner = next((e for e in chain if not type(e).__module__.startswith("datasets")), error)
    lines = str(inner).strip().splitlines() or [type(inner).__name__]
    return lines[0][:300]


def _disk_error(error: BaseException) -> bool:
    """Whether writing the datasets cache failed (the verb reports a full disk itself)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in DISK_ERRNOS:
            return True
        error = error.__cause__ or error.__context__
    return False


def _records(
    rows: Iterable[dict[str, Any]], columns: Sequence[str], fields: dict[str, str], origin: str
) -> list[dict[str, Any]]:
    return list(_iter_records(rows, columns, fields, origin))


def _iter_records(
    rows: Iterable[dict[str, Any]],
    columns: Sequence[str],
    fields: dict[str, str],
    origin: str,
    *,
    keyed: bool = False,
) -> Iterator[dict[str, Any]]:
    """Records {key, ...}: the rows with ``fields`` renamed (ours=theirs), or whole when none are given.
    The renames are checked before the first row is read. ``keyed``: the rows are records already
    (.txt files'), whose key (and group) a rename keeps."""
    for ours, theirs in fields.items():
        if theirs not in columns:
            raise DataError(
                f"data.source_args.{ours}={theirs}: no column {theirs!r} in {origin} (columns: "
                f"{', '.join(map(str, columns))}); set data.source_args.{ours}=<one of them>"
            )
    if keyed and not fields:
        return iter(rows)
    if keyed:
        kept = ("key", "group")
        return (
            ({ours: r[theirs] for ours, theirs in fields.items()} | {k: r[k] for k in kept if k in r}) for r in rows
        )
    return _renamed(rows, fields)


def _renamed(rows: Iterable[dict[str, Any]], fields: dict[str, str]) -> Iterator[dict[str, Any]]:
    for i, row in enumerate(rows):
        record = {ours: row[theirs] for ours, theirs in fields.items()} if fields else dict(row)
        if "key" not in record:
            record["key"] = row_text(row)[:200] + f"#{i}"
        yield record


# ---- the hub -----------------------------------------------------------------------------------
def hub_records(
    name: str, split: str = "train", subset: str | None = None, streaming: bool = False, **fields: str
) -> list[dict[str, Any]]:
    """Records of a dataset on the Hugging Face hub (needs network access the first time), or of a local
    folder of data files that ``datasets.load_dataset`` reads the same way."""
    return list(iter_hub_records(name, split, subset, streaming, **fields))


def iter_hub_records(
    name: str, split: str = "train", subset: str | None = None, streaming: bool = False, **fields: str
) -> Iterator[dict[str, Any]]:
    """The records of :func:`hub_records` one at a time; ``streaming``: read shard by shard as they
    are iterated (``load_dataset(streaming=True)``), never converted or held whole."""
    dataset = _load_hub(name, split, subset, streaming)
    columns = dataset.column_names
    if columns is None:  # a stream whose files do not say their columns: the first row does
        rows = iter(dataset)
        first = next(rows, None)
        columns = list(first) if first is not None else []
        dataset = itertools.chain([first] if first is not None else [], rows)
    return _iter_records(dataset, columns, fields, f"hub dataset {name!r}")


def hub_identity(
    name: str, split: str = "train", subset: str | None = None, streaming: bool = False, **fields: str
) -> Any:
    """What changes when the dataset does: a local folder's files (path, size, modification time); a
    dataset of the hub cache, its cached files' fingerprint (``Dataset._fingerprint``); None for a
    stream from the hub, whose records are then hashed as they are read."""
    if Path(name).expanduser().is_dir():
        return [name, split, subset, fields, _folder_identity(Path(name).expanduser())]
    if streaming:
        return None
    return [name, split, subset, fields, _load_hub(name, split, subset, False)._fingerprint]


def hub_extent(name: str, **_: Any) -> tuple[int, int] | None:
    """How many data files a local folder holds, and their bytes; None for a dataset of the hub."""
    folder = Path(name).expanduser()
    if not folder.is_dir():
        return None
    files = _visible_files(folder)
    return len(files), sum(f.stat().st_size for f in files)


def _folder_identity(folder: Path) -> list[tuple[str, int, int]]:
    files = _visible_files(folder)
    return [(str(f.relative_to(folder)), (info := f.stat()).st_size, info.st_mtime_ns) for f in files]


def _load_hub(name: str, split: str, subset: str | None, streaming: bool) -> Any:
    from datasets import load_dataset

    try:
        return load_dataset(name, subset, split=split, streaming=bool(streaming))
    except Exception as error:
        if _disk_error(error):
            raise
        raise DataError(
            f"data.source_args.name={name}: the hub dataset cannot be loaded ({_cause(error)}); check "
            f"name, subset and split, and that this machine is online (or has it cached)"
        ) from error
