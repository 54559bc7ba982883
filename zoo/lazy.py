"""A package's names loaded on first use (PEP 562's module ``__getattr__``): ``zoo`` names its
converters (HF, GGUF) without importing them until one is used, and ``tasks`` and ``tasks.data``
name Lightning classes without importing Lightning."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def names_from(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: a name of ``homes`` is imported from its module there, once;
    a name whose home is ``package.<name>`` itself is that submodule."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(homes[name])
        value = module if homes[name] == f"{package}.{name}" else getattr(module, name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
