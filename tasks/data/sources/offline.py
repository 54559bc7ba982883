"""The offline sources: real text that exists on any machine with Python (or comes from a pip package),
never random tokens, each read whole into a list.

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
import random
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.data.sources.base import SOURCES, Source
from tasks.errors import DataError

DOCSTRING_PACKAGES = ("asyncio", "email", "importlib", "logging", "xml", "multiprocessing", "unittest", "http")


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
@dataclass
class StdlibCode(Source):
    """Records {key, text} of stdlib source files; capped (``max_files``), a fixed pseudo-random choice of them."""

    max_files: int | None = None

    def records(self) -> list[dict[str, Any]]:
        root = stdlib_root()
        files = stdlib_files()
        if self.max_files is not None:
            files = sorted(files, key=lambda p: hashlib.md5(str(p.relative_to(root)).encode()).hexdigest())
            files = files[: self.max_files]
        return [
            {"key": str(p.relative_to(root)), "text": p.read_text(encoding="utf-8", errors="replace")} for p in files
        ]


@SOURCES.register("stdlib_docstrings")
@dataclass
class StdlibDocstrings(Source):
    """Records {key, group, text, label} of function/class/module docstrings; label = package name,
    group = the file (a file's docstrings lie in one split)."""

    packages: Iterable[str] = DOCSTRING_PACKAGES
    min_chars: int = 20

    def records(self) -> list[dict[str, Any]]:
        root = stdlib_root()
        records = []
        for path in stdlib_files(self.packages):
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError):
                continue
            rel = path.relative_to(root)
            for node in ast.walk(tree):
                if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    doc = ast.get_docstring(node)
                    if doc and len(doc) >= self.min_chars:
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
@dataclass
class Numbers(Source):
    """Records {key, source, target}: English number words -> ``target_lang`` number words.

    Half the ``n`` numbers are drawn uniformly below ``max_number``, half with each digit count
    equally likely, so that short numbers ("six", "forty-two") are not a rounding error of the data
    (drawn uniformly, 95% of numbers below 100,000 have five digits, and a model trained on them
    turns "six" into "six mille six"). Small numbers therefore repeat; every copy has the same key,
    so a number lies in one split, and evaluation splits count it once."""

    n: int = 20000
    target_lang: str = "de"
    max_number: int = 100_000
    seed: int = 0

    def records(self) -> list[dict[str, Any]]:
        from num2words import num2words

        rng = random.Random(self.seed)
        digits = len(str(self.max_number - 1))
        numbers = []
        for i in range(self.n):
            if i % 2:
                numbers.append(rng.randrange(self.max_number))
            else:
                d = rng.randint(1, digits)
                numbers.append(rng.randrange(10 ** (d - 1) if d > 1 else 0, min(10**d, self.max_number)))
        words = {x: (num2words(x, lang="en"), num2words(x, lang=self.target_lang)) for x in set(numbers)}
        return [{"key": str(x), "source": words[x][0], "target": words[x][1]} for x in sorted(numbers)]


@SOURCES.register("gettext")
@dataclass
class Gettext(Source):
    """Records {key, source, target} from the compiled gettext catalogs (.mo) of one language."""

    target_lang: str = "de"
    locale_dir: str | Path = "/usr/share/locale"
    max_chars: int = 200

    def records(self) -> list[dict[str, Any]]:
        pairs: dict[str, str] = {}
        for mo in sorted(Path(self.locale_dir).glob(f"{self.target_lang}/LC_MESSAGES/*.mo")):
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
                    and len(source) <= self.max_chars
                    and len(target) <= self.max_chars
                    and source != target
                ):
                    pairs.setdefault(source.strip(), target.strip())
        if not pairs:
            raise DataError(
                f"data.source_args.locale_dir={self.locale_dir}: no gettext catalogs for {self.target_lang!r} "
                f"({self.target_lang}/LC_MESSAGES/*.mo); install that language's translations or use data=numbers"
            )
        return [{"key": s, "source": s, "target": t} for s, t in sorted(pairs.items())]
