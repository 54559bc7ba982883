"""The ``text`` format: .txt files read by zoo, in bounded memory: UTF-8 checked as it is read
(``utf8.py``), line breaks \\n, \\r\\n and \\r alike; records by line (as HF
datasets' text reader), by paragraph or by document (``data.source_args.sample_by``); and seeded
windows of the files for a tokenizer's sample, read without the rest (``windows``)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

from tasks.data.formats.base import FORMATS, FileFormat, Rows
from tasks.data.formats.utf8 import decoded, open_data
from tasks.data.prepared import unit

MAX_RECORD_CHARS = 1 << 20
"""A longer line (paragraph, file) of a .txt file becomes several records of at most this many characters."""
SAMPLES_BY = ("line", "paragraph", "document")
PARAGRAPH_BREAK = re.compile(r"\n(?:[^\S\n]*\n)+")  # a line break, then blank (or whitespace-only) lines
"""How a .txt file becomes records (``data.source_args.sample_by``), as HF datasets' text reader: each
line; each paragraph (lines up to a blank one, joined by \\n); each file, its pieces kept in one split."""
WINDOW_BYTES = 1 << 18  # the part of a .txt file one draw of a tokenizer's sample reads (``windows``)


@FORMATS.register("text")
class Text(FileFormat):
    """.txt files: a record a line, a paragraph or a file (``sample_by``), keyed by zoo; UTF-8 is checked
    as they are read, not before."""

    suffixes = (".txt",)
    samples_by = SAMPLES_BY

    @classmethod
    def rows(cls, files: list[Path], root: Path, sample_by: str) -> Rows:
        return Rows(text_records(files, root, sample_by), ["text"], keyed=True)

    @classmethod
    def windows(cls, files: list[Path], sample_by: str) -> Callable[[float, int], Iterator[str]] | None:
        return lambda share, seed: windows(files, sample_by, share, seed)


def lines(file: Path) -> Iterator[str]:
    """Lines of a text file split at \\n, \\r\\n or \\r (as HF datasets' text reader does), in bounded
    memory: a line longer than MAX_RECORD_CHARS comes out in pieces as it is read."""
    rest = ""
    for text in decoded(file):
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


def text_records(files: list[Path], root: Path, sample_by: str) -> Iterator[dict[str, Any]]:
    """The records of .txt ``files``: {text, key}, keyed by the text and its place as any row is
    (``row_text``); by document {text, key, group}, keyed by the file (under ``root``) and piece, a
    group a file, so that a file lies in one split."""
    if sample_by == "document":
        for file in files:
            name = str(file.relative_to(root)) if file != root else file.name
            for piece, text in enumerate(_texts(file, None)):
                yield {"text": text, "key": f"{name}#{piece}", "group": name}
        return
    texts = (t for f in files for t in (lines(f) if sample_by == "line" else _texts(f, PARAGRAPH_BREAK)))
    for i, text in enumerate(texts):
        yield {"text": text, "key": row_text({"text": text[:200]})[:200] + f"#{i}"}


def _texts(file: Path, between: re.Pattern[str] | None) -> Iterator[str]:
    """The text of ``file`` (line breaks made \\n) in pieces: split where ``between`` matches (the
    match dropped; empty pieces skipped), or whole (None); a piece longer than MAX_RECORD_CHARS cut
    after a line break or a space in its second half where there is one. In bounded memory."""
    rest, held = "", ""
    for text in decoded(file):
        text = held + text
        held = "\r" if text.endswith("\r") else ""  # maybe the first half of \r\n
        rest += text.removesuffix(held).replace("\r\n", "\n").replace("\r", "\n")
        if between is not None:  # a break that ends the text may go on in the next chunk: kept
            end = len(rest.rstrip())
            *done, last = between.split(rest[:end])
            rest = last + rest[end:]
            for piece in done:
                yield from _cut_at_lines(piece) if piece.strip() else ()
        while len(rest) > MAX_RECORD_CHARS:
            piece, rest = _first_piece(rest)
            yield piece
    rest += "\n" if held else ""
    if between is None or rest.strip():
        yield from _cut_at_lines(rest.rstrip("\n") if between is not None else rest)


def _first_piece(text: str) -> tuple[str, str]:
    """The first MAX_RECORD_CHARS characters of ``text`` or fewer, cut after a line break or a space in
    their second half where there is one; and the rest."""
    limit = MAX_RECORD_CHARS
    cut = text.rfind("\n", limit // 2, limit) + 1 or text.rfind(" ", limit // 2, limit) + 1 or limit
    return text[:cut], text[cut:]


def _cut_at_lines(text: str) -> list[str]:
    """``text`` in pieces of at most MAX_RECORD_CHARS characters (``_first_piece``); none when empty."""
    pieces = []
    while len(text) > MAX_RECORD_CHARS:
        piece, text = _first_piece(text)
        pieces.append(piece)
    return [*pieces, text] if text else pieces


def windows(files: list[Path], sample_by: str, share: float, seed: int) -> Iterator[str]:
    """Each window (``WINDOW_BYTES`` at a multiple of it) of ``files`` with probability ``share``, by a
    hash of (seed, file, offset), its whole lines only (line breaks made \\n): by line, each line; else
    the window's text."""
    for file in files:
        size = file.stat().st_size
        with open_data(file) as f:
            for offset in range(0, size, WINDOW_BYTES):
                if unit(seed, f"{file.name}:{offset}") >= share:
                    continue
                f.seek(offset)
                data = f.read(WINDOW_BYTES)
                first = 0 if offset == 0 else data.find(b"\n") + 1
                last = len(data) if offset + len(data) >= size else data.rfind(b"\n") + 1
                text = data[first:last].decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
                if first < last:
                    yield from (filter(None, text.split("\n")) if sample_by == "line" else [text])


def row_text(row: dict[str, Any]) -> str:
    """``json.dumps(row, sort_keys=True, default=str)``, a line of a .txt file's ({"text": line}) at C speed."""
    if len(row) == 1 and isinstance(text := row.get("text"), str):
        return '{"text": ' + encode_basestring_ascii(text) + "}"
    return json.dumps(row, sort_keys=True, default=str)
