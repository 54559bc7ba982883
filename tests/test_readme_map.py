"""The map of the code (the README's short one, the guide's docs/code-map.md) and the "Adding to zoo"
table (docs/adding-to-zoo.md) name files that exist, and each symbol they name beside a file is defined
in that file: a file moved or renamed without its row, or a name that moved to another module, fails
here.

A row names a symbol beside its file in one of two forms: ``file`` (``symbol``, ``symbol``…), a
parenthesis right after the file holding the symbols it defines, or ``symbol`` (``file``), a
parenthesis right after the symbol holding only its file. A bare file name (``position.py``) sits in
the folder of the last path named before it in the row."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = ("conf", "hydra_plugins", "scripts", "tasks", "tests", "zoo")  # where a named path starts
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def _section(text: str, heading: str) -> str:
    """``text`` from ``heading`` to the next heading of the same level."""
    start = text.index(heading)
    level = heading.split(" ", 1)[0]
    end = text.find(f"\n{level} ", start + 1)
    return text[start : end if end > 0 else None]


def pages() -> dict[str, str]:
    """The text of each map: the README's section and the two guide pages."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return {
        "README.md": _section(readme, "## The map of the code"),
        "docs/code-map.md": (ROOT / "docs" / "code-map.md").read_text(encoding="utf-8"),
        "docs/adding-to-zoo.md": (ROOT / "docs" / "adding-to-zoo.md").read_text(encoding="utf-8"),
    }


def rows(text: str) -> list[list[str]]:
    """The cells of a page's table rows."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines]


def tables() -> list[list[str]]:
    return [row for text in pages().values() for row in rows(text)]


def _tokens(cell: str) -> list[tuple[str, str | None, str | None]]:
    """Each backquoted token of a cell in order: (token, the path it names or None, the text of a
    parenthesis right after it or None). Braces are expanded by ``named_paths``, not here."""
    out, folder = [], ""
    for match in re.finditer(r"`([^`\s]+)`(?:\s*\(([^()]*)\))?", cell):
        token, after = match.group(1), match.group(2)
        name = re.sub(r"<[^>]+>.*$", "", token) if "=" not in token else ""
        path = None
        if name.split("/", 1)[0] in TOP and "/" in name:
            folder = name if name.endswith("/") else name.rsplit("/", 1)[0] + "/"
            path = name
        elif re.fullmatch(r"[\w.]+\.(py|yaml|sh)", name) and folder:
            path = folder + name
        out.append((token, path, after))
    return out


def named_paths(cell: str) -> list[str]:
    """The files and folders a cell names in backquotes: a path from the top (``zoo/io.py``), or a bare
    file name beside the last path named before it in the cell (``zoo/norm.py``, ``position.py``);
    braces expanded (``tasks/{a,b}.py``), a ``<name>`` placeholder standing for its folder, a ``*`` for
    any file it matches."""
    return [expanded for _, path, _ in _tokens(cell) if path for expanded in _expanded(path)]


def _expanded(name: str) -> list[str]:
    braces = re.search(r"\{([^}]+)\}", name)
    if braces is None:
        return [name]
    return [name[: braces.start()] + part + name[braces.end() :] for part in braces.group(1).split(",")]


def symbol_claims(cell: str) -> list[tuple[str, str]]:
    """(file, symbol) for each symbol a cell names beside a Python file, in either of the module
    docstring's two forms."""
    claims = []
    for token, path, after in _tokens(cell):
        if after is None:
            continue
        inside = re.findall(r"`([^`]+)`", after)
        if path and path.endswith(".py"):
            claims += [(path, name) for name in inside if IDENTIFIER.fullmatch(name)]
        elif path is None and IDENTIFIER.fullmatch(token) and re.fullmatch(r"\s*`[^`]+\.py`\s*", after):
            (file,) = [p for _, p, _ in _tokens(after) if p] or [None]
            if file:
                claims.append((file, token))
    return claims


def defines(path: Path, symbol: str) -> bool:
    """Whether the module defines ``symbol``: a def or class, or an assignment (annotated or not), at
    any depth (a method or a class attribute counts); an import does not."""
    pattern = rf"^\s*(?:async\s+def|def|class)\s+{symbol}\b|^\s*{symbol}\s*(?::[^\n=]+)?=(?!=)"
    return re.search(pattern, path.read_text(encoding="utf-8"), flags=re.MULTILINE) is not None


def test_the_tables_name_files_that_exist():
    named = [path for row in tables() for cell in row[1:] for path in named_paths(cell)]
    assert len(named) > 120  # the tables were found and read
    missing = sorted({path for path in named if not ((ROOT / path).exists() or any(ROOT.glob(path)))})
    assert missing == []


def test_each_symbol_named_beside_a_file_is_defined_in_that_file():
    claims = {
        (page, claim)
        for page, text in pages().items()
        for row in rows(text)
        for claim in symbol_claims(" | ".join(row))
    }
    assert len(claims) > 80 and {page for page, _ in claims} == set(pages())  # every map names symbols
    wrong = sorted(
        f"{page}: `{symbol}` (`{file}`)"
        for page, (file, symbol) in claims
        if not (ROOT / file).is_file() or not defines(ROOT / file, symbol)
    )
    assert wrong == []


def test_the_adding_rows_cover_every_kind_of_contribution():
    firsts = " / ".join(row[0] for row in rows(pages()["docs/adding-to-zoo.md"]))
    for kind in ("position", "mask", "FFN", "HF family", "GGUF architecture", "trainer strategy", "a task"):
        assert kind in firsts, kind


def test_a_missing_file_is_seen():
    assert named_paths("`zoo/norm.py`, `position.py` and `tasks/{a,b}.py`, `conf/model/<name>.yaml`") == [
        "zoo/norm.py",
        "zoo/position.py",
        "tasks/a.py",
        "tasks/b.py",
        "conf/model/",
    ]
    assert not (ROOT / "tasks/a.py").exists()


def test_a_symbol_in_another_file_is_seen():
    cell = "`zoo/norm.py` (`Norm`, placements), `position.py` (`Position`); `ROPE_SCALINGS` (`zoo/position.py`)"
    assert symbol_claims(cell) == [
        ("zoo/norm.py", "Norm"),
        ("zoo/position.py", "Position"),
        ("zoo/position.py", "ROPE_SCALINGS"),
    ]
    assert defines(ROOT / "zoo/position.py", "Position")
    assert not defines(ROOT / "zoo/position.py", "ROPE_SCALINGS")  # imported there, defined in rope_scaling.py
    assert defines(ROOT / "zoo/rope_scaling.py", "ROPE_SCALINGS")
