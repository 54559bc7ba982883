"""The ``json`` format: JSON Lines files (.jsonl, or .json holding one object per line or one JSON
document), read by HF ``datasets``; a line that is not a JSON object is a DataError naming the line."""

from __future__ import annotations

import json
from pathlib import Path

from tasks.data.formats.base import FORMATS
from tasks.data.formats.hf_datasets import DatasetsFormat
from tasks.data.formats.utf8 import decoded
from tasks.errors import DataError


@FORMATS.register("json")
class Json(DatasetsFormat):
    """.jsonl and .json files, a record per object (HF datasets' json builder)."""

    suffixes = (".jsonl", ".json")
    builder = "json"

    @classmethod
    def diagnose(cls, file: Path) -> None:
        for _ in decoded(file):  # a DataError at the first byte that is not UTF-8
            pass
        check_json(file)


def check_json(file: Path) -> None:
    """A DataError at the first line of a JSON Lines file that is not a JSON object (a .json file may
    also be one JSON document)."""
    if file.suffix.lower() == ".json":
        try:
            json.loads(file.read_text(encoding="utf-8"))
            return
        except json.JSONDecodeError as error:
            if not error.msg.startswith("Extra data"):  # more than one document: JSON Lines
                raise DataError(f"{file} line {error.lineno}: not valid JSON ({error.msg}); fix it") from None
    with file.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(
                    f"{file} line {number}: not valid JSON ({error.msg}); fix or remove the line "
                    f"(JSON Lines: one object per line)"
                ) from None
            if not isinstance(value, dict):
                raise DataError(
                    f"{file} line {number}: a JSON {type(value).__name__}, not an object; write one "
                    f'object per line, e.g. {{"text": "..."}}'
                )
