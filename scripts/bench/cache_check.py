"""zoo-bench cache-check: what checking a prepared corpus costs a run before it trains, at a given size.

    python scripts/bench/cache_check.py --gb 1

A split of ``--gb`` GB (10^9 bytes) of uint16 ids is written into a temporary folder beside its
document ends (one document per 512 ids) and their CRC-32s, as tasks/data/prepared.py writes a split;
then ``SplitTokens.check`` (sizes, document ends, every id below the vocabulary, CRC-32) is timed
twice: with the files in the page cache (a run started again soon after the last), and with their
pages dropped first (``posix_fadvise(DONTNEED)``: read from the disk, as the first run after a reboot).
The folder is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from tasks.data.token_files import SplitTokens, crc32_of

VOCAB = 32_000
DOC = 512  # ids per document
BLOCK = 1 << 26  # ids written at once (128 MB)


def write_split(folder: Path, tokens: int) -> SplitTokens:
    """A split of ``tokens`` random ids below VOCAB, its ends, and their CRC-32s."""
    rng, crc_ids, crc_ends = np.random.default_rng(0), 0, 0
    with open(folder / "train.ids", "wb") as ids, open(folder / "train.ends", "wb") as ends:
        for first in range(0, tokens, BLOCK):
            block = rng.integers(0, VOCAB, min(BLOCK, tokens - first), dtype=np.uint16)
            ids.write(block.data)
            crc_ids = crc32_of(block.data, crc_ids)
        stops = np.append(np.arange(DOC, tokens, DOC, dtype=np.int64), np.int64(tokens))
        ends.write(stops.data)
        crc_ends = crc32_of(stops.data, crc_ends)
        for file in (ids, ends):
            file.flush()
            os.fsync(file.fileno())
    return SplitTokens(folder / "train.ids", folder / "train.ends", "uint16", tokens, len(stops), (crc_ids, crc_ends))


def drop_pages(split: SplitTokens) -> None:
    for path in (split.ids, split.ends):
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0, help="GB (10^9 bytes) of ids")
    parser.add_argument("--work", default=None, help="where the temporary folder goes (default: the system's)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        split = write_split(Path(work), int(args.gb * 1e9) // 2)
        size = split.ids.stat().st_size + split.ends.stat().st_size
        for label, cold in (("from the disk", True), ("in the page cache", False)):
            if cold:
                drop_pages(split)
            started = time.perf_counter()
            split.check(VOCAB)
            seconds = time.perf_counter() - started
            print(f"{size / 1e9:.2f} GB checked {label}: {seconds:.2f} s ({size / 1e9 / seconds:.2f} GB/s)")


if __name__ == "__main__":
    main()
