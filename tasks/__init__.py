"""Lightning tasks and data modules on top of the zoo library.

The names below load on first use (PEP 562), not with the package: a verb that refuses a config
Hydra cannot compose does so before Lightning is imported (a few seconds)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zoo.lazy import names_from

if TYPE_CHECKING:
    import zoo
    from tasks.base import ZooTask
    from tasks.classifier import ClassifierTask
    from tasks.generator import GeneratorTask
    from tasks.mlm import MLMTask
    from tasks.translator import TranslatorTask

    TASKS: zoo.Registry[type[ZooTask]]

_HOMES = {
    "ZooTask": "tasks.base",
    "ClassifierTask": "tasks.classifier",
    "GeneratorTask": "tasks.generator",
    "MLMTask": "tasks.mlm",
    "TranslatorTask": "tasks.translator",
    "TASKS": "tasks.registry",
}


__getattr__ = names_from(__name__, _HOMES)

__all__ = ["TASKS", "ClassifierTask", "GeneratorTask", "MLMTask", "TranslatorTask", "ZooTask"]
