"""``adapter.save=only``: a LoRA run's checkpoints hold what trained plus the name and sha256 of its
base (``init_from``); every load reads the base back and checks it, so an export, an evaluation or a
resume sees the same model as with whole checkpoints, and a missing or other base is one line."""

from __future__ import annotations

import shutil

import pytest
import torch
from test_resume import _crash, _losses
from test_tasks import compose_train

import zoo
from tasks.cli.export.formats import export_safetensors
from tasks.cli.loading import load_task
from tasks.cli.train.training import train
from tasks.run.checkpoints import BASE_KEY

pytestmark = pytest.mark.slow
LORA = ["adapter=lora", "adapter.rank=4", "optimizer.lr=0.01"]


@pytest.fixture(scope="module")
def base(gpt_base):
    return gpt_base


@pytest.fixture(scope="module")
def runs(base, tmp_path_factory):
    """The same LoRA run saved whole and adapter-only: {"full": last.ckpt, "only": last.ckpt}. Its test
    stage reloads the best checkpoint through the Trainer's loader (the base put back there too)."""
    out = {}
    for save in ("full", "only"):
        run_dir = tmp_path_factory.mktemp(save)
        train(compose_train("gpt_generator", run_dir, *LORA, f"init_from={base}", f"adapter.save={save}", "test=true"))
        out[save] = run_dir / "checkpoints" / "last.ckpt"
    return out


def test_an_adapter_only_checkpoint_holds_no_frozen_base_tensor(runs, base):
    full = torch.load(runs["full"], weights_only=True)
    only = torch.load(runs["only"], weights_only=True)
    task, _ = load_task(runs["full"])
    trains = {f"model.{k}" for k, p in task.model.named_parameters(remove_duplicate=False) if p.requires_grad}
    assert trains and set(only["state_dict"]) == trains  # the adapters, and nothing frozen
    assert all(zoo.adapters.is_adapter_tensor(k) for k in only["state_dict"])
    assert set(only[BASE_KEY]["keys"]) == set(full["state_dict"]) - trains
    assert only[BASE_KEY]["source"] == str(base.resolve()) and BASE_KEY not in full
    assert runs["only"].stat().st_size < 0.5 * runs["full"].stat().st_size


def test_an_adapter_only_run_exports_what_the_whole_run_exports(runs, tmp_path):
    x = torch.randint(5, 300, (2, 11))
    logits = {}
    for save, ckpt in runs.items():
        task, info = load_task(ckpt)
        task.merge_adapter()
        export_safetensors(task, info, tmp_path / save)
        with torch.no_grad():
            logits[save] = zoo.load_pretrained(tmp_path / save)(x)
    torch.testing.assert_close(logits["only"], logits["full"], atol=0, rtol=0)


def _pointing_at(ckpt, base, tmp_path):
    """A copy of the adapter-only checkpoint ``ckpt`` whose base is ``tmp_path/base.ckpt`` (a copy of ``base``)."""
    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint[BASE_KEY]["source"] = str(tmp_path / "base.ckpt")
    shutil.copy(base, tmp_path / "base.ckpt")
    torch.save(checkpoint, tmp_path / "adapter.ckpt")
    load_task(tmp_path / "adapter.ckpt")  # the same base elsewhere: it loads
    return tmp_path / "adapter.ckpt"


def test_another_base_is_refused_in_one_line(runs, base, tmp_path):
    ckpt = _pointing_at(runs["only"], base, tmp_path)
    other = torch.load(base, weights_only=True)
    name = next(k for k in other["state_dict"] if k.endswith("attn.qkv.weight"))
    other["state_dict"][name] = other["state_dict"][name] + 1e-3
    torch.save(other, tmp_path / "base.ckpt")
    with pytest.raises(zoo.CheckpointError, match="trained on another base") as caught:
        load_task(ckpt)
    assert "\n" not in str(caught.value) and str(tmp_path / "base.ckpt") in str(caught.value)


def test_a_missing_base_is_refused_in_one_line(runs, base, tmp_path):
    ckpt = _pointing_at(runs["only"], base, tmp_path)
    (tmp_path / "base.ckpt").rename(tmp_path / "moved.ckpt")
    with pytest.raises(zoo.CheckpointError, match="is gone: put that file back") as caught:
        load_task(ckpt)
    assert "\n" not in str(caught.value) and str(tmp_path / "base.ckpt") in str(caught.value)


