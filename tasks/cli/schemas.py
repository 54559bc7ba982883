"""Where zoo's conf/ is and what composing a verb's config needs registered first: the typed
``model`` schema (every ModelConfig field, read back by ``model_config``), each data module's
schema, and the Optuna sweeper."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

import zoo
from tasks.data.settings import SETTINGS


def conf_dir() -> str:
    """conf/ of a source checkout or editable install; inside the package in a built wheel."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / "conf", here.parents[1] / "conf"):
        if (candidate / "train.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError("zoo's conf/ directory was not found next to the tasks package")


def register_model_schema() -> None:
    """Every ModelConfig field as an optional, typed key of ``model`` (null = keep the preset's),
    so ``model.n_layers=4`` needs no ``+`` and ``model.n_layers=four`` fails at composition."""
    hints = typing.get_type_hints(zoo.ModelConfig)
    # typing.Optional, not X | None: OmegaConf reads only the former
    fields: list[tuple[str, Any, Any]] = [("preset", Optional[str], dataclasses.field(default=None))]  # noqa: UP045
    for f in dataclasses.fields(zoo.ModelConfig):
        base = [t for t in typing.get_args(hints[f.name]) if t is not type(None)] or [hints[f.name]]
        fields.append((f.name, Optional[base[0]], dataclasses.field(default=None)))  # noqa: UP045
    schema = dataclasses.make_dataclass("ModelChoices", fields)
    ConfigStore.instance().store(group="schema", name="model", node=schema)


def register_configs() -> None:
    """What composing zoo-train's config needs before Hydra starts: the typed model and data
    schemas and our Optuna sweeper (``hydra/sweeper=zoo_optuna``, also from an editable install,
    which Hydra's plugin scan does not see). Verbs and scripts call it in ``main``, not on import."""
    from hydra_plugins.zoo_optuna_sweeper import sweeper

    register_model_schema()
    register_data_schemas()
    sweeper.register()


def register_data_schemas() -> None:
    """``schema/data/<DataModule>``: each data module's settings with their defaults and its
    ``_target_``; a ``conf/data/*.yaml`` extends one and states only what differs, so a default
    lives in one place (tasks/data/settings.py). Values stay untyped here: ``check_values`` and
    the module refuse a bad one in one line that names it (Hydra's own type errors do not)."""
    for name, settings in SETTINGS.items():
        fields = {"_target_": ("_target_", str, dataclasses.field(default=f"tasks.data.modules.{name}"))}
        for f in dataclasses.fields(settings):
            if f.default_factory is not dataclasses.MISSING:
                field = dataclasses.field(default_factory=f.default_factory)  # source_args: {} to add keys to
            else:
                field = dataclasses.field(default=MISSING if f.default is dataclasses.MISSING else f.default)
            fields[f.name] = (f.name, Any, field)
        ConfigStore.instance().store(
            group="schema/data", name=name, node=dataclasses.make_dataclass(name, list(fields.values()))
        )


def model_config(node: DictConfig) -> zoo.ModelConfig:
    """The ``model`` node -> a ModelConfig (not yet validated): the preset with every non-null field applied."""
    values = OmegaConf.to_container(node, resolve=True)
    preset = values.pop("preset", None)
    given = {k: v for k, v in values.items() if v is not None}
    if preset is None and given.get("arch") is not None:  # a model read from init_from=<HF folder>: every field
        return zoo.ModelConfig(**given)
    if preset is None:
        raise zoo.ConfigError(f"model.preset is not set; choose a model, e.g. model=gpt-tiny ({zoo.list_models()})")
    return zoo.get_config(preset, **given)
