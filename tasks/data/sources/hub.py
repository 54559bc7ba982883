"""The ``hub`` source: a dataset on the Hugging Face hub (needs network access the first time), or a
local folder of data files that ``datasets.load_dataset`` reads the same way, read one record at a time."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tasks.data.formats import Rows
from tasks.data.formats.hf_datasets import cause, disk_error
from tasks.data.sources.base import SOURCES, Source, renamed
from tasks.data.sources.local import visible_files
from tasks.errors import DataError


@SOURCES.register("hub")
class Hub(Source):
    """The rows of dataset ``name`` (its ``subset`` and ``split``); ``streaming``: read shard by shard as
    they are iterated (``load_dataset(streaming=True)``), never converted or held whole. ``fields``
    renames columns, e.g. ``text="sentence"``."""

    streams = True
    renames = True

    def __init__(
        self, name: str, split: str = "train", subset: str | None = None, streaming: bool = False, **fields: str
    ) -> None:
        self.name, self.split, self.subset, self.streaming, self.fields = name, split, subset, streaming, fields

    def records(self) -> Iterator[dict[str, Any]]:
        dataset = self.load(streaming=self.streaming)
        columns = dataset.column_names
        if columns is None:  # a stream whose files do not say their columns: the first row does
            rows = iter(dataset)
            first = next(rows, None)
            columns = list(first) if first is not None else []
            dataset = itertools.chain([first] if first is not None else [], rows)
        return renamed(Rows(dataset, columns), self.fields, f"hub dataset {self.name!r}")

    def identity(self) -> Any:
        """A local folder's files (path, size, modification time); a dataset of the hub cache, its cached
        files' fingerprint (``Dataset._fingerprint``); None for a stream from the hub, whose records are
        then hashed as they are read."""
        folder = Path(self.name).expanduser()
        if folder.is_dir():
            files = visible_files(folder)
            known = [(str(f.relative_to(folder)), (info := f.stat()).st_size, info.st_mtime_ns) for f in files]
            return [self.name, self.split, self.subset, self.fields, known]
        if self.streaming:
            return None
        return [self.name, self.split, self.subset, self.fields, self.load(streaming=False)._fingerprint]

    def size(self) -> tuple[int, int] | None:
        """How many data files a local folder holds, and their bytes; None for a dataset of the hub."""
        folder = Path(self.name).expanduser()
        if not folder.is_dir():
            return None
        files = visible_files(folder)
        return len(files), sum(f.stat().st_size for f in files)

    def load(self, *, streaming: bool) -> Any:
        from datasets import load_dataset

        try:
            return load_dataset(self.name, self.subset, split=self.split, streaming=bool(streaming))
        except Exception as error:
            if disk_error(error):
                raise
            raise DataError(
                f"data.source_args.name={self.name}: the hub dataset cannot be loaded ({cause(error)}); check "
                f"name, subset and split, and that this machine is online (or has it cached)"
            ) from error
