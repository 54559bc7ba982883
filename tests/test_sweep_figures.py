"""zoo-sweep-report's figures (hydra_plugins/zoo_optuna_sweeper/_figures.py): a grid over two parameters
draws one line per value of the other; geometric grids get a log axis."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest

from hydra_plugins.zoo_optuna_sweeper._figures import _log_spaced, draw, plot, series_of
from hydra_plugins.zoo_optuna_sweeper.report import Sweep, Trial

matplotlib.use("Agg")


def _grid(tmp_path: Path, extra: dict | None = None) -> Sweep:
    """optimizer=adamw,muon x optimizer.lr=1e-3,3e-3,1e-2, Muon lower at every rate."""
    trials = []
    for i, (opt, lr) in enumerate((o, lr) for o in ("adamw", "muon") for lr in (1e-3, 3e-3, 1e-2)):
        value = 4.0 - 100 * lr * (2 if opt == "muon" else 1)
        trials.append(Trial(i, {"optimizer": opt, "optimizer.lr": lr, **(extra or {})}, value, "COMPLETE"))
    return Sweep(tmp_path, "val/loss", "min", trials)


def test_a_two_parameter_grid_draws_one_line_per_value_of_the_other(tmp_path):
    import matplotlib.pyplot as plt

    sweep = _grid(tmp_path)
    assert series_of(sweep, "optimizer.lr", sweep.trials) == "optimizer"
    fig, ax = plt.subplots()
    draw(ax, sweep, "optimizer.lr", sweep.trials)
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
    assert lines["optimizer=adamw"] == (
        [1e-3, 3e-3, 1e-2],
        [pytest.approx(4.0 - 100 * lr) for lr in (1e-3, 3e-3, 1e-2)],
    )
    assert lines["optimizer=muon"][1] == [pytest.approx(4.0 - 200 * lr) for lr in (1e-3, 3e-3, 1e-2)]
    assert ax.get_xscale() == "log"  # 1e-3, 3e-3, 1e-2: each at least twice the last
    plt.close(fig)
    assert [p.name for p in plot(sweep, tmp_path)] == ["sweep_optimizer.png", "sweep_optimizer.lr.png"]


def test_points_alone_where_no_single_other_parameter_groups_them(tmp_path):
    three = _grid(tmp_path, {"model.n_layers": 2})  # a third swept parameter
    assert series_of(three, "optimizer.lr", three.trials) is None
    one = Sweep(tmp_path, "val/loss", "min", [Trial(i, {"lr": lr}, 1.0, "COMPLETE") for i, lr in enumerate((1, 2))])
    assert series_of(one, "lr", one.trials) is None


@pytest.mark.parametrize(
    ("xs", "log"),
    [([1e-3, 3e-3, 1e-2], True), ([64, 128, 256], True), ([1e-4, 1e-2], True), ([1, 2, 3], False), ([0, 1, 10], False)],
)
def test_geometric_or_wide_grids_get_a_log_axis(xs, log):
    assert _log_spaced([float(x) for x in xs]) is log
