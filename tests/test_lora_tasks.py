"""LoRA in the training tasks (``adapter=lora``): the base stays as it was, only adapters (and a
task's own head) train, a resumed or reloaded run rebuilds its adapters, and an export writes the
merged dense model that computes the same outputs."""

from __future__ import annotations

import pytest
import torch
from rounding import assert_rounding_close
from test_tasks import compose_train

import zoo
from tasks.cli.export.formats import export_safetensors
from tasks.cli.loading import load_task
from tasks.cli.train.training import train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(gpt_base):
    return gpt_base


@pytest.fixture(scope="module")
def lora(base, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("lora")
    train(
        compose_train(
            "gpt_generator",
            run_dir,
            "test=false",
            "adapter=lora",
            "adapter.rank=4",
            f"init_from={base}",
            "optimizer.lr=0.01",
        )
    )
    return run_dir / "checkpoints" / "last.ckpt"


def test_only_the_adapters_train_and_the_base_stays(base, lora):
    before, _ = load_task(base)
    after, _ = load_task(lora)
    adapted = zoo.adapters.adapted_layers(after.model)
    assert adapted, "the reloaded run has no adapters"
    theirs = after.model.state_dict()
    for name, tensor in before.model.state_dict().items():
        torch.testing.assert_close(theirs[name], tensor, atol=0, rtol=0)  # frozen: bit for bit
    moved = [n for n, t in theirs.items() if "lora_B" in n and t.abs().sum() > 0]
    assert moved, "no adapter learned anything (B is still zero)"
    assert zoo.adapters.count_trainable(after.model) < zoo.count_parameters(after.model) / 10
    assert "zoo_base" in torch.load(lora, weights_only=True)  # adapter.save=auto with init_from: adapters only


def test_an_export_of_a_lora_run_is_the_merged_dense_model(lora, tmp_path):
    task, info = load_task(lora)
    x = torch.randint(5, task.model.config.vocab_size, (2, 11))
    with torch.no_grad():
        adapted = task.model(x)
    task.merge_adapter()
    assert not zoo.adapters.adapted_layers(task.model)
    export_safetensors(task, info, tmp_path / "out")
    dense = zoo.load_pretrained(tmp_path / "out")
    with torch.no_grad():
        assert_rounding_close(dense(x), adapted, dense)


def test_a_classifier_head_trains_beside_the_adapters(tmp_path):
    train(compose_train("bert_classifier", tmp_path, "test=false", "adapter=lora", "adapter.rank=2"))
    task, _ = load_task(tmp_path / "checkpoints" / "last.ckpt")
    assert all(p.requires_grad for p in task.head.parameters())
    assert not any(p.requires_grad for n, p in task.model.named_parameters() if "lora_" not in n)
    assert any(p.requires_grad for n, p in task.model.named_parameters() if "lora_" in n)


def test_an_adapter_without_init_from_says_that_its_frozen_base_is_random(tmp_path, capsys):
    from tasks.cli.train.checks import check_composition

    check_composition(compose_train("gpt_generator", tmp_path, "adapter=lora"))
    assert "zoo: warning: the adapter trains beside a frozen model with random weights" in capsys.readouterr().err
    for quiet in (["adapter=lora", "init_from=base.ckpt"], ["adapter=none"]):
        check_composition(compose_train("gpt_generator", tmp_path, *quiet))
        assert capsys.readouterr().err == ""
