"""A prepared corpus' splits as files of token ids, and how training reads them: ``SplitTokens`` names a
split's files (its ids, ``uint16`` or ``uint32``, and the ``int64`` end of each document); ``TokenBlocks``
(language modelling) and ``TokenDocuments`` (masked LM) read a batch's ids with ``os.pread``
(``IdReader``), so that a process holds its batches and no page of the corpus."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tasks.data.loading import ZooDataset
from tasks.errors import DataError


@dataclass(frozen=True)
class SplitTokens:
    """One split of a prepared corpus: ``tokens`` ids in ``ids`` (of ``dtype``), and the end offset of
    each of its ``documents`` in ``ends``."""

    ids: Path
    ends: Path
    dtype: str
    tokens: int
    documents: int

    def read_ids(self) -> np.ndarray:
        """The ids as a read-only memory map (an empty array for an empty split)."""
        if self.tokens == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(self.ids, dtype=self.dtype, mode="r", shape=(self.tokens,))

    def read_ends(self) -> np.ndarray:
        if self.documents == 0:
            return np.zeros(0, dtype=np.int64)
        return np.memmap(self.ends, dtype=np.int64, mode="r", shape=(self.documents,))


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
