"""zoo-train: train a model on a task, e.g. ``zoo-train experiment=t5_translator model.n_layers=4``.

Hydra composes the config here, and a config it cannot compose (a typo in a group, a key or a
value's type) is refused in one line before Lightning and the models are imported; the run itself
is tasks/cli/training.py. Returns the monitored metric, so sweepers (``-m``) can optimise it.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from tasks.cli.boundary import hydra_errors
from tasks.cli.schemas import conf_dir, register_configs


def main() -> float | None:
    """zoo-train: register what its config needs (not on import), then let Hydra compose and run."""
    register_configs()
    return run()


@hydra_errors
@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="train")
def run(cfg: DictConfig) -> float | None:
    from tasks.cli.training import run_composed  # Lightning and the models: once the config composed

    return run_composed(cfg)


if __name__ == "__main__":
    main()
