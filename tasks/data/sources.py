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
import gettext
import hashlib
import json
import random
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DOCSTRING_PACKAGES = ("asyncio", "email", "importlib", "logging", "xml", "multiprocessing", "unittest", "http")


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


def stdlib_code(max_files: int | None = None) -> list[dict[str, str]]:
    """Records {key, text} of stdlib source files; capped, a fixed pseudo-random choice of them."""
    root = stdlib_root()
    files = stdlib_files()
    if max_files is not None:
        files = sorted(files, key=lambda p: hashlib.md5(str(p.relative_to(root)).encode()).hexdigest())[:max_files]
    return [{"key": str(p.relative_to(root)), "text": p.read_text(encoding="utf-8", errors="replace")}
            for p in files]


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


def number_pairs(n: int = 20000, *, target_lang: str = "de", max_number: int = 100_000,
                 seed: int = 0) -> list[dict[str, str]]:
    """Records {key, source, target}: English number words -> ``target_lang`` number words."""
    from num2words import num2words

    rng = random.Random(seed)
    numbers: set[int] = set(range(min(n, 1000)))
    while len(numbers) < min(n, max_number):
        numbers.add(rng.randrange(max_number))
    return [{"key": str(x), "source": num2words(x, lang="en"), "target": num2words(x, lang=target_lang)}
            for x in sorted(numbers)]


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
        raise FileNotFoundError(f"no gettext catalogs for {target_lang!r} under {locale_dir}")
    return [{"key": s, "source": s, "target": t} for s, t in sorted(pairs.items())]


def local_records(path: str | Path, **fields: str) -> list[dict[str, Any]]:
    """Records from local files (txt, csv, json/jsonl, parquet) through HF ``datasets``.

    ``fields`` renames columns, e.g. ``text="sentence", label="category"``; txt files give ``text``.
    """
    path = Path(path)
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    files = [f for f in files if f.is_file()]
    if not files:
        raise FileNotFoundError(f"no data files at {path}")
    suffix = files[0].suffix.lstrip(".")
    builder = {"txt": "text", "csv": "csv", "json": "json", "jsonl": "json", "parquet": "parquet"}.get(suffix)
    if builder is None:
        raise ValueError(f"unsupported data file type .{suffix} (txt, csv, json, jsonl, parquet)")
    from datasets import load_dataset

    dataset = load_dataset(builder, data_files=[str(f) for f in files], split="train")
    return _rename(dataset, fields)


def hub_records(name: str, split: str = "train", subset: str | None = None, **fields: str) -> list[dict[str, Any]]:
    """Records of a dataset on the Hugging Face hub (needs network access the first time)."""
    from datasets import load_dataset

    return _rename(load_dataset(name, subset, split=split), fields)


SOURCES = {
    "stdlib_code": stdlib_code,
    "stdlib_docstrings": stdlib_docstrings,
    "numbers": number_pairs,
    "gettext": gettext_pairs,
    "local": local_records,
    "hub": hub_records,
}


def load_records(source: str, **kwargs: Any) -> list[dict[str, Any]]:
    """Records of the named source; kwargs go to its function (see each one's arguments)."""
    if source not in SOURCES:
        raise ValueError(f"data source {source!r} is not one of {', '.join(SOURCES)}")
    return SOURCES[source](**kwargs)


def _rename(dataset, fields: dict[str, str]) -> list[dict[str, Any]]:
    rows = []
    for i, row in enumerate(dataset):
        record = {ours: row[theirs] for ours, theirs in fields.items()} if fields else dict(row)
        record.setdefault("key", json.dumps(row, sort_keys=True, default=str)[:200] + f"#{i}")
        rows.append(record)
    return rows
