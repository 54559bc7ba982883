"""Where text comes from, one module per kind of source, each registered in :data:`SOURCES` (base.py):
offline.py (the standard library's code and docstrings, number words, gettext catalogs: real text on
any machine with Python), local.py (the user's files, read by the format of their suffix:
tasks/data/formats/) and hub.py (HF datasets)."""

from tasks.data.sources import hub, local, offline  # noqa: F401  (each registers its sources)
from tasks.data.sources.base import (
    SOURCES,
    Source,
    check_source,
    check_texts,
    load_records,
    source_identity,
    source_windows,
    split_of,
    stream_records,
)

__all__ = [
    "SOURCES",
    "Source",
    "check_source",
    "check_texts",
    "load_records",
    "source_identity",
    "source_windows",
    "split_of",
    "stream_records",
]
