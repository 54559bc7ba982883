"""A prepared corpus' splits as files of token ids, and how training reads them: ``SplitTokens`` names a
split's files (its ids, ``uint16`` or ``uint32``, and the ``int64`` end of each document) and checks them
before a run uses them (``check``); ``TokenBlocks`` (language modelling) and ``TokenDocuments`` (masked LM)
read a batch's ids with ``os.pread`` (``IdReader``), so that a process holds its batches and no page of
the corpus."""

from __future__ import annotations

import contextlib
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tasks.data.loading import ZooDataset
from tasks.errors import DataError

CHECK_BYTES = 16 << 20  # what ``SplitTokens.check`` reads of a file at once


def damaged(folder: Path, what: str) -> DataError:
    """The one line for a prepared corpus in ``folder`` that cannot be used as it is: ``what`` is wrong
    with it, and the fix (zoo never deletes a cache it finds; the user does, and the next run prepares
    it again)."""
    return DataError(
        f"{folder}: the prepared corpus is damaged ({what}); delete that folder and run again to prepare it anew"
    )


def crc32_of(data: bytes | memoryview, value: int = 0) -> int:
    """The CRC-32 of ``data`` continued from ``value`` (zlib's: about 2.5 GB/s on one core)."""
    return zlib.crc32(data, value)


@dataclass(frozen=True)
class SplitTokens:
    """One split of a prepared corpus: ``tokens`` ids in ``ids`` (of ``dtype``), and the end offset of
    each of its ``documents`` in ``ends``; ``crc32``: the CRC-32 of the ids' and of the ends' bytes as
    they were prepared (None in a cache an older zoo wrote, which recorded none)."""

    ids: Path
    ends: Path
    dtype: str
    tokens: int
    documents: int
    crc32: tuple[int, int] | None = None

    def check(self, vocab_size: int) -> None:
        """A DataError naming the cache folder (``damaged``) unless the split's files are as prepared:
        each file's size is what its count says (checked before anything of it is read); the document
        ends never fall and the last is the split's token count; every id is below ``vocab_size`` (the
        tokenizer's, which the model's embedding has); the bytes have the CRC-32 recorded when they were
        written. One pass over each file, CHECK_BYTES at a time into one buffer (at about the speed a
        disk reads: ``scripts/bench/cache_check.py``); a cache without ``crc32`` gets every check but
        the last."""
        folder, itemsize = self.ids.parent, np.dtype(self.dtype).itemsize
        for path, count, size in ((self.ids, self.tokens, itemsize), (self.ends, self.documents, 8)):
            try:
                held = path.stat().st_size
            except OSError as error:
                raise damaged(folder, f"{path.name}: {error.strerror}") from None
            if held != count * size:
                what = f"{path.name} holds {held:,} bytes where meta.json's count of {count:,} needs {count * size:,}"
                raise damaged(folder, what)
        ends_crc, last = 0, 0
        for data in _chunks(self.ends, folder):
            ends = np.frombuffer(data, dtype=np.int64)
            falls = np.flatnonzero(np.diff(ends, prepend=last) < 0)
            if len(falls):
                what = f"{self.ends.name}: a document ends at {int(ends[falls[0]]):,}, before the one ahead of it"
                raise damaged(folder, what)
            ends_crc, last = crc32_of(data, ends_crc), int(ends[-1])
        if last != self.tokens:
            what = f"{self.ends.name}: the last document ends at {last:,}, not at the split's {self.tokens:,} tokens"
            raise damaged(folder, what)
        ids_crc, offset = 0, 0
        for data in _chunks(self.ids, folder):
            ids = np.frombuffer(data, dtype=self.dtype)
            if int(ids.max()) >= vocab_size:
                at = int(np.argmax(ids >= vocab_size))
                raise damaged(
                    folder,
                    f"{self.ids.name}: id {int(ids[at])} at token {offset + at:,} is beyond the tokenizer's "
                    f"{vocab_size:,} ids",
                )
            ids_crc, offset = crc32_of(data, ids_crc), offset + len(ids)
        if self.crc32 is not None and (ids_crc, ends_crc) != tuple(self.crc32):
            changed = self.ids.name if ids_crc != self.crc32[0] else self.ends.name
            raise damaged(folder, f"{changed}: its bytes are not those written when it was prepared (CRC-32)")

    def read_ids(self) -> np.ndarray:
        """The ids as a read-only memory map (an empty array for an empty split)."""
        if self.tokens == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(self.ids, dtype=self.dtype, mode="r", shape=(self.tokens,))

    def read_ends(self) -> np.ndarray:
        if self.documents == 0:
            return np.zeros(0, dtype=np.int64)
        return np.memmap(self.ends, dtype=np.int64, mode="r", shape=(self.documents,))


def _chunks(path: Path, folder: Path) -> Iterator[memoryview]:
    """The bytes of ``path``, CHECK_BYTES at a time, each a view of one buffer (valid until the next)."""
    try:
        with open(path, "rb", buffering=0) as file:
            view = memoryview(bytearray(min(CHECK_BYTES, os.fstat(file.fileno()).st_size)))
            while True:
                n = 0
                while n < len(view) and (got := file.readinto(view[n:])):
                    n += got
                if n == 0:
                    return
                yield view[:n]
    except OSError as error:
        raise damaged(folder, f"{path.name}: {error.strerror}") from None


