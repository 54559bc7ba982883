"""Safe file I/O for weights: atomic writes and the one weights-only loader.

- ``atomic_write(path)`` yields a temporary path in the target's own folder; on success the file is
  flushed to disk and renamed over ``path`` in one step, so a crash, a kill or a full disk leaves
  either the previous file or the new one, never a truncated mix.
- ``atomic_folder(folder)`` does the same for a whole folder: the caller fills a temporary sibling
  (``.<name>.zoo-<pid>-<random>.tmp``), renamed into place at the end; a killed writer's sibling is
  removed by the next writer of that folder that succeeds.
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
import fcntl
import json
import os
import pickle
import re
import shutil
import stat
import tempfile
import typing
import zipfile
from collections.abc import Callable, Iterator, Sequence
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
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, path)
        except OSError as error:
            raise _renamed(error, tmp, path) from None
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


def _renamed(error: OSError, written: Path, meant: Path) -> OSError:
    """``error`` naming ``meant`` (or the same place below it) where it names ``written``, a temporary
    stand-in (a temporary file, a staged folder): the user knows only the path they asked for."""
    if error.errno is None or not isinstance(error.filename, (str, os.PathLike)):
        return error
    try:
        inside = Path(error.filename).relative_to(written)
    except ValueError:
        return error
    return OSError(error.errno, error.strerror, os.fspath(meant / inside))


# ---- whole folders --------------------------------------------------------------------------------
def check_folder_path(folder: Path) -> None:
    """Raise a FileExistsError (its message names the path and the fix) unless ``folder`` can become
    a folder that zoo fills: not a symbolic link, not a file, and not below a file."""
    if folder.is_symlink():
        raise FileExistsError(
            f"{folder} is a symbolic link; pass the folder it points to ({os.readlink(folder)}) or a new path"
        )
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{folder} is a file, not a folder; choose a folder (it is created if missing)")
    for parent in folder.parents:
        if parent.is_symlink() and not parent.exists():
            raise FileExistsError(f"{folder} is below {parent}, a broken symbolic link; choose another path")
        if parent.exists():
            if not parent.is_dir():
                raise FileExistsError(f"{folder} is below {parent}, which is a file; choose another path")
            return


@contextlib.contextmanager
def atomic_folder(folder: str | os.PathLike, *, merge: bool = False, last: Sequence[str] = ()) -> Iterator[Path]:
    """Write a folder all at once: the caller fills the yielded temporary sibling; on success every
    file is fsynced and the sibling takes the name ``folder`` in one rename (with the mode a plain
    mkdir gives, or that of the empty folder it replaces); on failure it is removed and ``folder``
    is untouched. An existing non-empty ``folder`` is refused unless ``merge``: then each file moves
    into it by its own atomic rename (those named in ``last`` last, in that order) and nothing else
    in it is touched. A sibling left by a killed writer of ``folder`` (its process gone and its
    lock free) is removed after a success. OSErrors about the sibling name ``folder``."""
    folder = Path(folder)
    check_folder_path(folder)
    if not merge and _has_files(folder):
        raise FileExistsError(f"{folder}: exists and is not an empty folder; choose a new one (nothing is overwritten)")
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        stage = Path(
            tempfile.mkdtemp(prefix=_stage_prefix(folder) + f"{os.getpid()}-", suffix=".tmp", dir=folder.parent)
        )
    except OSError as error:
        raise OSError(error.errno, error.strerror, os.fspath(folder)) from None
    lock = os.open(stage, os.O_RDONLY)
    fcntl.flock(lock, fcntl.LOCK_EX)  # while held, no other writer takes this sibling for a dead one's
    try:
        try:
            yield stage
            _commit(stage, folder, last)
        except OSError as error:
            raise _renamed(error, stage, folder) from None
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    finally:
        os.close(lock)
    fsync_dir(folder.parent)
    remove_stale_stages(folder)


def _has_files(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


def _stage_prefix(folder: Path) -> str:
    return f".{folder.name[:200]}.zoo-"


def _commit(stage: Path, folder: Path, last: Sequence[str]) -> None:
    """Move the finished ``stage`` into ``folder``: one rename when ``folder`` is missing or empty
    (an empty mount point, which cannot be replaced, is filled file by file), else file by file."""
    for file in stage.iterdir():
        with open(file, "rb") as f:
            os.fsync(f.fileno())
    empty = folder.is_dir() and not _has_files(folder)
    os.chmod(stage, stat.S_IMODE(folder.stat().st_mode) if empty else 0o777 & ~_umask())
    if not _has_files(folder):
        try:
            os.replace(stage, folder)
            return
        except OSError as error:
            if error.errno != errno.EBUSY:
                raise
    names = sorted(p.name for p in stage.iterdir())
    ordered = [n for n in names if n not in last] + [n for n in last if n in names]
    for name in ordered:
        os.replace(stage / name, folder / name)
    fsync_dir(folder)
    stage.rmdir()


def remove_stale_stages(folder: Path) -> list[Path]:
    """Remove (and return) the temporary siblings that ``atomic_folder`` writers of ``folder`` left
    when they were killed: only folders named by its scheme, whose process is gone and whose lock
    is free (a live writer holds it, in any PID namespace)."""
    prefix, removed = _stage_prefix(folder), []
    with contextlib.suppress(OSError):
        for entry in folder.parent.iterdir():
            found = re.fullmatch(r"(\d+)-[a-z0-9_]+\.tmp", entry.name.removeprefix(prefix))
            if not entry.name.startswith(prefix) or found is None or entry.is_symlink() or not entry.is_dir():
                continue
            if _process_alive(int(found.group(1))) or _locked(entry):
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's process, or no pid at all: not ours to judge
    return True


def _locked(folder: Path) -> bool:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False
