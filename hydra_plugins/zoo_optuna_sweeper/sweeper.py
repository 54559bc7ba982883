"""zoo's Optuna sweeper for Hydra: ``zoo-train -m hydra/sweeper=zoo_optuna hydra.sweeper.params=...``.

Written for current Optuna (>= 4) and SQLAlchemy 2. It reads the official hydra-optuna-sweeper's
``params`` syntax (``choice(a,b)``, ``range(1,4)``, ``interval(1e-4,1e-2)``, ``tag(log, interval(...))``,
a plain YAML list as a choice, a plain value as a fixed override) with Hydra's own override parser,
keeps every study in an RDB storage (sqlite by default) so that running the same command again
resumes a killed sweep, and lets jobs report validation metrics for pruning.

Hydra imports this module at every start of every Hydra app to look for plugins, so it imports
nothing heavy: Optuna is imported by ``_study`` only when a sweep or a trial runs.
"""

# No `from __future__ import annotations` here: Hydra's plugin scan runs this module before it is in
# sys.modules, where dataclasses cannot resolve string annotations.
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.zoo_optuna_sweeper._names import STORAGE_ENV, STUDY_ENV, TRIAL_ENV

if TYPE_CHECKING:
    import optuna


@dataclass
class ZooOptunaSweeperConf:
    """``hydra.sweeper`` for ``hydra/sweeper=zoo_optuna``.

    Attributes:
        params: override key -> search syntax (``interval``, ``choice``, ``range``, ``tag(log, ...)``,
            a YAML list = a choice, anything else = a fixed override). Sweeps given on the command line
            (``model.n_layers=1,2``) join them and fixed command-line values win over them.
        n_trials: trials to finish in the study (complete, pruned or failed), counted across resumes.
        n_jobs: trials asked for and handed to the launcher at once (run in parallel by launchers
            that can, e.g. submitit).
        direction: ``minimize``/``maximize`` (or ``min``/``max``); null follows the app's
            ``monitor.mode``, else minimizes.
        sampler: ``tpe``, ``random`` or ``grid`` (grid: only choice/range params; n_trials is capped
            at the grid size).
        seed: sampler seed; a resumed sweep uses seed + the number of trials already in the study,
            so it does not replay the first trials' draws.
        sampler_args: further keyword arguments of the Optuna sampler (e.g. ``n_startup_trials``).
        pruner: ``median``, ``percentile``, ``successive_halving``, ``hyperband``, ``threshold`` or
            ``none``; applied to the monitored metric the jobs report after each validation.
        pruner_args: keyword arguments of the Optuna pruner (e.g. ``n_warmup_steps``, in optimizer steps).
        study_name: null: ``<task_name>-<8 hex digits of the search>``, the same for the same command,
            different when the search space or fixed overrides change.
        storage: an Optuna RDB URL; null: ``sqlite:///<parent of hydra.sweep.dir>/optuna.db``, which
            with zoo's timestamped sweep directories is ``outputs/<task_name>/multiruns/optuna.db``.
    """

    _target_: str = "hydra_plugins.zoo_optuna_sweeper.sweeper.ZooOptunaSweeper"
    params: dict[str, Any] = field(default_factory=dict)  # {}, not None: OmegaConf merges no dict into a None
    n_trials: int = 20
    n_jobs: int = 1
    direction: str | None = None
    sampler: str = "tpe"
    seed: int | None = None
    sampler_args: dict[str, Any] = field(default_factory=dict)
    pruner: str = "median"
    pruner_args: dict[str, Any] = field(default_factory=dict)
    study_name: str | None = None
    storage: str | None = None


ConfigStore.instance().store(
    group="hydra/sweeper", name="zoo_optuna", node=ZooOptunaSweeperConf, provider="zoo_optuna_sweeper"
)


class ZooOptunaSweeper(Sweeper):
    """Asks Optuna for ``n_jobs`` trials at a time, launches them as jobs, tells Optuna each job's
    return value (the monitored metric), a pruned job as PRUNED and a failed one as FAIL."""

    def __init__(self, **options: Any) -> None:
        self.options = {
            k: OmegaConf.to_container(v, resolve=True) if isinstance(v, DictConfig) else v for k, v in options.items()
        }
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Launcher | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        from hydra_plugins.zoo_optuna_sweeper._study import OptunaSweep

        assert self.config is not None and self.hydra_context is not None and self.launcher is not None
        return OptunaSweep(self.options, self.config, self.hydra_context, self.launcher).run(arguments)


def trial_of_this_job() -> "optuna.trial.Trial | None":
    """The Optuna trial this process runs as a job of a ``zoo_optuna`` sweep; None outside one."""
    number = os.environ.get(TRIAL_ENV)
    if number is None:
        return None
    from hydra_plugins.zoo_optuna_sweeper._study import open_trial

    return open_trial(os.environ[STORAGE_ENV], os.environ[STUDY_ENV], int(number))


def register() -> None:
    """Make sure Hydra knows this sweeper.

    Hydra finds plugins by listing the ``hydra_plugins`` namespace package, which fails for a
    PEP 660 editable install (``pip install -e .``: the package is importable but not listed).
    Entry points call this before Hydra starts; after a regular install it changes nothing.
    """
    from hydra.core.plugins import Plugins

    plugins = Plugins.instance()
    if f"{__name__}.{ZooOptunaSweeper.__name__}" not in plugins.class_name_to_class:
        plugins.register(ZooOptunaSweeper)
