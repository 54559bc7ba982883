"""What a data source is (:class:`Source`), the registry of them (:data:`SOURCES`: ``data.source`` names
one, ``data.source_args`` are its arguments), and reading one: its records as a list or one at a time
(:func:`load_records`, :func:`stream_records`), checked for the fields the data module reads, what says
whether its data changed without reading it (:func:`source_identity`) and seeded windows of its files
(:func:`source_windows`). The kinds are one module each: offline.py (text on any machine with Python),
local.py (files), hub.py (HF datasets). Add a source with one module and ``@SOURCES.register(name)``."""

from __future__ import annotations

import difflib
import hashlib
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, ClassVar

import zoo
from tasks.data.formats import Rows
from tasks.data.formats.text import row_text
from tasks.errors import DataError


class Source(ABC):
    """A data source, made from ``data.source_args`` (its constructor's arguments) without reading
    anything. ``streams``: read one record at a time in bounded memory (else held as a list, read
    whole); ``renames``: besides its arguments, it takes column renames (``text=sentence``: the
    record's ``text`` is the data's ``sentence``). A streamed source says, where it can without
    reading its data, what changes when that data does (``identity``), its files and their bytes
    (``size``: what preparing it says, a progress bar's total), and how to read seeded parts of its
    files alone (``windows``: a tokenizer's sample, ``Corpus.sample``)."""

    streams: ClassVar[bool] = False
    renames: ClassVar[bool] = False

    @abstractmethod
    def records(self) -> Iterable[dict[str, Any]]:
        """Its records, {key, ...} (and ``group`` where records must share a split)."""

    def listed(self) -> list[dict[str, Any]]:
        """Its records as a list."""
        return list(self.records())

    def identity(self) -> Any:
        """What changes when its data changes, without reading it; None where it must be read to know
        (its records are then hashed as they are read)."""
        return None

    def size(self) -> tuple[int, int] | None:
        """How many files it reads and their bytes, where known without reading them."""
        return None

    def windows(self) -> Callable[[float, int], Iterator[str]] | None:
        """A function (share, seed) -> the texts of a seeded ``share`` of its files, read alone; None
        where it cannot."""
        return None


SOURCES: zoo.Registry[type[Source]] = zoo.Registry("data source")
"""``data.source`` names -> Source classes; register yours with ``@SOURCES.register(name)``."""
SOURCES.bind(Source)


