"""Safe file I/O for weights: atomic writes and the one weights-only loader.

- ``atomic_write(path)`` yields a temporary path in the target's own folder; on success the file is
  flushed to disk and renamed over ``path`` in one step, so a crash, a kill or a full disk leaves
  either the previous file or the new one, never a truncated mix.
- ``zoo.folders.atomic_folder(folder)`` does the same for a whole folder.
- ``load_weights_file(path)`` is how zoo (and every verb above it) reads a ``torch.save`` file: it
  refuses URLs, says what is wrong with a missing, empty, text or truncated file in one line, and
  only ever unpickles with ``weights_only=True`` (plain data and tensors; no code can run).
- ``read_handed(folder, name, limit)`` / ``handed_path(...)`` is how zoo reads a file out of a folder
  a user hands it (an HF model folder, a zoo model folder): the file must be that folder's own (see
  ``handed_path``), so no link can carry another file's text into what zoo writes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pickle
import re
import shutil
import stat
import tempfile
import typing
import zipfile
from collections.abc import Callable, Iterator
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
    plain ``open(path, "w")`` would give it (0666 minus the umask), not mkstemp's 0600. An OSError
    about the temporary file names ``path`` instead."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        try:
            yield tmp
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~current_umask())
            os.replace(tmp, path)
        except OSError as error:
            raise named_as_meant(error, tmp, path) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_with(path: str | os.PathLike, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` (a library call that writes a file by its path: safetensors, tokenizers, torch)
    through ``atomic_write``. A failed write that the library reports in an exception of its own
    (safetensors and tokenizers end their message with ``(os error N)``) is an OSError naming ``path``."""
    with atomic_write(path) as tmp, naming(tmp):
        try:
            write(tmp)
        except OSError:
            raise
        except Exception as error:
            found = re.search(r"\(os error (\d+)\)", str(error))
            if found is None:
                raise
            code = int(found.group(1))
            raise OSError(code, os.strerror(code), os.fspath(tmp)) from None


