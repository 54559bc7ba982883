"""Hydra callbacks of zoo's verbs (``hydra.callbacks`` in conf/hydra/default.yaml)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from tasks.run.run_dirs import claim_fresh, holds_a_run


class FreshRunDir(Callback):
    """Gives each single run a directory of its own before Hydra writes anything into it.

    The default ``hydra.run.dir`` is named after the second the run started: a second launch in
    the same second gets ``<name>_2`` (claimed with an atomic mkdir, so two processes never share
    one). A directory chosen with ``hydra.run.dir=`` must be new or empty, unless the verb resumes
    the run saved in it (``resume_key``: the config key of the checkpoint it resumes, zoo-train's
    ``ckpt_path``); Hydra's record of a resumed run's command then goes to ``.hydra/resume``
    (``_2``, …) beside the record of the command that started it, which is kept. A folder holding
    only what a command that failed at once left (``.hydra/``, its log) is taken too, with this
    command's record in ``.hydra/retry``. A chosen directory that does not exist is created here.

    The directory this callback created (the default one, or a chosen one that did not exist) is
    this run's own: a verb that ends on a mistake removes it while it holds only what Hydra wrote
    (``discard_own_run_dir``), so that a refused command leaves no empty run behind.
    """

    def __init__(self, resume_key: str | None = None, run_key: str | None = None) -> None:
        self.resume_key, self.run_key = resume_key, run_key

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if os.environ.get("LOCAL_RANK") not in (None, "0") or os.environ.get("NODE_RANK") not in (None, "0"):
            return  # a DDP process Lightning started: it joins rank 0's directory
        hydra = config.hydra
        if self.run_key and OmegaConf.select(config, self.run_key, default=None):
            self.continue_run(config, str(OmegaConf.select(config, self.run_key)))
            return
        chosen = any(o.split("=", 1)[0].lstrip("+~") == "hydra.run.dir" for o in hydra.overrides.hydra)
        folder = Path(str(hydra.run.dir)).expanduser()
        try:
            if chosen and os.path.lexists(folder):
                self.check_chosen(config, folder)
            elif chosen:
                OWN_PARENTS[:] = missing_parents(folder)
                folder.mkdir(parents=True)
                OWN_RUN_DIR[:] = [folder.resolve()]
            else:
                OWN_PARENTS[:] = missing_parents(folder)
                fresh = claim_fresh(folder)
                OWN_RUN_DIR[:] = [fresh.resolve()]
                if fresh != folder:
                    set_hydra(config, "run.dir", str(fresh))
        except OSError as error:
            _exit(
                f"cannot create the run directory {error.filename or folder}: {error.strerror}; choose a folder "
                f"you can write with hydra.run.dir=",
                code=1,
            )

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        OWN_RUN_DIR.clear()  # the run is over: its directory is no longer a candidate for removal
        OWN_PARENTS.clear()

    def continue_run(self, config: DictConfig, given: str) -> None:
        """``resume=<run dir>``: this command runs in that directory, its record in ``.hydra/resume``.
        A directory this process cannot write (a read-only disk, another user's run) ends it in one
        line naming the directory and the fix (resume a copy), before Hydra writes anything there."""
        from tasks.cli.resuming import run_of
        from tasks.errors import UserError

        try:
            folder, _ = run_of(given)
        except UserError as error:
            _exit(str(error))
        try:
            record = claim_fresh(folder / ".hydra" / "resume")
        except OSError as error:
            _exit(
                f"resume={given}: cannot write in the run directory {folder} ({error.strerror}); a resumed "
                f"run continues in its own directory: copy it to a folder you can write (cp -r {folder} "
                f"<copy>) and resume the copy with resume=<copy>",
                code=1,
            )
        set_hydra(config, "run.dir", str(folder))
        set_hydra(config, "output_subdir", str(record.relative_to(folder)))

    def check_chosen(self, config: DictConfig, folder: Path) -> None:
        if not folder.is_dir() or not any(folder.iterdir()):
            return
        ckpt = OmegaConf.select(config, self.resume_key, default=None) if self.resume_key else None
        if ckpt and "://" not in str(ckpt) and folder.resolve() in Path(str(ckpt)).expanduser().resolve().parents:
            record = claim_fresh(folder / ".hydra" / "resume")  # this command's record, beside the first one's
            set_hydra(config, "output_subdir", str(record.relative_to(folder)))
            return
        if not holds_a_run(folder) and all(p.name == ".hydra" or p.suffix == ".log" for p in folder.iterdir()):
            record = claim_fresh(folder / ".hydra" / "retry")  # what a command that failed at once left: its
            set_hydra(config, "output_subdir", str(record.relative_to(folder)))  # record stays beside this one
            return
        if holds_a_run(folder):
            hint = (
                f", or resume that run with {self.resume_key}={folder / 'checkpoints' / 'last.ckpt'}"
                if self.resume_key
                else ""
            )
            _exit(
                f"hydra.run.dir={folder} holds a training run's files; nothing else writes there: leave "
                f"hydra.run.dir at its default (a fresh directory){hint}"
            )
        names = sorted(p.name for p in folder.iterdir())
        _exit(
            f"hydra.run.dir={folder} is not empty ({', '.join(names[:4])}{' …' if len(names) > 4 else ''}); "
            f"choose a new or empty folder, or leave hydra.run.dir at its default"
        )


OWN_RUN_DIR: list[Path] = []
"""The run directory FreshRunDir created in this process for the run under way (none or one)."""
OWN_PARENTS: list[Path] = []
"""The folders above it that it created too (outputs/<experiment>/runs on a first run), deepest first."""


def missing_parents(folder: Path) -> list[Path]:
    """The folders above ``folder`` that do not exist yet, deepest first."""
    missing, parent = [], folder.resolve().parent
    while not os.path.lexists(parent) and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    return missing


HYDRA_RECORDS = {"config.yaml", "hydra.yaml", "overrides.yaml"}  # what Hydra writes into <run>/.hydra/


def discard_own_run_dir() -> None:
    """Remove the directory FreshRunDir created for this run when it holds only what Hydra wrote into
    it (``.hydra/`` with its three records, the job's ``.log``): a refused command leaves no empty run.
    Anything else in it (a checkpoint, a file of the user's) keeps the whole directory; nothing is
    removed in a directory this process did not create, nor in another run's (the output directory
    Hydra reports must be this one)."""
    if not OWN_RUN_DIR:
        return
    folder = OWN_RUN_DIR.pop()
    if HydraConfig.initialized() and Path(HydraConfig.get().runtime.output_dir).resolve() != folder:
        return
    hydra_dir, records, logs = folder / ".hydra", [], []
    try:
        for entry in folder.iterdir():
            if entry == hydra_dir and entry.is_dir() and not entry.is_symlink():
                records = list(entry.iterdir())
            elif entry.suffix == ".log" and entry.is_file() and not entry.is_symlink():
                logs.append(entry)
            else:
                return  # something besides Hydra's files: the directory stays whole
        if any(p.is_symlink() or not p.is_file() or p.name not in HYDRA_RECORDS for p in records):
            return
        for path in [*records, *logs]:
            path.unlink()
        if hydra_dir.is_dir():
            hydra_dir.rmdir()
        folder.rmdir()
        for parent in OWN_PARENTS:  # the folders above it that this command made, while they are empty
            parent.rmdir()
    except OSError:  # it changed meanwhile, holds something else, or cannot be removed: it stays
        return
    finally:
        OWN_PARENTS.clear()


def set_hydra(config: DictConfig, key: str, value: str) -> None:
    with open_dict(config.hydra):
        OmegaConf.set_readonly(config.hydra, False)
        OmegaConf.update(config.hydra, key, value)


def _exit(message: str, code: int = 2) -> None:
    print(f"zoo: UserError: {message}", file=sys.stderr)
    sys.exit(code)