def split_of(key: str, val_fraction: float, test_fraction: float) -> str:
    """A stable train/val/test assignment from a hash of ``key`` (same on every machine and run)."""
    u = int(hashlib.md5(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if u < test_fraction else "val" if u < test_fraction + val_fraction else "train"


def load_records(source: str, /, *, needs: Sequence[str] = (), **kwargs: Any) -> list[dict[str, Any]]:
    """Records of the named source; ``kwargs`` (data.source_args) are its arguments. ``needs``: the
    fields the data module reads from every record; a source without them is a DataError that says
    which override maps them."""
    cls = check_source(source, kwargs, needs=needs)
    records = cls(**kwargs).listed()
    _check_fields(records, needs, source, renames=cls.renames)
    return records


def stream_records(
    source: str,
    /,
    *,
    needs: Sequence[str] = (),
    texts: Callable[[dict[str, Any]], list[str]] | None = None,
    **kwargs: Any,
) -> Iterator[dict[str, Any]]:
    """The records of ``source`` one at a time: a streamed source (``Source.streams``) in bounded memory,
    any other from its list. Each record is checked as it passes (``needs``: the fields the data module
    reads; ``texts``: what of a record the tokenizer reads, all strings); the arguments before the first."""
    if not check_source(source, kwargs, needs=needs).streams:
        return iter(load_records(source, needs=needs, **kwargs))
    return _checked(SOURCES.get(source)(**kwargs).records(), needs, texts, source, kwargs)


def source_identity(source: str, source_args: dict[str, Any]) -> tuple[Any, tuple[int, int] | None]:
    """What changes when the data of ``source`` changes, without reading it (a local corpus' files:
    path, size, modification time; None where it must be read to know, as a list source: its records
    are then hashed as they are read), and its files and their bytes where known."""
    try:
        opened = SOURCES.get(source)(**source_args)
        return opened.identity(), opened.size()
    except TypeError:
        return None, None  # arguments the source refuses: it says so, in one line, when it is read


def source_windows(source: str, source_args: dict[str, Any]) -> Callable[[float, int], Iterator[str]] | None:
    """How to read seeded parts of the source's files alone (``Source.windows``), where it can."""
    try:
        return SOURCES.get(source)(**source_args).windows()
    except TypeError:
        return None  # arguments the source refuses: it says so, in one line, when it is read


def _checked(
    records: Iterable[dict[str, Any]],
    needs: Sequence[str],
    texts: Callable[[dict[str, Any]], list[str]] | None,
    source: str,
    source_args: dict[str, Any],
) -> Iterator[dict[str, Any]]:
    n = -1
    for n, record in enumerate(records):
        for field in needs:
            if record.get(field) is None:
                found = sorted(str(k) for k in record if k != "key")
                raise DataError(
                    f"data.source_args.path={source_args.get('path')}: record {n} (key "
                    f"{str(record.get('key'))[:80]!r}) has no field {field!r} (it has: {', '.join(found)}); "
                    f"map a column to it with data.source_args.{field}=<column>, or fill or remove the record"
                )
        if texts is not None:
            check_record_texts(n, record, texts, source, source_args)
        yield record
    if n < 0:
        raise DataError(f"data.source_args.path={source_args.get('path')}: no records in it; point it at your data")


def check_texts(
    records: list[dict[str, Any]],
    texts: Callable[[dict[str, Any]], list[str]],
    source: str,
    source_args: dict[str, Any],
) -> None:
    """A DataError at the first record whose texts (``texts(record)``: what the tokenizer reads) are not
    all strings: a number, a list or an object in a JSON Lines file."""
    for i, record in enumerate(records):
        check_record_texts(i, record, texts, source, source_args)


def check_record_texts(
    i: int,
    record: dict[str, Any],
    texts: Callable[[dict[str, Any]], list[str]],
    source: str,
    source_args: dict[str, Any],
) -> None:
    """A DataError naming the data and record ``i`` when its texts are not all strings."""
    bad = next((text for text in texts(record) if not isinstance(text, str)), None)
    if bad is None:
        return
    field = next(k for k, v in record.items() if v is bad)
    where = f"data.source_args.path={source_args['path']}" if "path" in source_args else f"data.source={source}"
    raise DataError(
        f"{where}: record {i} (key {str(record.get('key'))[:80]!r}) has {field!r} = {str(bad)[:40]} "
        f'(of type {type(bad).__name__}), not text; make every {field!r} a string (in JSON: "...") '
        f"or remove the record"
    )


RECORD_KEYS = ("key", "group")
"""Fields of a record that splitting reads besides a data module's own (``split_records``)."""


def check_source(source: str, source_args: dict[str, Any], *, needs: Sequence[str] = ()) -> type[Source]:
    """The class of data source ``source``, once ``source_args`` (data.source_args) are known to be
    arguments it takes, before it reads anything: a DataError naming the source or the key (and the
    closest name) for an unknown source, an argument it does not take, one it needs and lacks, and a
    count that is not a whole number it can use. Where the source renames columns (``local``, ``hub``:
    ``text=sentence``), a key that is neither its argument nor a field the data module reads
    (``needs``, and a record's key and group) is refused as well, before it is read as a column name
    (``sampleby=paragraph`` is a misspelt ``sample_by``, not a column); with no ``needs`` every field
    is read and any rename passes."""
    if source not in SOURCES:
        raise DataError(
            f"data.source={source}: not a data source; choose one of {', '.join(SOURCES.names())}"
            f"{_closest(source, SOURCES)}"
        )
    cls = SOURCES.get(source)
    _check_arguments(source, cls, source_args, needs)
    return cls


def _check_arguments(source: str, cls: type[Source], kwargs: dict[str, Any], needs: Sequence[str] = ()) -> None:
    params = inspect.signature(cls).parameters
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    renames = cls.renames
    fields = [*needs, *RECORD_KEYS] if renames and needs else []
    for key, value in kwargs.items():
        if key in named or (renames and (not needs or key in fields)):
            continue
        columns = f" and a column for {', '.join(fields)} (a field the data module reads)" if fields else ""
        raise DataError(
            f"data.source_args.{key}={value}: data source {source!r} takes no argument {key!r}; "
            f"it takes {', '.join(named) or 'none'}{columns}{_closest(key, [*named, *fields])}"
        )
    for key, value in kwargs.items():
        if key in named and _counts(params[key]):
            _check_count(f"data.source_args.{key}", value, least=0 if params[key].default == 0 else 1)
    for name in named:
        if params[name].default is inspect.Parameter.empty and name not in kwargs:
            raise DataError(
                f"data.source_args.{name} is missing: data source {source!r} needs it; set data.source_args.{name}=..."
            )


def _counts(param: inspect.Parameter) -> bool:
    """Whether a source's argument is a whole number (``int``, or ``int | None`` where None is a choice)."""
    return param.annotation in ("int", "int | None", int) and not isinstance(param.default, bool)


def _check_count(key: str, value: Any, *, least: int) -> None:
    """A DataError naming ``key`` unless ``value`` is a whole number at least ``least`` (None: not set)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise DataError(f"{key}={value!r} must be a whole number {'> 0' if least else '>= 0'}")


def _check_fields(records: list[dict[str, Any]], needs: Sequence[str], source: str, *, renames: bool) -> None:
    for field in needs:
        lacking = [i for i, record in enumerate(records) if record.get(field) is None]
        if not lacking:
            continue
        if len(lacking) == len(records):
            found = sorted({str(k) for record in records[:1000] for k in record} - {"key"})
            where = f"data.source_args.{field}" if renames else f"data.source={source}"
            fix = (
                f"map a column to it with data.source_args.{field}=<column>"
                if renames
                else f"choose a data source whose records have {field!r}"
            )
            raise DataError(
                f"{where}: the records of data source {source!r} have no field {field!r} (they have: "
                f"{', '.join(found)}); {fix}"
            )
        first = records[lacking[0]]
        raise DataError(
            f"data.source={source}: {len(lacking)} of {len(records)} records have no {field!r} (the "
            f"first: record {lacking[0]}, key {str(first.get('key'))[:80]!r}); fill or remove them"
        )


def _closest(name: str, names: Iterable[str]) -> str:
    match = difflib.get_close_matches(str(name), list(names), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def renamed(rows: Rows, fields: dict[str, str], origin: str) -> Iterator[dict[str, Any]]:
    """Records {key, ...}: the ``rows`` with ``fields`` renamed (ours=theirs), or whole when none are given.
    The renames are checked before the first row is read. Rows that are records already (.txt files',
    ``Rows.keyed``) keep their key (and group) through a rename; others are keyed by their text."""
    for ours, theirs in fields.items():
        if theirs not in rows.columns:
            raise DataError(
                f"data.source_args.{ours}={theirs}: no column {theirs!r} in {origin} (columns: "
                f"{', '.join(map(str, rows.columns))}); set data.source_args.{ours}=<one of them>"
            )
    if rows.keyed and not fields:
        return iter(rows.rows)
    if rows.keyed:
        kept = ("key", "group")
        return (
            ({ours: r[theirs] for ours, theirs in fields.items()} | {k: r[k] for k in kept if k in r})
            for r in rows.rows
        )
    return keyed(rows.rows, fields)


def keyed(rows: Iterable[dict[str, Any]], fields: dict[str, str]) -> Iterator[dict[str, Any]]:
    """Each row with ``fields`` renamed (whole when none are), keyed by its text and place where it has no key."""
    for i, row in enumerate(rows):
        record = {ours: row[theirs] for ours, theirs in fields.items()} if fields else dict(row)
        if "key" not in record:
            record["key"] = row_text(row)[:200] + f"#{i}"
        yield record
