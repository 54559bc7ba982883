"""Where text comes from: offline defaults that exist on any machine with Python (or come from a pip
package), local files, and hub datasets for users who are online.

Offline defaults (all real text, never random tokens):
- ``stdlib_code``: the Python standard library's own source files, for language modelling.
- ``stdlib_docstrings``: docstrings of stdlib functions and classes labelled with the package they
  come from (asyncio, email, ...), for classification.
- ``numbers``: English number words and their German (or French, ...) translation, generated with
  ``num2words``, for translation; ``gettext``: the English->German message pairs in the machine's
  gettext catalogs (Debian holds tens of thousands), where present.
"""

from __future__ import annotations

import ast
import codecs
import difflib
import errno
import gettext
import hashlib
import inspect
import json
import os
import random
import sysconfig
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import zoo
from tasks.errors import DataError

DOCSTRING_PACKAGES = ("asyncio", "email", "importlib", "logging", "xml", "multiprocessing", "unittest", "http")

SOURCES: zoo.Registry[Callable[..., list[dict[str, Any]]]] = zoo.Registry("data source")
"""``data.source`` names -> functions returning records; register yours with ``@SOURCES.register(name)``."""


def split_of(key: str, val_fraction: float, test_fraction: float) -> str:
    """A stable train/val/test assignment from a hash of ``key`` (same on every machine and run)."""
    u = int(hashlib.md5(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if u < test_fraction else "val" if u < test_fraction + val_fraction else "train"


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(packages: Iterable[str] | None = None, *, include_tests: bool = False) -> list[Path]:
    """Sorted .py files of the standard library (not site-packages)."""
    root = stdlib_root()
    keep = set(packages) if packages is not None else None
    tops = [p for p in root.iterdir() if p.name not in ("site-packages", "dist-packages")]  # never walk those
    paths = [p for top in tops for p in ([top] if top.is_file() else top.rglob("*.py")) if p.suffix == ".py"]
    files = []
    for path in sorted(paths):
        parts = path.relative_to(root).parts
        if not include_tests and ({"test", "tests", "idle_test"} & set(parts)):
            continue
        if keep is not None and parts[0] not in keep:
            continue
        files.append(path)
    return files


@SOURCES.register("stdlib_code")
def stdlib_code(max_files: int | None = None) -> list[dict[str, str]]:
    """Records {key, text} of stdlib source files; capped, a fixed pseudo-random choice of them."""
    root = stdlib_root()
    files = stdlib_files()
    if max_files is not None:
        files = sorted(files, key=lambda p: hashlib.md5(str(p.relative_to(root)).encode()).hexdigest())[:max_files]
    return [{"key": str(p.relative_to(root)), "text": p.read_text(encoding="utf-8", errors="replace")}
            for p in files]


@SOURCES.register("stdlib_docstrings")
def stdlib_docstrings(packages: Iterable[str] = DOCSTRING_PACKAGES, min_chars: int = 20) -> list[dict[str, Any]]:
    """Records {key, text, label} of function/class/module docstrings; label = package name."""
    root = stdlib_root()
    records = []
    for path in stdlib_files(packages):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        rel = path.relative_to(root)
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= min_chars:
                    name = getattr(node, "name", "<module>")
                    records.append({"key": f"{rel}:{name}:{getattr(node, 'lineno', 0)}", "group": str(rel),
                                    "text": doc, "label": rel.parts[0]})
    return records


@SOURCES.register("numbers")
def number_pairs(n: int = 20000, *, target_lang: str = "de", max_number: int = 100_000,
                 seed: int = 0) -> list[dict[str, str]]:
    """Records {key, source, target}: English number words -> ``target_lang`` number words.

    Half the ``n`` numbers are drawn uniformly below ``max_number``, half with each digit count
    equally likely, so that short numbers ("six", "forty-two") are not a rounding error of the data
    (drawn uniformly, 95% of numbers below 100,000 have five digits, and a model trained on them
    turns "six" into "six mille six"). Small numbers therefore repeat; every copy has the same key,
    so a number lies in one split, and evaluation splits count it once."""
    from num2words import num2words

    rng = random.Random(seed)
    digits = len(str(max_number - 1))
    numbers = []
    for i in range(n):
        if i % 2:
            numbers.append(rng.randrange(max_number))
        else:
            d = rng.randint(1, digits)
            numbers.append(rng.randrange(10 ** (d - 1) if d > 1 else 0, min(10**d, max_number)))
    words = {x: (num2words(x, lang="en"), num2words(x, lang=target_lang)) for x in set(numbers)}
    return [{"key": str(x), "source": words[x][0], "target": words[x][1]} for x in sorted(numbers)]


@SOURCES.register("gettext")
def gettext_pairs(target_lang: str = "de", locale_dir: str | Path = "/usr/share/locale",
                  max_chars: int = 200) -> list[dict[str, str]]:
    """Records {key, source, target} from the compiled gettext catalogs (.mo) of one language."""
    pairs: dict[str, str] = {}
    for mo in sorted(Path(locale_dir).glob(f"{target_lang}/LC_MESSAGES/*.mo")):
        try:
            with mo.open("rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog  # msgid -> msgstr
        except (OSError, UnicodeDecodeError, ValueError) as error:  # a damaged catalog is skipped
            print(f"skipping {mo}: {error}")
            continue
        for source, target in catalog.items():
            if isinstance(source, str) and isinstance(target, str) and source and target and "\x00" not in source \
                    and len(source) <= max_chars and len(target) <= max_chars and source != target:
                pairs.setdefault(source.strip(), target.strip())
    if not pairs:
        raise DataError(f"data.source_args.locale_dir={locale_dir}: no gettext catalogs for {target_lang!r} "
                        f"({target_lang}/LC_MESSAGES/*.mo); install that language's translations or use data=numbers")
    return [{"key": s, "source": s, "target": t} for s, t in sorted(pairs.items())]


# ---- local files ---------------------------------------------------------------------------------
READERS = {".txt": "text", ".csv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
"""Data file suffix -> how it is read: .txt by zoo (line by line), the others by HF ``datasets``."""
DATA_TYPES = ", ".join(READERS)
MAX_RECORD_CHARS = 1 << 20
"""A longer line of a .txt file becomes several records of at most this many characters."""
CHUNK_BYTES = 1 << 20  # .txt files are read this much at a time
HEAD_BYTES = 1 << 13  # how much of a csv/json/parquet file is checked before HF datasets reads it
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}  # writing HF datasets' cache failed


@SOURCES.register("local")
def local_records(path: str | Path, **fields: str) -> list[dict[str, Any]]:
    """Records from a local file or folder of one type: .txt (one record per line), .csv, .json/.jsonl
    or .parquet (one per row, through HF ``datasets``). Hidden files and folders (.DS_Store, .git/)
    are skipped; any other file must be data. Bad data raises a DataError naming the file.

    ``fields`` renames columns, e.g. ``text="sentence", label="category"``; txt files give ``text``.
    """
    shown = f"data.source_args.path={path}"
    files = _data_files(Path(path).expanduser(), shown)
    reader = READERS[files[0].suffix.lower()]
    for file in files if reader != "text" else ():  # zoo checks .txt files as it reads them
        _check_head(file, reader)
    origin = str(files[0]) if len(files) == 1 else f"the {len(files)} {reader} files of {path}"
    if reader == "text":
        records = _records(({"text": line} for file in files for line in _lines(file)), ["text"], fields, origin)
    else:
        dataset = _read_with_datasets(reader, files)
        records = _records(dataset, dataset.column_names, fields, origin)
    if not records:
        raise DataError(f"{shown}: no records in {origin}; point it at your data")
    return records


def _data_files(path: Path, shown: str) -> list[Path]:
    """The non-empty data files at ``path`` (a file or a folder), all of one reader."""
    if not path.exists():
        raise DataError(f"{shown}: no such file or folder; point it at your data (a file or a folder of "
                        f"{DATA_TYPES} files)")
    if not path.is_file() and not path.is_dir():
        raise DataError(f"{shown}: not a regular file or folder; point it at your data")
    files = [path] if path.is_file() else _visible_files(path)
    unknown = [f for f in files if f.suffix.lower() not in READERS]
    if unknown and path.is_file():
        raise DataError(f"{shown}: {path.suffix or 'a file without a suffix'} is not a data type zoo reads "
                        f"({DATA_TYPES}); convert it to one of them")
    if unknown:
        what = "is not a data file" if len(unknown) == 1 else "are not data files"
        raise DataError(f"{shown}: {_some(str(f.relative_to(path)) for f in unknown)} in the folder {what} "
                        f"({DATA_TYPES}); move them out or point path at one file")
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
        raise DataError(f"{shown}: the folder mixes file types ({mix}); zoo reads one type per source: point "
                        f"path at a folder (or a file) of one type")
    return files


def _visible_files(folder: Path) -> list[Path]:
    """Files under ``folder`` in sorted order, without hidden files and folders (.DS_Store, .git/)."""

    def refuse(error: OSError) -> None:
        raise DataError(f"{error.filename}: cannot read this folder ({error.strerror}); fix its permissions or "
                        f"point data.source_args.path elsewhere")

    files = []
    for root, dirs, names in os.walk(folder, onerror=refuse):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        files += [Path(root, name) for name in names if not name.startswith(".")]
    return sorted(f for f in files if f.is_file())


def _some(names: Iterable[str], shown: int = 5) -> str:
    names = list(names)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _open(file: Path) -> BinaryIO:
    try:
        return file.open("rb")
    except OSError as error:
        raise DataError(f"{file}: cannot read it ({error.strerror}); fix its permissions or move it out") from None


def _check_head(file: Path, reader: str) -> None:
    """Refuse a file that is plainly not of its type: binary or non-UTF-8 text, or parquet without PAR1."""
    with _open(file) as f:
        head = f.read(HEAD_BYTES)
    if reader == "parquet":
        if not head.startswith(b"PAR1"):
            raise DataError(f"{file}: not a parquet file (it does not start with PAR1); convert it or rename it")
        return
    _decode(file, codecs.getincrementaldecoder("utf-8")(), head, 0, final=len(head) < HEAD_BYTES)


def _decode(file: Path, decoder: codecs.IncrementalDecoder, chunk: bytes, offset: int, *, final: bool) -> str:
    """``chunk`` (read at byte ``offset``) as UTF-8 text; a DataError at a NUL byte or a non-UTF-8 byte."""
    nul = chunk.find(b"\x00")
    if nul >= 0:
        raise DataError(f"{file}: a NUL byte at byte {offset + nul}: a binary (or UTF-16) file, not UTF-8 text; "
                        f"remove it or save it as UTF-8 text")
    pending = len(decoder.getstate()[0])  # bytes of a character begun in the previous chunk
    try:
        return decoder.decode(chunk, final)
    except UnicodeDecodeError as error:
        at = offset - pending + error.start
        raise DataError(f"{file}: byte {at} (0x{error.object[error.start]:02x}) is not UTF-8 text; save the file "
                        f"as UTF-8 (e.g. iconv -f latin1 -t utf-8) or remove it") from None


def _decoded(file: Path) -> Iterator[str]:
    """The text of a UTF-8 file, read CHUNK_BYTES at a time (a leading byte order mark dropped)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with _open(file) as f:
        while chunk := f.read(CHUNK_BYTES):
            text = _decode(file, decoder, chunk, offset, final=False)
            yield text.removeprefix("\ufeff") if offset == 0 else text
            offset += len(chunk)
        yield _decode(file, decoder, b"", offset, final=True)


def _lines(file: Path) -> Iterator[str]:
    """Lines of a text file split at \\n, \\r\\n or \\r (as HF datasets' text reader does), in bounded
    memory: a line longer than MAX_RECORD_CHARS comes out in pieces as it is read."""
    rest = ""
    for text in _decoded(file):
        text = rest + text
        held = "\r" if text.endswith("\r") else ""  # maybe the first half of \r\n
        *lines, rest = text.removesuffix(held).replace("\r\n", "\n").replace("\r", "\n").split("\n")
        for line in lines:
            pieces, last = _cut(line)
            yield from pieces
            yield last
        pieces, rest = _cut(rest)
        yield from pieces
        rest += held
    if rest:  # a last line without a line break, or an empty one ended by \r
        yield rest.removesuffix("\r")


def _cut(text: str) -> tuple[list[str], str]:
    """``text`` cut into pieces of at most MAX_RECORD_CHARS characters (after a space in the second half
    of a piece where there is one): the full pieces, and the rest (no longer than a piece)."""
    limit, start, pieces = MAX_RECORD_CHARS, 0, []
    while len(text) - start > limit:
        cut = text.rfind(" ", start + limit // 2, start + limit) + 1 or start + limit
        pieces.append(text[start:cut])
        start = cut
    return pieces, text[start:]


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
        raise DataError(f"{where}: HF datasets cannot read {'it' if len(files) == 1 else 'them together'} "
                        f"({_cause(error)}); fix the data or point data.source_args.path at other files") from error


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
        for _ in _decoded(file):
            pass
    if reader == "json":
        _check_json(file)
    if alone:
        try:
            _load_quietly(reader, [file])
        except Exception as error:
            if _disk_error(error):
                raise
            raise DataError(f"{file}: HF datasets cannot read it ({_cause(error)}); fix the file or move it "
                            f"out") from error


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
                raise DataError(f"{file} line {number}: not valid JSON ({error.msg}); fix or remove the line "
                                f"(JSON Lines: one object per line)") from None
            if not isinstance(value, dict):
                raise DataError(f"{file} line {number}: a JSON {type(value).__name__}, not an object; write one "
                                f'object per line, e.g. {{"text": "..."}}')


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


def _records(rows: Iterable[dict[str, Any]], columns: Sequence[str], fields: dict[str, str],
             origin: str) -> list[dict[str, Any]]:
    """Records {key, ...}: the rows with ``fields`` renamed (ours=theirs), or whole when none are given."""
    for ours, theirs in fields.items():
        if theirs not in columns:
            raise DataError(f"data.source_args.{ours}={theirs}: no column {theirs!r} in {origin} (columns: "
                            f"{', '.join(map(str, columns))}); set data.source_args.{ours}=<one of them>")
    records = []
    for i, row in enumerate(rows):
        record = {ours: row[theirs] for ours, theirs in fields.items()} if fields else dict(row)
        record.setdefault("key", json.dumps(row, sort_keys=True, default=str)[:200] + f"#{i}")
        records.append(record)
    return records


# ---- the hub and the registry of sources ---------------------------------------------------------
@SOURCES.register("hub")
def hub_records(name: str, split: str = "train", subset: str | None = None, **fields: str) -> list[dict[str, Any]]:
    """Records of a dataset on the Hugging Face hub (needs network access the first time)."""
    from datasets import load_dataset

    try:
        dataset = load_dataset(name, subset, split=split)
    except Exception as error:
        if _disk_error(error):
            raise
        raise DataError(f"data.source_args.name={name}: the hub dataset cannot be loaded ({_cause(error)}); check "
                        f"name, subset and split, and that this machine is online (or has it cached)") from error
    return _records(dataset, dataset.column_names, fields, f"hub dataset {name!r}")




def load_records(source: str, /, *, needs: Sequence[str] = (), **kwargs: Any) -> list[dict[str, Any]]:
    """Records of the named source; ``kwargs`` (data.source_args) go to its function. ``needs``: the
    fields the data module reads from every record; a source without them is a DataError that says
    which override maps them."""
    if source not in SOURCES:
        raise DataError(f"data.source={source}: not a data source; choose one of {', '.join(SOURCES.names())}"
                        f"{_closest(source, SOURCES)}")
    function = SOURCES.get(source)
    _check_arguments(source, function, kwargs)
    records = function(**kwargs)
    _check_fields(records, needs, source, renames=_takes_any(function))
    return records


def _takes_any(function: Callable[..., Any]) -> bool:
    """Whether the source takes any keyword (the column renames of local and hub)."""
    return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(function).parameters.values())


def _check_arguments(source: str, function: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    params = inspect.signature(function).parameters
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not _takes_any(function):
        for key, value in kwargs.items():
            if key not in named:
                raise DataError(f"data.source_args.{key}={value}: data source {source!r} takes no argument {key!r}; "
                                f"it takes {', '.join(named) or 'none'}{_closest(key, named)}")
    for name in named:
        if params[name].default is inspect.Parameter.empty and name not in kwargs:
            raise DataError(f"data.source_args.{name} is missing: data source {source!r} needs it; set "
                            f"data.source_args.{name}=...")


def _check_fields(records: list[dict[str, Any]], needs: Sequence[str], source: str, *, renames: bool) -> None:
    for field in needs:
        lacking = [i for i, record in enumerate(records) if record.get(field) is None]
        if not lacking:
            continue
        if len(lacking) == len(records):
            found = sorted({str(k) for record in records[:1000] for k in record} - {"key"})
            where = f"data.source_args.{field}" if renames else f"data.source={source}"
            fix = (f"map a column to it with data.source_args.{field}=<column>" if renames else
                   f"choose a data source whose records have {field!r}")
            raise DataError(f"{where}: the records of data source {source!r} have no field {field!r} (they have: "
                            f"{', '.join(found)}); {fix}")
        first = records[lacking[0]]
        raise DataError(f"data.source={source}: {len(lacking)} of {len(records)} records have no {field!r} (the "
                        f"first: record {lacking[0]}, key {str(first.get('key'))[:80]!r}); fill or remove them")


def _closest(name: str, names: Iterable[str]) -> str:
    match = difflib.get_close_matches(str(name), list(names), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""
