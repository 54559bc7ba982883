"""The strategies moved into tasks/parallel/; the names they had before still resolve to the same
objects, so a stored run config that names them resumes and old imports work."""

from __future__ import annotations

import importlib
import inspect

import pytest
from hydra.utils import get_class

from tasks.cli.conf_rules import conf_rules
from tasks.cli.schemas import conf_dir
from tasks.parallel.pipeline import PipelineParallelStrategy
from tasks.parallel.tensor import TensorParallelStrategy

STORED = {  # trainer.strategy._target_ as run configs written before the move name it
    "tasks.parallel.TensorParallelStrategy": TensorParallelStrategy,
    "tasks.pipeline.PipelineParallelStrategy": PipelineParallelStrategy,
}
SHIMS = {  # old module -> its new home, and where else what it named went
    "tasks.pipeline": ("tasks.parallel.pipeline",),
    "tasks.parallel_checks": ("tasks.parallel.checks", "tasks.parallel.plan"),
    "tasks.parallel_fsdp": ("tasks.parallel.fsdp",),
    "tasks.parallel_layers": ("tasks.parallel.layers",),
}


@pytest.mark.parametrize("target", list(STORED))
def test_a_stored_strategy_target_resolves_and_is_one_resume_takes(target):
    assert get_class(target) is STORED[target]
    assert conf_rules(conf_dir()).problem({"trainer": {"strategy": {"_target_": target}}}) is None


@pytest.mark.parametrize(("old", "homes"), list(SHIMS.items()))
def test_an_old_module_names_what_its_new_homes_hold(old, homes):
    shim, modules = importlib.import_module(old), [importlib.import_module(home) for home in homes]
    assert shim.__all__
    for name in shim.__all__:
        assert any(vars(module).get(name) is getattr(shim, name) for module in modules), name
    code = [(n, v) for n, v in vars(modules[0]).items() if inspect.isfunction(v) or inspect.isclass(v)]
    public = {n for n, v in code if not n.startswith("_") and v.__module__ == homes[0]}
    assert public <= set(shim.__all__)  # every function and class defined in its home


def test_the_package_names_what_tasks_parallel_exported_as_one_file():
    package = importlib.import_module("tasks.parallel")
    for name in package.__all__:
        assert getattr(package, name).__module__.startswith("tasks.parallel."), name
