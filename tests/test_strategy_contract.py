"""The strategy contract (tasks/strategy.py): zoo's strategies declare it, Lightning's own get its
defaults, and nothing in tasks/ finds a strategy's hooks by name."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from lightning.pytorch.strategies import DDPStrategy

import zoo
from tasks.parallel.pipeline import PipelineParallelStrategy
from tasks.parallel.tensor import TensorParallelStrategy
from tasks.strategy import PLAIN, ZooStrategy, pipeline_step_of, strategy_class, strategy_of

TASKS = Path(__file__).resolve().parents[1] / "tasks"


def test_zoos_strategies_declare_the_contract_and_lightnings_get_the_defaults():
    assert strategy_class(TensorParallelStrategy) is TensorParallelStrategy
    assert strategy_class(PipelineParallelStrategy) is PipelineParallelStrategy
    assert strategy_class(DDPStrategy) is ZooStrategy and strategy_class(None) is ZooStrategy
    assert PipelineParallelStrategy.runs_pipeline and not TensorParallelStrategy.runs_pipeline


def test_a_plain_strategy_keeps_the_model_whole_and_runs_no_pipeline():
    model = zoo.build_model(zoo.get_config("gpt-tiny"))
    assert strategy_of(None) is PLAIN and strategy_of(SimpleNamespace(strategy=DDPStrategy())) is PLAIN
    assert PLAIN.whole_parameter_count(model) == zoo.count_parameters(model)
    assert pipeline_step_of(SimpleNamespace(strategy=DDPStrategy())) is None
    with pytest.raises(NotImplementedError):
        PLAIN.pipeline_step(None, {}, "train")
    pipeline = PipelineParallelStrategy()
    step = pipeline_step_of(SimpleNamespace(strategy=pipeline))
    assert step is not None and step.__func__ is PipelineParallelStrategy.pipeline_step


def test_no_strategy_hook_is_found_by_name():
    probes = re.compile(r"(getattr|hasattr)\([^)]*strategy")
    found = [
        f"{p.relative_to(TASKS)}:{n}"
        for p in TASKS.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if probes.search(line)
    ]
    assert found == []


def test_the_contract_loads_without_lightning():
    code = "import sys, tasks.strategy; print('lightning' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
