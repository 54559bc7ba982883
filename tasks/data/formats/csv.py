"""The ``csv`` format: comma-separated files with a header row, read by HF ``datasets``."""

from __future__ import annotations

from pathlib import Path

from tasks.data.formats.base import FORMATS
from tasks.data.formats.hf_datasets import DatasetsFormat
from tasks.data.formats.utf8 import decoded


@FORMATS.register("csv")
class Csv(DatasetsFormat):
    """.csv files, a record per row (HF datasets' csv builder, through pandas)."""

    suffixes = (".csv",)
    builder = "csv"

    @classmethod
    def diagnose(cls, file: Path) -> None:
        for _ in decoded(file):  # a DataError at the first byte that is not UTF-8
            pass
