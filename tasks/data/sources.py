"""Where text comes from: offline defaults that exist on any machine with Python (or come from a pip
package), local files, and hub datasets for users who are online.

Offline defaults (all real text, never random tokens):
- ``stdlib_code``: the Python standard library's own source files, for language modelling.
- ``stdlib_docstrings``: docstrings of stdlib functions and classes labelled with the package they
  come from (asyncio, email, ...), for classification.
- ``numbers``: English number words and their German (or French, ...) translation, generated with
  ``num2words``, for translation; ``gettext``: the English->German message pairs in the machine's
  gettext catalogs (Debian holds tens of thousands), where present.

``local`` (files) and ``hub`` (HF datasets) are read in tasks/data/files.py.
"""

from __future__ import annotations

import ast
import difflib
import gettext
import hashlib
import inspect
import random
import sysconfig
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zoo
from tasks.data.files import (
    hub_extent,
    hub_identity,
    hub_records,
    iter_hub_records,
    iter_local_records,
    local_extent,
    local_identity,
    local_records,
    text_windows,
)
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
    return [{"key": str(p.relative_to(root)), "text": p.read_text(encoding="utf-8", errors="replace")} for p in files]


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
                    records.append(
                        {
                            "key": f"{rel}:{name}:{getattr(node, 'lineno', 0)}",
                            "group": str(rel),
                            "text": doc,
                            "label": rel.parts[0],
                        }
                    )
    return records


@SOURCES.register("numbers")
def number_pairs(
    n: int = 20000, *, target_lang: str = "de", max_number: int = 100_000, seed: int = 0
) -> list[dict[str, str]]:
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
def gettext_pairs(
    target_lang: str = "de", locale_dir: str | Path = "/usr/share/locale", max_chars: int = 200
) -> list[dict[str, str]]:
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
            if (
                isinstance(source, str)
                and isinstance(target, str)
                and source
                and target
                and "\x00" not in source
                and len(source) <= max_chars
                and len(target) <= max_chars
                and source != target
            ):
                pairs.setdefault(source.strip(), target.strip())
    if not pairs:
        raise DataError(
            f"data.source_args.locale_dir={locale_dir}: no gettext catalogs for {target_lang!r} "
            f"({target_lang}/LC_MESSAGES/*.mo); install that language's translations or use data=numbers"
        )
    return [{"key": s, "source": s, "target": t} for s, t in sorted(pairs.items())]


SOURCES.register("local")(local_records)
SOURCES.register("hub")(hub_records)


def load_records(source: str, /, *, needs: Sequence[str] = (), **kwargs: Any) -> list[dict[str, Any]]:
    """Records of the named source; ``kwargs`` (data.source_args) go to its function. ``needs``: the
    fields the data module reads from every record; a source without them is a DataError that says
    which override maps them."""
    function = check_source(source, kwargs, needs=needs)
    records = function(**kwargs)
    _check_fields(records, needs, source, renames=_takes_any(function))
    return records


@dataclass(frozen=True)
class Streamed:
    """How a source is read one record at a time: ``records`` (an iterator of them), ``identity`` (what
    changes when its data changes, without reading it; None where that cannot be known so), ``extent``
    (its files and their bytes, where known without reading: what preparing it says, a progress bar's
    total), and ``windows`` (where it can
    read seeded parts of its files alone: a tokenizer's sample, ``Corpus.sample``), all from its arguments."""

    records: Callable[..., Iterator[dict[str, Any]]]
    identity: Callable[..., Any]
    extent: Callable[..., tuple[int, int] | None]
    windows: Callable[..., Callable[[float, int], Iterator[str]] | None] = lambda **_: None


STREAMED = {
    "local": Streamed(
        iter_local_records,
        lambda path, **_: local_identity(path),
        lambda path, **_: local_extent(path),
        text_windows,
    ),
    "hub": Streamed(iter_hub_records, hub_identity, hub_extent),
}
"""The sources read one record at a time (the others return a list)."""


def stream_records(
    source: str,
    /,
    *,
    needs: Sequence[str] = (),
    texts: Callable[[dict[str, Any]], list[str]] | None = None,
    **kwargs: Any,
) -> Iterator[dict[str, Any]]:
    """The records of ``source`` one at a time: a streamed source (:data:`STREAMED`) in bounded memory,
    any other from its list. Each record is checked as it passes (``needs``: the fields the data module
    reads; ``texts``: what of a record the tokenizer reads, all strings); the arguments before the first."""
    if source not in STREAMED:
        return iter(load_records(source, needs=needs, **kwargs))
    check_source(source, kwargs, needs=needs)
    return _checked(STREAMED[source].records(**kwargs), needs, texts, source, kwargs)


def source_identity(source: str, source_args: dict[str, Any]) -> tuple[Any, tuple[int, int] | None]:
    """What changes when the data of ``source`` changes, without reading it (a local corpus' files:
    path, size, modification time; None where it must be read to know, as a list source: its records
    are then hashed as they are read), and its files and their bytes where known."""
    if source not in STREAMED:
        return None, None
    try:
        return STREAMED[source].identity(**source_args), STREAMED[source].extent(**source_args)
    except TypeError:
        return None, None  # arguments the source refuses: it says so, in one line, when it is read


def source_windows(source: str, source_args: dict[str, Any]) -> Callable[[float, int], Iterator[str]] | None:
    """How to read seeded parts of the source's files alone (``Streamed.windows``), where it can."""
    if source not in STREAMED:
        return None
    try:
        return STREAMED[source].windows(**source_args)
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


def _takes_any(function: Callable[..., Any]) -> bool:
    """Whether the source takes any keyword (the column renames of local and hub)."""
    return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(function).parameters.values())


RECORD_KEYS = ("key", "group")
"""Fields of a record that splitting reads besides a data module's own (``split_records``)."""


def check_source(source: str, source_args: dict[str, Any], *, needs: Sequence[str] = ()) -> Callable[..., Any]:
    """The function of data source ``source``, once ``source_args`` (data.source_args) are known to be
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
    function = SOURCES.get(source)
    _check_arguments(source, function, source_args, needs)
    return function


def _check_arguments(
    source: str, function: Callable[..., Any], kwargs: dict[str, Any], needs: Sequence[str] = ()
) -> None:
    params = inspect.signature(function).parameters
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    renames = _takes_any(function)
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
