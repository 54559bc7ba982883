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
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pickle
import re
import shutil
import stat
import tempfile
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
