"""``zoo-train resume=<run dir>``: continue that run — its own config, directory and metrics file
— from its newest checkpoint, with only the ``key=value`` overrides given now applied on top.

The config comes from the checkpoint, a file that may have come from anyone (a shared run
directory), so it is read as data that names nothing itself (``stored_config``): every
``_target_`` in it must be one that zoo's own ``conf/`` puts at that place (``tasks.cli.conf_rules``),
its ``${...}`` are literal text, and the places where a run writes are those conf/ derives from
the run directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

import zoo
from tasks.cli.conf_rules import RUN_DIR, conf_rules, moved
from tasks.cli.loading import read_checkpoint
from tasks.cli.schemas import conf_dir
from tasks.errors import UserError
from tasks.run.checkpoints import checkpoint_step

CHECKPOINTS = ("on_exception.ckpt", "last.ckpt")  # what a run leaves to resume from; last.ckpt wins a tie


def run_of(path: str | Path) -> tuple[Path, Path]:
    """(run directory, checkpoint) named by ``resume=``: a run directory (its checkpoint of the
    highest global step, last.ckpt or on_exception.ckpt: a copied or restored folder's file times
    say nothing) or a checkpoint inside one's ``checkpoints/``."""
    path = Path(path).expanduser()
    if path.is_file():
        return path.resolve().parent.parent, path
    found = [path / "checkpoints" / name for name in CHECKPOINTS if (path / "checkpoints" / name).is_file()]
    if not found:
        what = "no such folder" if not path.exists() else "no checkpoints/last.ckpt or on_exception.ckpt in it"
        raise UserError(f"resume={path}: {what}; give a run directory of zoo-train (outputs/<task>/runs/<date>)")
    steps = {ckpt: checkpoint_step(ckpt) for ckpt in found}
    unread = [ckpt for ckpt, step in steps.items() if step is None]
    if unread:
        other = next((c for c in found if c not in unread), None)
        hint = f"resume from the other one with resume={other}" if other else "start a new run"
        raise UserError(
            f"resume={path}: {unread[0]} cannot be read as a zoo-train checkpoint, so which one is newest "
            f"is unknown; {hint}"
        )
    return path.resolve(), max(found, key=lambda ckpt: (steps[ckpt], CHECKPOINTS.index(ckpt.name)))


def resumed_config(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """The config of the run ``cfg.resume`` names, with ``overrides`` (the command line's, but
    ``resume=``) applied: ``key=value`` ones only, as a config group choice (``model=…``) would
    make another run."""
    run_dir, ckpt = run_of(cfg.resume)
    checkpoint = read_checkpoint(ckpt, "resume", base=False)  # its config only: zoo-train reads it whole
    resumed = stored_config(checkpoint["zoo_run"]["config_yaml"], ckpt, run_dir)
    applied = []
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        if key == "resume" or key.startswith("hydra"):
            continue
        if override.is_delete() or "/" in key or (Path(conf_dir()) / key).is_dir():
            raise UserError(
                f"resume= continues a run with its own config; {override.input_line} would make "
                f"another run: give only key=value changes (e.g. trainer.max_steps=2000), or start a "
                f"new run"
            )
        with open_dict(resumed):
            OmegaConf.update(resumed, key, override.value(), force_add=True)
        applied.append(override.input_line)
    with open_dict(resumed):
        resumed.ckpt_path, resumed.resume, resumed.init_from = str(ckpt), None, None  # weights: the checkpoint's
    step = checkpoint["global_step"]
    print(
        f"resuming {run_dir} from {ckpt.name} (step {step})"
        + (f" with {' '.join(applied)}" if applied else ", with its own config")
    )
    return resumed


def stored_config(text: str, ckpt: Path, run_dir: Path) -> DictConfig:
    """The run config a checkpoint holds (``config_yaml``), as data for a run in ``run_dir``:

    - a ``_target_`` of a class that moved since is read as its new home (``conf_rules.MOVED``);
    - refused (CheckpointError, before anything is built) when it names code that zoo's conf/ does
      not name there: a ``_target_`` elsewhere or of another value, a node that names code by an
      argument (``hydra.utils.get_class``) changed, or a path where conf/ gives a file name;
    - every ``${...}`` in it is literal text (never resolved: a stored ``${oc.env:…}`` would read
      this machine's environment into the run);
    - the places that conf/ derives from the run directory (checkpoint folders, the loggers' and
      the trainer's root) are conf/'s, in ``run_dir``; other paths under the directory the run was
      saved from follow it there (a moved or copied run).
    """
    try:
        raw = OmegaConf.to_container(OmegaConf.create(text), resolve=False)
    except (yaml.YAMLError, OmegaConfBaseException, ValueError, TypeError, RecursionError) as error:
        reason = "nested too deep to parse" if isinstance(error, RecursionError) else " ".join(str(error).split())
        raise zoo.CheckpointError(
            f"resume={ckpt}: its stored config (zoo_run.config_yaml) cannot be read "
            f"({reason[:160]}); use a checkpoint zoo-train wrote"
        ) from None
    raw = moved(raw)  # the classes that moved since the run was stored, at their homes
    paths = raw.get("paths") if isinstance(raw, dict) else None
    old_dir = paths.get("output_dir") if isinstance(paths, dict) else None
    if not isinstance(old_dir, str):
        raise zoo.CheckpointError(
            f"resume={ckpt}: its stored config (zoo_run.config_yaml) is not a zoo-train run's "
            f"(no paths.output_dir); use a checkpoint zoo-train wrote"
        )
    rules = conf_rules(conf_dir())
    problem = rules.problem(raw)
    if problem:
        raise zoo.CheckpointError(
            f"resume={ckpt}: its stored config {problem}, which zoo's conf/ does not: resume= "
            f"builds only what conf/ names, so nothing was run. Resume only a run you trust; to "
            f"continue it with a config of your own, give ckpt_path={ckpt} and that command line"
        )
    resumed = OmegaConf.create(as_literal(raw))
    with open_dict(resumed):
        for place, value in rules.in_run.items():
            if OmegaConf.select(resumed, place, default=None) is not None:
                OmegaConf.update(resumed, place, as_literal(value.replace(RUN_DIR, str(run_dir))))
        resumed.paths.output_dir = as_literal(str(run_dir))
        if old_dir != str(run_dir):  # the run was moved or copied: its paths follow it
            rebase_paths(resumed, old_dir, str(run_dir))
    return resumed


def as_literal(value: Any) -> Any:
    """``value`` (plain data) with every string escaped so that OmegaConf reads it as the same text:
    n backslashes before ``${`` become 2n + 1 (OmegaConf's escape), no interpolation is left."""
    if isinstance(value, dict):
        return {k: as_literal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_literal(v) for v in value]
    if isinstance(value, str) and "${" in value:
        return re.sub(r"(\\*)\$\{", lambda m: "\\" * (2 * len(m.group(1)) + 1) + "${", value)
    return value


def rebase_paths(node: DictConfig | ListConfig, old: str, new: str) -> None:
    """Every string of the config at or under ``old`` moved under ``new``: the tokenizer, data and
    the like of a run directory that was moved or copied (the text stays literal)."""
    items = node.items() if isinstance(node, DictConfig) else enumerate(node)
    for key, value in list(items):
        if isinstance(value, DictConfig | ListConfig):
            rebase_paths(value, old, new)
        elif isinstance(value, str) and (value == old or value.startswith(old.rstrip(os.sep) + os.sep)):
            node[key] = as_literal(new + value[len(old) :])
