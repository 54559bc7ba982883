"""Where a zoo-export goes: ``out=`` is a new or empty folder, or one a previous zoo-export wrote
(its config.json carries a ``zoo_export`` record listing the files that export wrote); any other
non-empty folder is refused unless ``overwrite=true``, which still replaces only the files this
export writes. ``out=`` is never a symbolic link, a file, or below a file."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import zoo
from tasks.errors import UserError
from zoo.folders import check_folder_path

RECORD = "zoo_export"  # the key of config.json that marks a folder zoo-export wrote


def exported_files(folder: Path) -> list[str] | None:
    """The files a previous zoo-export recorded in ``folder``'s config.json; None when the folder
    holds no export of ours (no config.json, not JSON, or no ``zoo_export`` record)."""
    path = folder / "config.json"
    if not path.is_file() or path.stat().st_size > 64 * 2**20:
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    entry = record.get(RECORD) if isinstance(record, dict) else None
    files = entry.get("files") if isinstance(entry, dict) else None
    if not isinstance(files, list) or not all(isinstance(name, str) for name in files):
        return None
    return files


def check_out(out: Path) -> None:
    """Refuse an ``out=`` that no export can become: a symbolic link, a file, or a path below a file."""
    try:
        check_folder_path(out)
    except FileExistsError as error:
        raise UserError(f"out={error}") from None


def check_destination(out: Path, files: Sequence[str], *, overwrite: bool) -> None:
    """Refuse ``out=`` when the export could replace a file it did not write: a non-empty folder
    that is no export of ours, or a file of ours that the previous export did not write
    (``overwrite`` allows both: only ``files`` are replaced, nothing is deleted)."""
    check_out(out)
    if not out.is_dir():
        return
    folders = [name for name in files if (out / name).is_dir()]
    if folders:
        raise UserError(
            f"out={out}: {_names(folders)} is a folder where the export writes a file; move it away "
            f"or choose another out="
        )
    if overwrite:
        return
    previous = exported_files(out)
    if previous is None:
        present = sorted(p.name for p in out.iterdir())
        if present:
            raise UserError(
                f"out={out} holds files zoo-export did not write ({_names(present)}); choose a new or "
                f"empty folder, or set overwrite=true to replace {_names(files)} there (nothing else is "
                f"touched)"
            )
        return
    foreign = [name for name in files if name not in previous and os.path.lexists(out / name)]
    if foreign:
        raise UserError(
            f"out={out}: {_names(foreign)} was not written by zoo-export; move it away, or set "
            f"overwrite=true to replace it"
        )


def check_new(out: Path, fmt: str) -> None:
    """Refuse an ``out=`` that is not a new or empty folder (a format that never merges)."""
    check_out(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(
            f"out={out}: format={fmt} writes a new folder and this one is not empty; choose a new or "
            f"empty folder (nothing is overwritten)"
        )


def export_record(out: Path, fmt: str, written: Sequence[str]) -> dict[str, Any]:
    """The ``zoo_export`` record of config.json: the files of this export and those a previous
    export wrote there (still ours, so a later export may replace them)."""
    kept = [name for name in exported_files(out) or [] if os.path.lexists(out / name)]
    return {"format": fmt, "zoo_version": zoo.__version__, "files": sorted({*kept, *written})}


def _names(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
