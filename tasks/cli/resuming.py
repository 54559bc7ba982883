"""``zoo-train resume=<run dir>``: continue that run — its own config, directory and metrics file
— from its newest checkpoint, with only the ``key=value`` overrides given now applied on top."""

from __future__ import annotations

import os
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from tasks.cli.common import conf_dir, read_checkpoint
from tasks.errors import UserError

CHECKPOINTS = ("on_exception.ckpt", "last.ckpt")  # what a run leaves to resume from


def run_of(path: str | Path) -> tuple[Path, Path]:
    """(run directory, checkpoint) named by ``resume=``: a run directory (its newest checkpoint,
    last.ckpt or on_exception.ckpt) or a checkpoint inside one's ``checkpoints/``."""
    path = Path(path).expanduser()
    if path.is_file():
        return path.resolve().parent.parent, path
    found = [path / "checkpoints" / name for name in CHECKPOINTS if (path / "checkpoints" / name).is_file()]
    if not found:
        what = "no such folder" if not path.exists() else "no checkpoints/last.ckpt or on_exception.ckpt in it"
        raise UserError(f"resume={path}: {what}; give a run directory of zoo-train (outputs/<task>/runs/<date>)")
    return path.resolve(), max(found, key=lambda p: p.stat().st_mtime)


def resumed_config(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """The config of the run ``cfg.resume`` names, with ``overrides`` (the command line's, but
    ``resume=``) applied: ``key=value`` ones only, as a config group choice (``model=…``) would
    make another run."""
    run_dir, ckpt = run_of(cfg.resume)
    checkpoint = read_checkpoint(ckpt, "resume", base=False)  # its config only: zoo-train reads it whole
    resumed = OmegaConf.create(checkpoint["zoo_run"]["config_yaml"])
    applied = []
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        if key == "resume" or key.startswith("hydra"):
            continue
        if override.is_delete() or "/" in key or (Path(conf_dir()) / key).is_dir():
            raise UserError(f"resume= continues a run with its own config; {override.input_line} would make "
                            f"another run: give only key=value changes (e.g. trainer.max_steps=2000), or start a "
                            f"new run")
        with open_dict(resumed):
            OmegaConf.update(resumed, key, override.value(), force_add=True)
        applied.append(override.input_line)
    with open_dict(resumed):
        resumed.ckpt_path, resumed.resume, resumed.init_from = str(ckpt), None, None  # weights: the checkpoint's
        moved_from = str(resumed.paths.output_dir)
        resumed.paths.output_dir = str(run_dir)
        if moved_from != str(run_dir):  # the run was moved or copied: its paths follow it
            rebase_paths(resumed, moved_from, str(run_dir))
    step = checkpoint["global_step"]
    print(f"resuming {run_dir} from {ckpt.name} (step {step})"
          + (f" with {' '.join(applied)}" if applied else ", with its own config"))
    return resumed


def rebase_paths(node: DictConfig | ListConfig, old: str, new: str) -> None:
    """Every string of the (resolved) config at or under ``old`` moved under ``new``: the checkpoint
    folder, the metrics file and the like of a run directory that was moved or copied."""
    items = node.items() if isinstance(node, DictConfig) else enumerate(node)
    for key, value in list(items):
        if isinstance(value, DictConfig | ListConfig):
            rebase_paths(value, old, new)
        elif isinstance(value, str) and (value == old or value.startswith(old.rstrip(os.sep) + os.sep)):
            node[key] = new + value[len(old):]
