"""zoo's Optuna sweeper for Hydra (``hydra/sweeper=zoo_optuna``), its pruning callback and its report.

Hydra's plugin scan imports every public module of this package at each start of every Hydra app, so
the modules that import Optuna or Lightning are private; what conf/ names from them is reached here,
imported on first use.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "OptunaPruning":  # conf/callbacks/default.yaml names it; it imports lightning and optuna
        from hydra_plugins.zoo_optuna_sweeper._pruning import OptunaPruning

        return OptunaPruning
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
