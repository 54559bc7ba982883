"""Safe file I/O for weights: atomic writes and the one weights-only loader.

- ``atomic_write(path)`` yields a temporary path in the target's own folder; on success the file is
  flushed to disk and renamed over ``path`` in one step, so a crash, a kill or a full disk leaves
  either the previous file or the new one, never a truncated mix.
- ``load_weights_file(path)`` is how zoo (and every verb above it) reads a ``torch.save`` file: it
  refuses URLs, says what is wrong with a missing, empty, text or truncated file in one line, and
  only ever unpickles with ``weights_only=True`` (plain data and tensors; no code can run).
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


class CheckpointError(ValueError):
    """A weights file that cannot be used. The message names the file and what to do."""


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[Path]:
    """Write ``path`` all at once: the caller writes to the yielded temporary path (same folder,
    so the rename never crosses filesystems); it is fsynced and renamed over ``path`` on success,
    removed on failure (the previous ``path``, if any, is untouched). The new file gets the mode a
    plain ``open(path, "w")`` would give it (0666 minus the umask), not mkstemp's 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` through ``atomic_write``. A failed write (torch reports a full disk or a file
    size limit as a RuntimeError) is an OSError naming ``path``."""
    with atomic_write(path) as tmp:
        try:
            torch.save(obj, tmp)
        except RuntimeError as error:
            if not any(s in str(error) for s in ("unexpected pos", "PytorchStreamWriter", "write")):
                raise
            code = errno.ENOSPC if shutil.disk_usage(tmp.parent).free < 64 * 2**20 else errno.EIO
            raise OSError(code, "the write failed (a full disk or a file size limit?)", os.fspath(path)) from None


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_write(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def load_weights_file(path: str | os.PathLike, map_location: Any = "cpu", *, what: str = "checkpoint") -> Any:
    """Read a ``torch.save`` file with ``weights_only=True``; every problem is a CheckpointError
    whose message names the file (``what`` says which kind of file was expected)."""
    text = os.fspath(path)
    if "://" in text:
        raise CheckpointError(f"{text}: {what} URLs are not read (a download would bypass the weights-only check); "
                              f"download the file first and pass its local path")
    path = Path(text).expanduser()
    if not path.exists():
        raise CheckpointError(f"{path}: no such {what} file; check the path")
    if path.is_dir():
        hint = _checkpoints_in(path)
        raise CheckpointError(f"{path} is a directory, not a {what} file{hint}")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"{path}: the {what} file is empty (0 bytes; an interrupted write?); use another one")
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:2] != b"PK" and head[:1] != b"\x80":  # a zip archive (torch.save) or a legacy pickle
        raise CheckpointError(f"{path} is not a {what} written by torch.save (it starts with {head!r}); "
                              f"check the path")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:  # torch's own message suggests weights_only=False: never do that
        found = re.search(r"GLOBAL ([\w.]+)", str(error))
        what = f"it names {found.group(1)}" if found else "it is not plain data"
        raise CheckpointError(f"{path} holds objects other than plain data and tensors, which zoo never unpickles "
                              f"({what}); load only checkpoints that zoo wrote") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as error:
        raise CheckpointError(f"{path}: the {what} file is damaged or truncated ({_short(str(error))}); "
                              f"use another checkpoint") from None


def _short(message: str, limit: int = 160) -> str:
    line = " ".join(message.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _checkpoints_in(folder: Path) -> str:
    found = sorted(folder.glob("*.ckpt")) or sorted(folder.glob("checkpoints/*.ckpt"))
    if not found:
        return ""
    names = ", ".join(str(p) for p in found[:3])
    return f"; it holds {names}{'…' if len(found) > 3 else ''}"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
