"""Examples held compactly in memory. The classifier's and the translator's examples (records, not a
stream to memory-map) keep their token ids in one flat array per column with each example's offsets:
2 or 4 bytes a token, where a list of Python ints takes about 36. An example comes out as lists, as
the tasks' collate functions and tests read it; nothing else about it changes."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tasks.data.loading import ZooDataset


def id_width(vocab_size: int) -> type[np.unsignedinteger]:
    """The narrowest unsigned type that holds every id of a vocabulary of ``vocab_size``."""
    return np.uint16 if vocab_size <= 2**16 else np.uint32


class Ragged:
    """Sequences of ids of different lengths, built from batches of sequences (lists of lists) one batch
    at a time: each batch's ids in one array (a sequence never spans two), with the end of each sequence
    counted over all of them (``ends``). The batches' arrays are kept as they are, never joined: building
    holds the ids once, not twice."""

    def __init__(self, batches: Iterable[list[list[int]]], width: type[np.unsignedinteger]) -> None:
        self.chunks, lengths, self.width = [], [], width
        for batch in batches:
            sizes = [len(seq) for seq in batch]
            self.chunks.append(np.fromiter(itertools.chain.from_iterable(batch), dtype=width, count=sum(sizes)))
            lengths += sizes
        self.ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
        self.firsts = np.cumsum([0] + [len(c) for c in self.chunks[:-1]], dtype=np.int64)  # each chunk's first id
        self.lengths: list[int] = lengths

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.width)

    @property
    def nbytes(self) -> int:
        return sum(chunk.nbytes for chunk in self.chunks)

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, i: int) -> list[int]:
        start, end = int(self.ends[i - 1]) if i > 0 else 0, int(self.ends[i])
        chunk = int(np.searchsorted(self.firsts, start, side="right")) - 1
        first = int(self.firsts[chunk])
        return self.chunks[chunk][start - first : end - first].tolist()


class ColumnDataset(ZooDataset):
    """Examples as tuples, one value from each column: a :class:`Ragged` of ids, or a plain sequence
    (labels, reference texts). ``lengths``: each example's, for length bucketing."""

    def __init__(self, columns: Sequence[Sequence[Any] | Ragged], lengths: Sequence[int]) -> None:
        self.columns, self.lengths = list(columns), lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        return tuple(column[i] for column in self.columns)

    @property
    def items(self) -> list[tuple[Any, ...]]:
        """Every example, as lists: for looking at a small split."""
        return [self[i] for i in range(len(self))]
