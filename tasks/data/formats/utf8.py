"""UTF-8 files read in bounded memory: a NUL or a non-UTF-8 byte is a DataError naming the file and the
byte, a leading byte order mark is dropped. The text formats read their files through it."""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from tasks.errors import DataError

CHUNK_BYTES = 1 << 20  # a file is read this much at a time


def open_data(file: Path) -> BinaryIO:
    try:
        return file.open("rb")
    except OSError as error:
        raise DataError(f"{file}: cannot read it ({error.strerror}); fix its permissions or move it out") from None


def decode(file: Path, decoder: codecs.IncrementalDecoder, chunk: bytes, offset: int, *, final: bool) -> str:
    """``chunk`` (read at byte ``offset``) as UTF-8 text; a DataError at a NUL byte or a non-UTF-8 byte."""
    nul = chunk.find(b"\x00")
    if nul >= 0:
        raise DataError(
            f"{file}: a NUL byte at byte {offset + nul}: a binary (or UTF-16) file, not UTF-8 text; "
            f"remove it or save it as UTF-8 text"
        )
    pending = len(decoder.getstate()[0])  # bytes of a character begun in the previous chunk
    try:
        return decoder.decode(chunk, final)
    except UnicodeDecodeError as error:
        at = offset - pending + error.start
        raise DataError(
            f"{file}: byte {at} (0x{error.object[error.start]:02x}) is not UTF-8 text; save the file "
            f"as UTF-8 (e.g. iconv -f latin1 -t utf-8) or remove it"
        ) from None


def decoded(file: Path) -> Iterator[str]:
    """The text of a UTF-8 file, read CHUNK_BYTES at a time (a leading byte order mark dropped)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open_data(file) as f:
        while chunk := f.read(CHUNK_BYTES):
            text = decode(file, decoder, chunk, offset, final=False)
            yield text.removeprefix("\ufeff") if offset == 0 else text
            offset += len(chunk)
        yield decode(file, decoder, b"", offset, final=True)
