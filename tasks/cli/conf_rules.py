"""What zoo's own ``conf/`` lets a stored run config name: the ``_target_`` at each place, drawn
from its YAML files (and the data modules' schemas), so that ``resume=`` builds nothing else.

A place is a key path (``("callbacks", "model_checkpoint")``). A run that zoo-train composed from
conf/ and ``key=value`` overrides has its targets exactly where conf/ puts them; a checkpoint's
config that has one anywhere else, or another one, did not come from zoo-train (or was changed).
A class that moved leaves no old module behind: its old ``_target_`` is mapped to its home here
(:data:`MOVED`, ``moved``), so a run stored before the move resumes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

Place = tuple[str, ...]

RUN_DIR = "${paths.output_dir}"  # how conf/ names the run directory
PLAIN_NODES: frozenset[Place] = frozenset({("data",), ("task",)})
"""Nodes built from plain values (not recursively): their settings are data (paths the data module
reads, a task's free text such as a sample prompt), so they are not held to file names."""


MOVED: dict[str, str] = {
    "tasks.parallel.TensorParallelStrategy": "tasks.parallel.tensor.TensorParallelStrategy",
    "tasks.pipeline.PipelineParallelStrategy": "tasks.parallel.pipeline.PipelineParallelStrategy",
    "tasks.callbacks.ProgressBar": "tasks.run.callbacks.ProgressBar",
    "tasks.callbacks.ModelSummary": "tasks.run.callbacks.ModelSummary",
    "tasks.callbacks.CrashCheckpoint": "tasks.run.callbacks.CrashCheckpoint",
    "tasks.callbacks.Throughput": "tasks.run.callbacks.Throughput",
    "tasks.callbacks.StopOnNonFinite": "tasks.run.callbacks.StopOnNonFinite",
    "tasks.resume.ResumeState": "tasks.run.resume.ResumeState",
    "tasks.loggers.CSVLogger": "tasks.run.loggers.CSVLogger",
    "tasks.trackers.MLflowLogger": "tasks.run.trackers.MLflowLogger",
    "tasks.trackers.WandbLogger": "tasks.run.trackers.WandbLogger",
    "tasks.GeneratorTask": "tasks.generator.GeneratorTask",
    "tasks.ClassifierTask": "tasks.classifier.ClassifierTask",
    "tasks.MLMTask": "tasks.mlm.MLMTask",
    "tasks.TranslatorTask": "tasks.translator.TranslatorTask",
    "tasks.data.LMDataModule": "tasks.data.modules.LMDataModule",
    "tasks.data.ClassificationDataModule": "tasks.data.modules.ClassificationDataModule",
    "tasks.data.MLMDataModule": "tasks.data.modules.MLMDataModule",
    "tasks.data.TranslationDataModule": "tasks.data.modules.TranslationDataModule",
}
"""The ``_target_``s that run configs stored before a class moved name -> where it lives now."""


def moved(config: Any) -> Any:
    """``config`` (plain data, a stored run config) with every ``_target_`` of :data:`MOVED` at its new home."""
    if isinstance(config, dict):
        return {k: MOVED.get(v, v) if k == "_target_" and isinstance(v, str) else moved(v) for k, v in config.items()}
    if isinstance(config, list):
        return [moved(v) for v in config]
    return config


@dataclass(frozen=True)
class ConfRules:
    """Args:
    targets: place -> the ``_target_`` values conf/ gives there.
    fixed: place -> a node that names code by an argument (``hydra.utils.get_class`` and its
        ``path``): allowed only exactly as conf/ writes it.
    in_run: dotted place -> conf/'s value there, a path in the run directory (``RUN_DIR``).
    derived: places where conf/ gives an interpolation of another setting (``${monitor.metric}``).
    """

    targets: dict[Place, frozenset[str]]
    fixed: dict[Place, Any]
    in_run: dict[str, str]
    derived: frozenset[Place]

    def problem(self, config: Any, place: Place = (), built: bool = False) -> str | None:
        """What in ``config`` (plain data, a run config) conf/ does not name, as "names X=…"; None
        when nothing. In a node that is built (``built``: a trainer, callback, logger), a string is
        a file name, conf/'s path in the run directory, or a value that conf/ derives."""
        if isinstance(config, dict):
            if "_target_" in config:
                target, where = config["_target_"], ".".join((*place, "_target_"))
                if not isinstance(target, str) or target not in self.targets.get(place, ()):
                    return f"names {where}={target!r}"
                if place in self.fixed and config != self.fixed[place]:
                    return f"names other code in {'.'.join(place)} ({config!r})"
                built = place not in PLAIN_NODES
            items = [(str(k), v) for k, v in config.items()]
        elif isinstance(config, list):
            items = [(str(i), v) for i, v in enumerate(config)]
        else:
            dotted = ".".join(place)
            if (
                built
                and isinstance(config, str)
                and not is_name(config)
                and dotted not in self.in_run
                and place not in self.derived
            ):
                return f"names the path {dotted}={config!r} where a name belongs"
            return None
        return next((p for key, value in items if (p := self.problem(value, (*place, key), built))), None)


def is_name(text: str) -> bool:
    """Whether ``text`` can only name something inside a folder (no path separator, not . or ..)."""
    return not any(c in text for c in "/\\\0") and text not in (".", "..")


def conf_rules(conf: str) -> ConfRules:
    """The rules of the conf/ folder ``conf``, with the data modules' schemas (``schema/data``,
    registered by ``register_configs``) at ``data``."""
    targets, fixed, in_run, derived = _yaml_rules(conf)
    schemas = ConfigStore.instance().repo.get("schema", {}).get("data", {})
    data = {str(OmegaConf.select(entry.node, "_target_")) for entry in schemas.values()}
    targets = {**targets, ("data",): targets.get(("data",), frozenset()) | frozenset(data)}
    return ConfRules(targets, fixed, in_run, derived)


@functools.cache
def _yaml_rules(conf: str) -> tuple[dict[Place, frozenset[str]], dict[Place, Any], dict[str, str], frozenset[Place]]:
    targets: dict[Place, set[str]] = {}
    fixed: dict[Place, Any] = {}
    in_run: dict[str, str] = {}
    derived: set[Place] = set()

    def walk(node: Any, place: Place) -> None:
        if isinstance(node, dict):
            target = node.get("_target_")
            if isinstance(target, str):
                targets.setdefault(place, set()).add(target)
                if target.startswith("hydra.utils."):
                    fixed[place] = node
            for key, value in node.items():
                walk(value, (*place, str(key)))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, (*place, str(i)))
        elif isinstance(node, str) and RUN_DIR in node:
            in_run[".".join(place)] = node
        elif isinstance(node, str) and "${" in node:
            derived.add(place)

    root = Path(conf)
    for file in sorted(root.rglob("*.yaml")):
        text = file.read_text(encoding="utf-8")
        content = yaml.safe_load(text)
        if isinstance(content, dict):
            content.pop("defaults", None)
            walk(content, package(file.relative_to(root), text))
    return {k: frozenset(v) for k, v in targets.items()}, fixed, in_run, frozenset(derived)


def package(file: Path, text: str) -> Place:
    """Where a conf/ file's keys go in the composed config: its ``# @package`` line, or its group."""
    for line in text.splitlines():
        if line.startswith("# @package "):
            name = line.removeprefix("# @package ").strip()
            return () if name == "_global_" else tuple(name.split("."))
    return file.parent.parts
