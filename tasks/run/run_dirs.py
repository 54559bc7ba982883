"""A run's claim on its directory, with no Lightning or torch (Hydra's callbacks use it before a
verb imports them).

- ``claim_run_dir`` makes sure a run never writes into another run's directory, and that one run
  has one writer: the process that claims it holds a lock on its marker until ``release_runs``.
- ``remove_killed_writes``: what a killed atomic write left, removed by the run's one writer.
- ``claim_fresh``: a directory this process creates itself (``name``, ``name_2`` …).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import os
import re
import stat
from pathlib import Path
from typing import Any

from tasks.errors import UserError

RUN_MARKER = ".zoo-run"  # written into a run directory when a run claims it; its writer holds a lock on it


def holds_a_run(folder: Path) -> bool:
    """Whether ``folder`` has files of a zoo-train run (claimed, or from before runs were claimed)."""
    return (folder / RUN_MARKER).exists() or any((folder / p).exists() for p in ("checkpoints", "logs/metrics.csv"))


def claim_run_dir(
    folder: Path, *, resume_from: str | None = None, field: str = "paths.output_dir", dry_run: bool = False
) -> None:
    """Make ``folder`` this run's directory, or raise a UserError when another run's files are in
    it. Resuming from a checkpoint inside ``folder`` continues that run there (allowed), unless
    another process still writes it: the claim holds a lock on the run's marker (``hold_run``).
    ``dry_run``: only refuse, write nothing."""
    folder = Path(folder)
    resuming_here = (
        resume_from is not None and "://" not in resume_from and folder.resolve() in Path(resume_from).resolve().parents
    )
    if holds_a_run(folder) and not resuming_here:
        hint = (
            f"resume it with ckpt_path={folder / 'checkpoints' / 'last.ckpt'}"
            if (folder / "checkpoints" / "last.ckpt").exists()
            else "choose another directory"
        )
        raise UserError(
            f"{field}={folder} holds another run's files; a new run never writes there: leave "
            f"hydra.run.dir at its default (a fresh directory), or {hint}"
        )
    marker = folder / RUN_MARKER
    if resuming_here and (marker.exists() or marker.is_symlink()):
        hold_run(folder, open_marker(marker), keep=not dry_run)  # a dry run refuses a writer that runs, holds nothing
        if not dry_run:
            remove_killed_writes(folder)  # what the interrupted attempt's killed writes left
        return
    if dry_run:
        return
    folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666)
    except FileExistsError:
        if resuming_here:  # a run from before markers, claimed by another resume just now: it holds the lock
            hold_run(folder, open_marker(marker))
            remove_killed_writes(folder)
            return
        raise UserError(
            f"{field}={folder} was claimed by another run that started at the same time; start "
            f"again (a fresh directory is chosen)"
        ) from None
    hold_run(folder, fd)
    remove_killed_writes(folder)


WHOLE_WRITES = {".": ("tokenizer.json", "config.yaml"), "logs": ("metrics.csv",), "checkpoints": ("*.ckpt",)}
"""The files zoo-train writes whole (zoo.io.atomic_write) in each folder of a run directory: a temporary
``.<name>.<8 characters>.tmp`` of one of them is what a killed write left."""
KILLED_WRITE = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")


def remove_killed_writes(folder: Path) -> list[Path]:
    """Remove (and return) the temporary files that writes killed mid-way (kill -9, a power cut) left in the
    run directory ``folder``: only zoo.io.atomic_write's names of the files in :data:`WHOLE_WRITES`, plain
    files, never a link or another file. Called by the run's one writer once it holds the run, so no
    write of that run is under way."""
    removed = []
    for sub, names in WHOLE_WRITES.items():
        with contextlib.suppress(OSError):
            for entry in (folder / sub).iterdir():
                found = KILLED_WRITE.fullmatch(entry.name)
                if found is None or not any(fnmatch.fnmatchcase(found["name"], name) for name in names):
                    continue
                if entry.is_symlink() or not entry.is_file():
                    continue
                entry.unlink(missing_ok=True)
                removed.append(entry)
    return removed


def open_marker(marker: Path) -> int:
    """The run's marker opened read-write, refused (UserError) unless it is a plain file of its own:
    not a link to a file elsewhere, which writing the pid into would change."""
    try:
        fd = os.open(marker, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        fd = None
    if fd is not None and stat.S_ISREG(os.fstat(fd).st_mode) and os.fstat(fd).st_nlink == 1:
        return fd
    if fd is not None:
        os.close(fd)
    raise UserError(
        f"{marker} is not a plain file (a link or another kind); a run directory that zoo-train made "
        f"has none such: resume only a run directory you trust, with its marker as zoo-train wrote it"
    )


_HELD: dict[Path, int] = {}  # run directory -> the open marker whose lock this process holds


def hold_run(folder: Path, fd: int, *, keep: bool = True) -> None:
    """Lock the run's marker (``fd``, opened read-write) for this process and write its pid there;
    a UserError naming the holder when another process has it. The lock is the kernel's
    (``flock``): it ends with ``release_runs`` or with the process, however that ends.
    ``keep=False``: only refuse when another process holds it; release it at once, write nothing."""
    key = Path(folder).resolve()
    if key in _HELD:  # this process holds it already
        os.close(fd)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "a process whose pid is not written yet"
        os.close(fd)
        raise UserError(
            f"{folder} is being written by another zoo-train ({holder}); one run has one writer: wait "
            f"until it ends (or stop it), then resume it again"
        ) from None
    if not keep:
        os.close(fd)
        return
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
    _HELD[key] = fd


def release_runs() -> None:
    """End this process's hold on every run it claimed (its training is over)."""
    while _HELD:
        _, fd = _HELD.popitem()
        os.close(fd)  # closing the marker ends its lock


def claim_fresh(folder: Path) -> Path:
    """``folder``, or ``folder_2``, ``folder_3`` … : the first that this process creates itself."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    candidate, n = folder, 1
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            n += 1
            candidate = folder.with_name(f"{folder.name}_{n}")


def evals_dir(ckpt_path: Any, elsewhere: str) -> str:
    """Where zoo-eval's directories go (its ``hydra.run.dir``): ``<run>/evals`` for a checkpoint in a
    zoo-train run directory (``<run>/checkpoints/<name>.ckpt``) that this user may write to, so the
    metrics lie beside what they measure; ``elsewhere`` (outputs/eval/runs) for a pretrained model or
    a checkpoint of no run."""
    if not isinstance(ckpt_path, str) or "://" in ckpt_path:
        return elsewhere
    run = Path(ckpt_path).parent.parent
    if Path(ckpt_path).parent.name != "checkpoints" or not holds_a_run(run) or not os.access(run, os.W_OK):
        return elsewhere
    return str(run / "evals")


def sweep_folder() -> Path | None:
    """The sweep folder of a ``zoo-train -m`` job (a grid or an Optuna search); None for a single run."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return Path(HydraConfig.get().sweep.dir).resolve()
