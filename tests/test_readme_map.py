"""The README's map of the code ("Where things are") and its "Adding to zoo" table name files that
exist: a file moved or renamed without its row fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = ("conf", "hydra_plugins", "scripts", "tasks", "tests", "zoo")  # where a named path starts


def tables() -> list[list[str]]:
    """The cells of the two tables' rows (the README between their headings and the next heading)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("### Where things are")
    end = text.find("\n#", text.index("### Adding to zoo") + 1)
    rows = [line for line in text[start : end if end > 0 else None].splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows]


def named_paths(cell: str) -> list[str]:
    """The files and folders a cell names in backquotes: a path from the top (``zoo/io.py``), or a bare
    file name beside the last path named before it in the cell (``zoo/norm.py``, ``position.py``);
    braces expanded (``tasks/{a,b}.py``), a ``<name>`` placeholder standing for its folder, a ``*`` for
    any file it matches."""
    paths, folder = [], ""
    for token in re.findall(r"`([^`\s=]+)`", cell):
        name = re.sub(r"<[^>]+>.*$", "", token)
        if name.split("/", 1)[0] in TOP and "/" in name:
            folder = name if name.endswith("/") else name.rsplit("/", 1)[0] + "/"
            paths += _expanded(name)
        elif re.fullmatch(r"[\w.]+\.(py|yaml|sh)", name) and folder:
            paths.append(folder + name)
    return paths


def _expanded(name: str) -> list[str]:
    braces = re.search(r"\{([^}]+)\}", name)
    if braces is None:
        return [name]
    return [name[: braces.start()] + part + name[braces.end() :] for part in braces.group(1).split(",")]


def test_the_tables_name_files_that_exist():
    named = [path for row in tables() for cell in row[1:] for path in named_paths(cell)]
    assert len(named) > 80  # the tables were found and read
    missing = sorted({path for path in named if not ((ROOT / path).exists() or any(ROOT.glob(path)))})
    assert missing == []


def test_the_adding_rows_cover_every_kind_of_contribution():
    firsts = " / ".join(row[0] for row in tables())
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
