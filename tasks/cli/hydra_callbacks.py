"""Hydra callbacks of zoo's verbs (``hydra.callbacks`` in conf/hydra/default.yaml)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from tasks.checkpoints import holds_a_run


class FreshRunDir(Callback):
    """Gives each single run a directory of its own before Hydra writes anything into it.

    The default ``hydra.run.dir`` is named after the second the run started: a second launch in
    the same second gets ``<name>_2`` (claimed with an atomic mkdir, so two processes never share
    one). A directory chosen with ``hydra.run.dir=`` that holds another run is refused, unless
    ``ckpt_path`` resumes the run saved in it.
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if os.environ.get("LOCAL_RANK") not in (None, "0") or os.environ.get("NODE_RANK") not in (None, "0"):
            return  # a DDP process Lightning started: it joins rank 0's directory
        hydra = config.hydra
        chosen = any(o.split("=", 1)[0].lstrip("+~") == "hydra.run.dir" for o in hydra.overrides.hydra)
        folder = Path(str(hydra.run.dir))
        if chosen:
            ckpt = OmegaConf.select(config, "ckpt_path", default=None)
            resuming_here = bool(ckpt) and "://" not in str(ckpt) and \
                folder.resolve() in Path(str(ckpt)).resolve().parents
            if holds_a_run(folder) and not resuming_here:
                print(f"zoo: UserError: hydra.run.dir={folder} holds another run's files; a new run never writes "
                      f"there: leave hydra.run.dir at its default, or resume that run with "
                      f"ckpt_path={folder / 'checkpoints' / 'last.ckpt'}", file=sys.stderr)
                sys.exit(2)
            return
        try:
            fresh = claim_fresh(folder)
        except OSError as error:
            print(f"zoo: UserError: cannot create the run directory {error.filename or folder}: {error.strerror}; "
                  f"choose a folder you can write with hydra.run.dir=", file=sys.stderr)
            sys.exit(1)
        if fresh != folder:
            with open_dict(hydra):
                OmegaConf.set_readonly(hydra, False)
                hydra.run.dir = str(fresh)


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