def test_adapter_only_without_init_from_is_refused_before_anything_is_written(runs, tmp_path):
    with pytest.raises(
        zoo.ConfigError,
        match=r"adapter.save=only .* no init_from: its base would be lost; set "
        r"init_from=.*, or adapter.save=full",
    ):
        train(compose_train("gpt_generator", tmp_path / "fresh", *LORA, "adapter.save=only", "test=false"))
    assert not (tmp_path / "fresh").exists()
    # a whole checkpoint resumed adapter-only names no base either
    with pytest.raises(zoo.ConfigError, match="holds the whole model and names no base"):
        train(
            compose_train(
                "gpt_generator",
                tmp_path / "resumed",
                *LORA,
                "adapter.save=only",
                "test=false",
                f"ckpt_path={runs['full']}",
            )
        )
    assert not (tmp_path / "resumed").exists()


def test_a_killed_adapter_only_run_resumes_bit_for_bit(base, tmp_path):
    """As tests/test_resume.py, with checkpoints that hold only the adapter; the resume from
    on_exception.ckpt gives no init_from (as ``resume=`` does): the checkpoint names its base."""
    run = [
        *LORA,
        "adapter.save=only",
        "adapter.dropout=0.1",
        f"init_from={base}",
        "trainer.max_steps=10",
        "++trainer.limit_train_batches=4",
    ]
    whole = _losses("gpt_generator", tmp_path / "whole", *run)
    _crash("gpt_generator", tmp_path / "killed", 8, tmp_path / "whole", *run)
    for name, extra in (("last", []), ("on_exception", ["init_from=null"])):
        checkpoint = tmp_path / "killed" / "checkpoints" / f"{name}.ckpt"
        state = torch.load(checkpoint, weights_only=True)
        assert BASE_KEY in state and all(zoo.adapters.is_adapter_tensor(k) for k in state["state_dict"])
        resumed = _losses(
            "gpt_generator",
            tmp_path / f"from_{name}",
            *run,
            f"ckpt_path={checkpoint}",
            "trainer.num_sanity_val_steps=1",
            *extra,
        )
        assert resumed == {s: whole[s] for s in range(state["global_step"] + 1, 11)}, name
        assert BASE_KEY in torch.load(tmp_path / f"from_{name}" / "checkpoints" / "last.ckpt", weights_only=True)


def test_an_hf_folder_is_a_base_too(tmp_path):
    pytest.importorskip("transformers")
    from test_hf_pretrained import _gpt2

    folder = _gpt2(tmp_path / "gpt2")
    train(
        compose_train(
            "gpt_generator", tmp_path / "run", *LORA, f"init_from={folder}", "adapter.save=only", "test=false"
        )
    )
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    reference = torch.load(ckpt, weights_only=True)[BASE_KEY]
    assert reference["format"] == "hf" and reference["source"] == str(folder.resolve())
    task, _ = load_task(ckpt)
    dense = zoo.from_hf(folder)
    adapted = {k: v for k, v in task.model.state_dict().items() if not zoo.adapters.is_adapter_tensor(k)}
    for name, tensor in dense.state_dict().items():  # the vocabulary's tables padded as the preset pads them
        torch.testing.assert_close(adapted[name][: len(tensor)], tensor, atol=0, rtol=0)
    table = task.model.embed.weight
    assert table.shape[0] % 128 == 0 and table[len(dense.embed.weight) :].eq(0).all()


def test_a_lora_run_on_a_base_saves_adapters_only_by_default(base, tmp_path):
    """Issue 37, item 3: adapter=lora with init_from= and no adapter.save keeps the base out of its
    checkpoints (named and checked by hash); without init_from= nothing else holds the base: whole."""
    train(compose_train("gpt_generator", tmp_path / "based", *LORA, f"init_from={base}", "test=false"))
    based = torch.load(tmp_path / "based" / "checkpoints" / "last.ckpt", weights_only=True)
    assert based["hyper_parameters"]["adapter"]["save"] == "only" and BASE_KEY in based
    assert all(zoo.adapters.is_adapter_tensor(k) for k in based["state_dict"])
    task, _ = load_task(tmp_path / "based" / "checkpoints" / "last.ckpt")  # the base read back
    assert task.model.embed.weight.abs().sum() > 0
    train(compose_train("gpt_generator", tmp_path / "fresh", *LORA, "test=false"))
    fresh = torch.load(tmp_path / "fresh" / "checkpoints" / "last.ckpt", weights_only=True)
    assert fresh["hyper_parameters"]["adapter"]["save"] == "full" and BASE_KEY not in fresh
    assert not all(zoo.adapters.is_adapter_tensor(k) for k in fresh["state_dict"])
