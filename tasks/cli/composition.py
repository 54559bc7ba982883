"""What composing a config raised, as one line naming the override and the closest group choice
or key (``model/position=rop is not a choice of model/position; did you mean rope?``), as zoo's own
errors do, instead of Hydra's 12-line report or its advice to add ``+`` to a misspelt key.
``tasks.cli.boundary.hydra_errors`` applies it to a verb's entry point."""

from __future__ import annotations

import difflib
import importlib.resources
import re
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

import zoo
from tasks.cli.schemas import conf_dir
from tasks.errors import os_error, parse_error


def composition_error(error: BaseException) -> Exception | None:
    """The one-line error for what composing a config raised: Hydra's and OmegaConf's errors (with the
    closest choice or key), a config file that is not YAML or not text, a path the system refused;
    None for anything else (a bug, which keeps its traceback)."""
    if isinstance(error, MissingConfigException):
        return zoo.ConfigError(_missing_config(error))
    if isinstance(error, OverrideParseException):
        return zoo.ConfigError(
            f"{error.override}: Hydra cannot read this override ({_first_line(error.message)}); "
            f"write key=value, and quote a value that holds spaces, brackets or commas: "
            f"key='a value'"
        )
    ambiguous = re.match(r"Ambiguous value for argument '(.+)'", str(error))
    if ambiguous:
        given = ambiguous.group(1)
        key, _, values = given.partition("=")
        return zoo.ConfigError(
            f"{given}: a comma gives several values; add -m (--multirun) to run one job for each, write "
            f"{key}=[{values}] for a list, or quote it for text with a comma: {key}='{values}'"
        )
    if isinstance(error, HydraException | OmegaConfBaseException):
        return zoo.ConfigError(_composition(error))
    if isinstance(error, OSError) and error.errno is not None:
        return os_error(error)
    return parse_error(error)


def _missing_config(error: MissingConfigException) -> str:
    """A group choice (or a config) that does not exist, with the closest of the group's choices."""
    group, _, choice = (error.missing_cfg_file or "").rpartition("/")
    if not error.options or not group:
        return _first_line(str(error)).removeprefix("In 'train': ")
    where = re.match(r"In '([^']+)'", str(error))
    asked = (
        f" (asked for in {where.group(1)})"
        if where and "/" in where.group(1) and not where.group(1).startswith("hydra/")
        else ""
    )
    match = difflib.get_close_matches(choice, error.options, n=1)
    closest = f"; did you mean {group}={match[0]}?" if match else ""
    return f"{group}={choice} is not a choice of {group}{asked}{closest} (choices: {', '.join(error.options)})"


def _composition(error: BaseException) -> str:
    """An override Hydra could not apply: an unknown key (the closest key of its node, or of the
    config groups for a ``group/name``), a value of the wrong type, a ``+`` or ``~`` that does not fit."""
    cause = error.__cause__
    message = _first_line(str(error))
    wanted = re.match(r"Could not override '([^']+)'", message)
    node = getattr(cause, "parent_node", None)
    if wanted and isinstance(node, DictConfig) and getattr(cause, "key", None) is not None:
        return _unknown_key(wanted.group(1), str(cause.key), node, _given_value(str(error)))
    merging = re.match(r"Error merging override (.+)", message)
    if merging and cause is not None:
        return f"{merging.group(1)}: {_first_line(str(cause))}"
    already = re.match(r"Could not append to config\. An item is already at '([^']+)'", message)
    if already:
        return f"+{already.group(1)}: {already.group(1)} is in the config already; set it without the +"
    return message + (f" ({_first_line(str(cause))})" if cause is not None else "")


def _unknown_key(full: str, key: str, node: DictConfig, value: str) -> str:
    """``full`` (which failed at ``key`` of ``node``) is no key: the closest one, or how to add one."""
    parent = full[: -len(key) - 1] if full.endswith(f".{key}") else ""
    if "/" in key:  # a config group, as in model/position=rope
        groups = config_groups()
        match = difflib.get_close_matches(key, groups, n=1)
        closest = f"; did you mean {match[0]}{value}?" if match else ""
        own = [g for g in groups if g != "hydra" and not g.startswith("hydra/")]  # Hydra's own: not the user's choice
        return f"{key} is not a config group{closest} (groups: {', '.join(own)})"
    keys = [str(k) for k in node if k != "hydra"]
    where = f"of {parent}" if parent else "of the config"
    match = difflib.get_close_matches(key, keys, n=1)
    if match:
        return f"{full} is not a key {where}; did you mean {'.'.join(filter(None, (parent, match[0])))}{value}?"
    if not keys:
        return f"{full} is not set in {parent or 'the config'}; add it with +{full}{value}"
    shown = ", ".join(keys[:12]) + (" …" if len(keys) > 12 else "")
    return f"{full} is not a key {where} ({shown}); a key the config does not have is added with +{full}{value}"


def _given_value(message: str) -> str:
    """``=value`` of the override in Hydra's advice ``To append to your config use +key=value``."""
    found = re.search(r"use \+[^=\s]+(=.*)$", message, flags=re.MULTILINE)
    return found.group(1) if found else ""


def config_groups() -> list[str]:
    """Every config group a zoo verb can choose from: conf/'s folders, Hydra's own and those in
    the ConfigStore (zoo's schemas, plugins such as the launchers)."""
    groups = {str(p.relative_to(root)) for root in (Path(conf_dir()),) for p in root.rglob("*") if p.is_dir()}
    hydra_conf = importlib.resources.files("hydra.conf")
    groups |= {f"hydra/{p.name}" for p in (hydra_conf / "hydra").iterdir() if p.is_dir() and p.name[0] != "_"}

    def walk(tree: dict[str, Any], prefix: str) -> None:
        for name, value in tree.items():
            if isinstance(value, dict):
                groups.add(prefix + name)
                walk(value, f"{prefix}{name}/")

    walk(ConfigStore.instance().repo, "")
    return sorted(g for g in groups if not g.startswith(("schema", "__")) and "__pycache__" not in g)


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else text