@contextlib.contextmanager
def naming(path: str | os.PathLike) -> Iterator[None]:
    """An OSError that names no file (a failed ``f.write`` inside a library) names ``path``."""
    try:
        yield
    except OSError as error:
        if error.errno is None or error.filename is not None:
            raise
        raise OSError(error.errno, error.strerror, os.fspath(path)) from None


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
        raise CheckpointError(
            f"{text}: {what} URLs are not read (a download would bypass the weights-only check); "
            f"download the file first and pass its local path"
        )
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
        raise CheckpointError(f"{path} is not a {what} written by torch.save (it starts with {head!r}); check the path")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:  # torch's own message suggests weights_only=False: never do that
        found = re.search(r"GLOBAL ([\w.]+)", str(error))
        what = f"it names {found.group(1)}" if found else "it is not plain data"
        raise CheckpointError(
            f"{path} holds objects other than plain data and tensors, which zoo never unpickles "
            f"({what}); load only checkpoints that zoo wrote"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as error:
        raise CheckpointError(
            f"{path}: the {what} file is damaged or truncated ({_short(str(error))}); use another checkpoint"
        ) from None


# ---- files of a handed folder ----------------------------------------------------------------------
MiB = 2**20
JSON_LIMIT = 16 * MiB
"""config.json, generation_config.json, tokenizer_config.json, special_tokens_map.json, chat_template.json:
the largest real ones (a tokenizer_config.json listing thousands of added tokens) are a few MB."""
INDEX_LIMIT = 64 * MiB
"""A weight index (``*.index.json``): one line per tensor, some 100 kB for a model of a thousand tensors."""
TEMPLATE_LIMIT = 4 * MiB
"""chat_template.jinja: real templates are a few kB to some 100 kB."""
TOKENIZER_LIMIT = 256 * MiB
"""tokenizer.json: the largest vocabularies (Gemma 3's 262k tokens) are some 35 MB."""


def handed_path(
    folder: str | os.PathLike, name: str, *, limit: int | None, error: type[Exception] = CheckpointError
) -> Path | None:
    """The real path of the file ``name`` in the handed ``folder``, checked before anything is read;
    None when there is no such file (nor a link by that name to one). Raises ``error`` naming the
    file and why, unless the file is the folder's own:

    - it resolves inside ``folder`` (a symbolic link may point to another file of the folder). A
      folder of the Hugging Face hub cache (``<repo>/snapshots/<revision>/``) holds links to
      ``<repo>/blobs/<hash>``: a link into that ``blobs`` folder is the folder's own too;
    - it is a regular file: not a FIFO (a read would wait forever), a device or a folder;
    - it has no other name outside those folders: a hard link has ``st_nlink > 1``, and the file is
      refused unless every one of its names is found in ``folder`` (or the cache's ``blobs``);
    - it holds at most ``limit`` bytes (None: no limit, for weights whose own header bounds them).

    The checks use ``stat`` on the resolved path (a FIFO or a device is never opened);
    :func:`read_handed` checks again on the file it opens."""
    path = Path(folder) / name
    if not os.path.lexists(path):
        return None
    try:
        real = Path(os.path.realpath(path))
        info = os.stat(real)
    except FileNotFoundError:
        return None  # a link to nothing: the file is missing, as the caller says
    except OSError as err:
        raise error(f"{path}: cannot be read ({err.strerror}); fix the folder or copy the file into it") from None
    roots = handed_roots(folder)
    if not any(real.is_relative_to(root) for root in roots):
        raise error(
            f"{path}: a symbolic link to {real}, outside the folder; zoo reads only the folder's own "
            f"files: copy the file into the folder in place of the link"
        )
    _check_handed(path, info, roots, limit, error)
    return real


def read_handed(
    folder: str | os.PathLike, name: str, *, limit: int, error: type[Exception] = CheckpointError
) -> bytes | None:
    """The bytes of the file ``name`` in the handed ``folder`` (:func:`handed_path` says which files
    are refused), None when there is none. The file is opened without blocking and checked again
    through its descriptor, so a file swapped for a FIFO or a larger one after the check is refused too."""
    real = handed_path(folder, name, limit=limit, error=error)
    if real is None:
        return None
    path = Path(folder) / name
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as err:
        raise error(f"{path}: cannot be read ({err.strerror}); fix the folder or copy the file into it") from None
    with os.fdopen(fd, "rb") as f:
        _check_handed(path, os.fstat(fd), handed_roots(folder), limit, error)
        data = f.read(limit + 1)
    if len(data) > limit:
        _too_large(path, len(data), limit, error)
    return data


def handed_roots(folder: str | os.PathLike) -> list[Path]:
    """Where the files of the handed ``folder`` may be: the folder itself and, for a snapshot of the
    Hugging Face hub cache (``<repo>/snapshots/<revision>``), that repo's ``blobs`` folder."""
    real = Path(os.path.realpath(folder))
    roots = [real]
    if real.parent.name == "snapshots" and (real.parent.parent / "blobs").is_dir():
        roots.append(real.parent.parent / "blobs")
    return roots


def parse_json(data: bytes | str) -> Any:
    """``json.loads`` of a handed file's text; JSON nested so deep that parsing it would exhaust
    Python's recursion (a real file nests a few levels) is a ValueError, as any other JSON that
    cannot be read."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deep to parse (a real one nests a few levels)") from None


def _check_handed(
    path: Path, info: os.stat_result, roots: list[Path], limit: int | None, error: type[Exception]
) -> None:
    if not stat.S_ISREG(info.st_mode):
        what = "a folder" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a device"
        raise error(f"{path}: {what}, not a regular file; put the file itself in the folder")
    if info.st_nlink > 1 and _names_in(roots, info) < info.st_nlink:
        raise error(
            f"{path}: a hard link ({info.st_nlink} names) to a file that also has a name outside the "
            f"folder; zoo reads only the folder's own files: replace it by a copy (cp --remove-destination)"
        )
    if limit is not None and info.st_size > limit:
        _too_large(path, info.st_size, limit, error)


def _names_in(roots: list[Path], info: os.stat_result) -> int:
    """How many names of the file ``info`` describes are in ``roots`` (their top level)."""
    found = 0
    for root in roots:
        with contextlib.suppress(OSError), os.scandir(root) as entries:
            for entry in entries:
                seen = entry.stat(follow_symlinks=False)
                found += (seen.st_dev, seen.st_ino) == (info.st_dev, info.st_ino)
    return found


def _too_large(path: Path, size: int, limit: int, error: type[Exception]) -> typing.NoReturn:
    raise error(
        f"{path}: {size:,} bytes, more than the {limit // MiB} MiB such a file may hold; it is not the "
        f"file its name says: restore it"
    )


def _short(message: str, limit: int = 160) -> str:
    line = " ".join(message.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _checkpoints_in(folder: Path) -> str:
    found = sorted(folder.glob("*.ckpt")) or sorted(folder.glob("checkpoints/*.ckpt"))
    if not found:
        return ""
    names = ", ".join(str(p) for p in found[:3])
    return f"; it holds {names}{'…' if len(found) > 3 else ''}"


def current_umask() -> int:
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


def named_as_meant(error: OSError, written: Path, meant: Path) -> OSError:
    """``error`` naming ``meant`` (or the same place below it) where it names ``written``, a temporary
    stand-in (a temporary file, a staged folder): the user knows only the path they asked for."""
    if error.errno is None or not isinstance(error.filename, (str, os.PathLike)):
        return error
    try:
        inside = Path(error.filename).relative_to(written)
    except ValueError:
        return error
    return OSError(error.errno, error.strerror, os.fspath(meant / inside))
