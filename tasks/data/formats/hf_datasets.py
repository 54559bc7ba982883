"""The formats HF ``datasets`` reads (csv, json, parquet) share :class:`DatasetsFormat`: a row at a time
from its memory-mapped Arrow cache, and when it cannot read the files, a DataError naming the file (and
the line) at fault; a full disk is not the data's fault and is raised as it is."""

from __future__ import annotations

import codecs
import errno
from pathlib import Path
from typing import Any, ClassVar

from tasks.data.formats.base import FileFormat, Rows
from tasks.data.formats.utf8 import decode, open_data
from tasks.errors import DataError

HEAD_BYTES = 1 << 13  # how much of a file is checked before HF datasets reads it
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}  # writing HF datasets' cache failed


class DatasetsFormat(FileFormat):
    """A format HF ``datasets`` reads (its builder of the same ``builder`` name): a row at a time from
    its memory-mapped Arrow cache. When it cannot read the files, ``diagnose`` looks for what is wrong
    with each, to name the file (and the line) at fault."""

    builder: ClassVar[str]
    utf8: ClassVar[bool] = True  # a text format: its head must be UTF-8

    @classmethod
    def check_head(cls, file: Path) -> None:
        with open_data(file) as f:
            head = f.read(HEAD_BYTES)
        cls.check_bytes(file, head)

    @classmethod
    def check_bytes(cls, file: Path, head: bytes) -> None:
        """Refuse a file whose first HEAD_BYTES are plainly not of the format (binary or non-UTF-8 text)."""
        decode(file, codecs.getincrementaldecoder("utf-8")(), head, 0, final=len(head) < HEAD_BYTES)

    @classmethod
    def diagnose(cls, file: Path) -> None:
        """Raise a DataError naming what is wrong with ``file`` (which HF datasets failed to read), if this
        finds it; by default it looks no further."""
        return None

    @classmethod
    def rows(cls, files: list[Path], root: Path, sample_by: str) -> Rows:
        dataset = cls.read(files)
        return Rows(dataset, dataset.column_names)

    @classmethod
    def read(cls, files: list[Path]) -> Any:
        """``files`` as one HF ``datasets`` Dataset; when they cannot be read, a DataError naming the file
        (and for JSON the line) at fault."""
        try:
            return cls.load_quietly(files)
        except Exception as error:
            if disk_error(error):
                raise
            for file in files:
                cls.diagnose(file)
                if len(files) > 1:
                    cls.read_alone(file)
            where = files[0] if len(files) == 1 else f"the {cls.builder} files of {files[0].parent}"
            raise DataError(
                f"{where}: HF datasets cannot read {'it' if len(files) == 1 else 'them together'} "
                f"({cause(error)}); fix the data or point data.source_args.path at other files"
            ) from error

    @classmethod
    def read_alone(cls, file: Path) -> None:
        """A DataError naming ``file`` when HF datasets cannot read it by itself."""
        try:
            cls.load_quietly([file])
        except Exception as error:
            if disk_error(error):
                raise
            raise DataError(
                f"{file}: HF datasets cannot read it ({cause(error)}); fix the file or move it out"
            ) from error

    @classmethod
    def load_quietly(cls, files: list[Path]) -> Any:
        """load_dataset without its progress bars and error logs (a failure is reported in one line)."""
        import datasets

        verbosity, bars = datasets.logging.get_verbosity(), datasets.is_progress_bar_enabled()
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)
        datasets.disable_progress_bars()
        try:
            return datasets.load_dataset(cls.builder, data_files=[str(f) for f in files], split="train")
        finally:
            datasets.logging.set_verbosity(verbosity)
            if bars:
                datasets.enable_progress_bars()


def cause(error: BaseException) -> str:
    """The first line of the error under HF datasets' wrapper, e.g. pandas' or pyarrow's."""
    chain = [error]
    while (nxt := chain[-1].__cause__ or chain[-1].__context__) is not None and len(chain) < 10:
        chain.append(nxt)
    inner = next((e for e in chain if not type(e).__module__.startswith("datasets")), error)
    lines = str(inner).strip().splitlines() or [type(inner).__name__]
    return lines[0][:300]


def disk_error(error: BaseException) -> bool:
    """Whether writing the datasets cache failed (the verb reports a full disk itself)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in DISK_ERRNOS:
            return True
        error = error.__cause__ or error.__context__
    return False