class PreadFile:
    """Reads items of a file with ``os.pread``: the process holds what it asked for and nothing else
    (pages of a memory map it touched would count in its resident memory, read-ahead included, and grow
    with the corpus over a run). The file is opened in each process that reads it (a DataLoader worker
    gets the path, not an open file). ``cut``: what a read past the end says, ``{}`` its last item."""

    def __init__(self, path: Path, dtype: str, cut: str) -> None:
        self.path, self.dtype, self.cut = path, np.dtype(dtype), cut
        self._fd: int | None = None

    def read(self, first: int, count: int) -> np.ndarray:
        """``count`` items from item ``first`` on."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        size = self.dtype.itemsize
        data = os.pread(self._fd, count * size, first * size)
        if len(data) != count * size:
            raise DataError(
                f"{self.path}: {self.cut.format(first + count)} (the file was cut); remove its folder from the "
                f"cache to prepare the corpus again"
            )
        return np.frombuffer(data, dtype=self.dtype)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fd": None}

    def __del__(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)


class IdReader(PreadFile):
    """A split's ids, read with ``os.pread`` (:class:`PreadFile`)."""

    def __init__(self, split: SplitTokens) -> None:
        super().__init__(split.ids, split.dtype, "the prepared ids end before id {}")

    def read(self, start: int, count: int) -> np.ndarray:
        """``count`` ids from id ``start`` on, as int64."""
        return super().read(start, count).astype(np.int64)


class DocumentEnds:
    """Where a split's documents end, found from its index of document ends (``SplitTokens.ends``) with
    ``os.pread`` (:class:`PreadFile`): every PAGE-th end is held (8 bytes per PAGE documents), the page a
    question falls in is read when asked."""

    PAGE = 1024

    def __init__(self, split: SplitTokens) -> None:
        self.documents = split.documents
        self.file = PreadFile(split.ends, "int64", "the prepared document ends stop before end {}")
        self.firsts = np.array([self.file.read(i, 1)[0] for i in range(0, self.documents, self.PAGE)], dtype=np.int64)

    def within(self, start: int, stop: int) -> np.ndarray:
        """The document ends e with start < e <= stop: the documents whose last id lies in [start, stop)."""
        pages = np.searchsorted(self.firsts, [start, stop], side="right") - 1
        first = max(int(pages[0]), 0) * self.PAGE
        count = min((int(pages[1]) + 1) * self.PAGE, self.documents) - first
        ends = self.file.read(first, count) if count > 0 else np.zeros(0, dtype=np.int64)
        return ends[(ends > start) & (ends <= stop)]


class TokenBlocks(ZooDataset):
    """Blocks of ``block`` consecutive ids of a prepared split, block i at ids[i*block : (i+1)*block]
    (what is left after the last full block is not used), each read from the split's file when asked
    for (:class:`IdReader`). ``documents``: each block comes as (2, block), its ids and, from the split's
    index (:class:`DocumentEnds`), 1 where a document ends (its last id), 0 elsewhere."""

    def __init__(self, split: SplitTokens, block: int, *, documents: bool = False) -> None:
        self.split, self.block = split, block
        self.reader = IdReader(split)
        self.ends = DocumentEnds(split) if documents else None

    def __len__(self) -> int:
        return self.split.tokens // self.block

    def __getitem__(self, i: int) -> Tensor:
        if not -len(self) <= i < len(self):
            raise IndexError(f"block {i} of {len(self)}")
        start = i % len(self) * self.block
        ids = torch.from_numpy(self.reader.read(start, self.block))
        if self.ends is None:
            return ids
        last = torch.zeros(self.block, dtype=torch.int64)
        last[torch.from_numpy(self.ends.within(start, start + self.block) - 1 - start)] = 1
        return torch.stack([ids, last])

    def __getitems__(self, indices: list[int]) -> list[Tensor]:
        """A batch's blocks (the DataLoader asks for a batch at once)."""
        return [self[i] for i in indices]

    @property
    def items(self) -> Tensor:
        """Every block, (n, block) (or (n, 2, block) with ``documents``): for looking at a small split."""
        return torch.stack([self[i] for i in range(len(self))])


class TokenDocuments(ZooDataset):
    """The documents of a prepared split with more than ``longer_than`` ids, each a list of its ids read
    from the split's file when asked for; ``lengths`` (for bucketing) from the split's document ends,
    nothing else held in memory."""

    def __init__(self, split: SplitTokens, longer_than: int = 0) -> None:
        self.split = split
        ends = np.asarray(split.read_ends())
        starts = np.concatenate([np.zeros(1, dtype=np.int64), ends[:-1]])
        keep = np.flatnonzero(ends - starts > longer_than)
        self.starts, self.ends = starts[keep], ends[keep]
        self.lengths = (self.ends - self.starts).tolist()
        self.reader = IdReader(split)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> list[int]:
        start = int(self.starts[i])
        return self.reader.read(start, int(self.ends[i]) - start).tolist()

    @property
    def items(self) -> list[list[int]]:
        """Every document's ids: for looking at a small split."""
        return [self[i] for i in range(len(self))]
