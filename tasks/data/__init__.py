"""The data modules, loaded on first use (PEP 562): their settings (tasks/data/settings.py) are
what composing a config needs, and they come without Lightning."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zoo.lazy import names_from

if TYPE_CHECKING:
    import zoo
    from tasks.data.modules import (
        ClassificationDataModule,
        LMDataModule,
        MLMDataModule,
        TextDataModule,
        TranslationDataModule,
    )

    DATA_MODULES: zoo.Registry[type[TextDataModule]]

_HOMES = dict.fromkeys(
    ("ClassificationDataModule", "LMDataModule", "MLMDataModule", "TextDataModule", "TranslationDataModule"),
    "tasks.data.modules",
)
_HOMES["DATA_MODULES"] = "tasks.data.registry"


__getattr__ = names_from(__name__, _HOMES)

__all__ = [
    "DATA_MODULES",
    "ClassificationDataModule",
    "LMDataModule",
    "MLMDataModule",
    "TextDataModule",
    "TranslationDataModule",
]
