"""The data file formats zoo reads, one module each (text, csv, json, parquet), registered in
:data:`FORMATS` (base.py) by name; a local source's files are read by the format of their suffix."""

from tasks.data.formats import csv, json, parquet, text  # noqa: F401  (each registers its format)
from tasks.data.formats.base import FORMATS, FileFormat, Rows, data_types, format_of

__all__ = ["FORMATS", "FileFormat", "Rows", "data_types", "format_of"]
