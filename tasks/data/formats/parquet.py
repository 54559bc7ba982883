"""The ``parquet`` format: Apache Parquet files, read by HF ``datasets``."""

from __future__ import annotations

from pathlib import Path

from tasks.data.formats.base import FORMATS
from tasks.data.formats.hf_datasets import DatasetsFormat
from tasks.errors import DataError


@FORMATS.register("parquet")
class Parquet(DatasetsFormat):
    """.parquet files, a record per row (HF datasets' parquet builder, through pyarrow)."""

    suffixes = (".parquet",)
    builder = "parquet"

    @classmethod
    def check_bytes(cls, file: Path, head: bytes) -> None:
        if not head.startswith(b"PAR1"):
            raise DataError(f"{file}: not a parquet file (it does not start with PAR1); convert it or rename it")
