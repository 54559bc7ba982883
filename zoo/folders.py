"""Whole folders written at once: ``atomic_folder(folder)`` yields a temporary sibling
(``.<name>.zoo-<pid>-<random>.tmp``) that the caller fills; it takes the folder's name in one rename
at the end (or, merging into a folder that has files, each file by its own rename), and a killed
writer's sibling is removed by the next writer of that folder that succeeds. Single files: zoo.io.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from zoo.io import current_umask, fsync_dir, named_as_meant


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
            raise named_as_meant(error, stage, folder) from None
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
    os.chmod(stage, stat.S_IMODE(folder.stat().st_mode) if empty else 0o777 & ~current_umask())
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
