"""The optimizer choice (tasks.optim): which parameters Muon trains in each form, the combined
optimizer stepping exactly as torch's Muon and AdamW side by side, its state_dict round trip, the
schedule scaling both, the AdamW default for settings without a name, and the one-line errors."""

from __future__ import annotations

import copy
import io
import re

import pytest
import torch
from torch import nn

import zoo
from tasks import ClassifierTask, GeneratorTask, MLMTask, TranslatorTask
from tasks.optim import (
    OPTIMIZERS,
    AdamWSettings,
    MuonSettings,
    MuonWithAdamW,
    build_optimizer,
    check_same_optimizer,
    optimizer_settings,
)

ADAMW = {"lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.95], "eps": 1e-8}
MUON = {**ADAMW, "name": "muon", "lr": 2e-3, "adamw_lr": 5e-4, "momentum": 0.9}
HIDDEN = re.compile(r"\.blocks\.\d+\.(attn|cross_attn|ffn)\.\w+\.weight$")  # a block's projection matrices
NEVER_MUON = ("embed", "lm_head", "norm", "bias", "pooler", "head.", "position", "segment")


def _task(kind: str, **extra) -> nn.Module:
    torch.manual_seed(0)
    if kind == "decoder":  # tied embeddings, learned positions, biases
        return GeneratorTask(model=zoo.get_config("gpt-tiny").to_dict(), optimizer=MUON, **extra)
    if kind == "decoder_untied":  # its own LM head, RMSNorm, no biases
        return GeneratorTask(model=zoo.get_config("llama-tiny").to_dict(), optimizer=MUON, **extra)
    if kind == "classifier":  # pooler and a task head outside the model
        return ClassifierTask(
            model=zoo.get_config("bert-tiny").to_dict(), optimizer=MUON, label_names=["a", "b", "c"], **extra
        )
    if kind == "mlm":  # the MLM head's dense layer, norm and bias
        return MLMTask(model=zoo.get_config("bert-tiny", mlm_head=True).to_dict(), optimizer=MUON, **extra)
    return TranslatorTask(model=zoo.get_config("t5-tiny").to_dict(), optimizer=MUON, **extra)  # cross-attention


def _names(module: nn.Module, params: list[torch.Tensor]) -> set[str]:
    ids = {id(p) for p in params}
    return {n for n, p in module.named_parameters() if id(p) in ids}


@pytest.mark.parametrize(
    "kind,n_muon",
    [("decoder", 8), ("decoder_untied", 8), ("classifier", 8), ("mlm", 8), ("encoder_decoder", 22)],
)
def test_muon_takes_the_blocks_matrices_and_adamw_the_rest(kind, n_muon):
    task = _task(kind)
    optimizer = build_optimizer(task, MUON)
    assert isinstance(optimizer, MuonWithAdamW)
    muon, decay, no_decay = (g["params"] for g in optimizer.param_groups)
    to_muon = _names(task, muon)
    assert len(to_muon) == n_muon  # q/k/v (fused), out and the two FFN matrices per block; T5's cross q, kv, out
    assert to_muon == {n for n, p in task.named_parameters() if HIDDEN.search(n) and p.ndim == 2}
    assert not [n for n in to_muon if any(word in n for word in NEVER_MUON)]
    every = [p for p in task.parameters()]
    assert sorted(map(id, muon + decay + no_decay)) == sorted(map(id, every))  # each parameter once
    embeddings = {n for n, m in task.named_modules() if isinstance(m, nn.Embedding)}
    assert {f"{n}.weight" for n in embeddings} <= _names(task, no_decay)  # embeddings never decay
    assert {n for n in _names(task, decay)} == {
        n
        for n, p in task.named_parameters()
        if p.ndim >= 2 and n not in to_muon and n.removesuffix(".weight") not in embeddings
    }  # the other matrices (LM head, pooler, task heads) decay with AdamW
    assert [g["lr"] for g in optimizer.param_groups] == [2e-3, 5e-4, 5e-4]
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.1, 0.0]


def test_muon_with_no_block_weight_to_train_is_refused():
    lora = _task("decoder", adapter={"name": "lora", "rank": 4, "alpha": 8, "targets": ["q", "v"]})
    frozen = _task("classifier")
    for p in frozen.model.parameters():
        p.requires_grad_(False)  # only the classifier head trains
    for task in (lora, frozen):  # Muon would train nothing: the run would be AdamW's under another name
        with pytest.raises(zoo.ConfigError, match=r"^optimizer=muon found no trainable linear-layer weight"):
            build_optimizer(task, MUON)


def test_an_moe_router_goes_to_muon_and_its_stacked_experts_to_adamw():
    task = GeneratorTask(model=zoo.get_config("llama-tiny", ffn="moe", n_experts=4).to_dict(), optimizer=MUON)
    optimizer = build_optimizer(task, MUON)
    muon, decay, _ = (_names(task, g["params"]) for g in optimizer.param_groups)
    assert {n for n in muon if ".ffn." in n} == {f"model.decoder.blocks.{i}.ffn.router.weight" for i in (0, 1)}
    experts = {n for n, p in task.named_parameters() if p.ndim == 3}
    assert experts and experts <= decay


# ---- stepping ------------------------------------------------------------------------------------
def _set_grads(module: nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.grad = torch.randn(p.shape, generator=generator)


def _separate(task: nn.Module, scale: float = 1.0) -> list[torch.optim.Optimizer]:
    """torch's own Muon and AdamW on the groups the test names (not tasks.optim's), lrs times ``scale``."""
    named = dict(task.named_parameters())
    hidden = [p for n, p in named.items() if HIDDEN.search(n)]
    embeddings = {id(m.weight) for m in task.modules() if isinstance(m, nn.Embedding)}
    rest = [p for n, p in named.items() if not HIDDEN.search(n)]
    decay = [p for p in rest if p.ndim >= 2 and id(p) not in embeddings]
    no_decay = [p for p in rest if p.ndim < 2 or id(p) in embeddings]
    muon = torch.optim.Muon(
        hidden, lr=2e-3 * scale, weight_decay=0.1, momentum=0.9, nesterov=True, adjust_lr_fn="match_rms_adamw"
    )
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return [muon, torch.optim.AdamW(groups, lr=5e-4 * scale, betas=(0.9, 0.95), eps=1e-8)]


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def _step(task: nn.Module, optimizers: list[torch.optim.Optimizer], seed: int) -> None:
    _set_grads(task, seed)
    for optimizer in optimizers:
        optimizer.step()


@pytest.mark.parametrize("kind", ["decoder_untied", "encoder_decoder"])
def test_a_step_is_torchs_muon_and_adamw_side_by_side(kind):
    combined_task = _task(kind)
    separate_task = copy.deepcopy(combined_task)
    combined, separate = build_optimizer(combined_task, MUON), _separate(separate_task)
    before = copy.deepcopy(combined_task)
    for seed in (1, 2, 3):  # the later steps use the momentum and moments of the first
        _step(combined_task, [combined], seed)
        _step(separate_task, separate, seed)
        assert _same_weights(combined_task, separate_task)
    assert not _same_weights(combined_task, before)


def _round_trip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)  # as Lightning reads checkpoints here


def test_the_state_dict_round_trip_gives_the_same_next_steps():
    task = _task("decoder")
    optimizer = build_optimizer(task, MUON)
    for seed in (1, 2):
        _step(task, [optimizer], seed)
    saved = _round_trip(optimizer.state_dict())
    assert len(saved["state"]) == sum(len(g["params"]) for g in optimizer.param_groups)
    resumed_task = copy.deepcopy(task)
    resumed = build_optimizer(resumed_task, MUON)
    resumed.load_state_dict(saved)
    for seed in (3, 4):
        _step(task, [optimizer], seed)
        _step(resumed_task, [resumed], seed)
        assert _same_weights(task, resumed_task)
    assert resumed.muon.state is resumed.adamw.state is resumed.state


def test_the_schedule_scales_both_learning_rates_and_still_does_after_a_load():
    task = _task("encoder_decoder")
    separate_task = copy.deepcopy(task)
    optimizer = build_optimizer(task, MUON)
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    assert [g["lr"] for g in optimizer.muon.param_groups + optimizer.adamw.param_groups] == [1e-3, 2.5e-4, 2.5e-4]
    _step(task, [optimizer], 1)
    _step(separate_task, _separate(separate_task, scale=0.5), 1)
    assert _same_weights(task, separate_task)  # Muon and AdamW both stepped at half their learning rates

    saved = _round_trip(optimizer.state_dict())
    fresh = build_optimizer(task, MUON)
    torch.optim.lr_scheduler.LambdaLR(fresh, lambda step: 1.0)
    fresh.load_state_dict(saved)  # what Lightning does on resume: optimizer built, scheduler made, state loaded
    torch.optim.lr_scheduler.LambdaLR(fresh, lambda step: 0.0)
    before = copy.deepcopy(task)
    _step(task, [fresh], 2)
    assert _same_weights(task, before)  # lr 0 reached both inner optimizers (decay is times lr too)


# ---- AdamW, the default --------------------------------------------------------------------------
def test_settings_without_a_name_are_adamw_with_the_decay_groups_of_before():
    task = _task("decoder_untied")
    assert type(optimizer_settings(ADAMW)) is AdamWSettings
    optimizer = build_optimizer(task, ADAMW)
    assert type(optimizer) is torch.optim.AdamW
    decay, no_decay = (g["params"] for g in optimizer.param_groups)
    assert _names(task, decay) == {n for n, p in task.named_parameters() if p.ndim == 2 and n != "model.embed.weight"}
    assert "model.embed.weight" in _names(task, no_decay)
    assert [(g["lr"], g["weight_decay"], g["betas"], g["fused"]) for g in optimizer.param_groups] == [
        (1e-3, 0.1, (0.9, 0.95), None),
        (1e-3, 0.0, (0.9, 0.95), None),
    ]
    assert build_optimizer(task, {**ADAMW, "name": "adamw"}).state_dict() == optimizer.state_dict()


def test_conf_optimizer_files_are_the_registered_names_and_valid():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from tasks.cli.schemas import conf_dir

    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        for name in OPTIMIZERS.names():
            cfg = compose("train", overrides=[f"optimizer={name}"])
            settings = optimizer_settings(OmegaConf.to_container(cfg.optimizer))
            assert type(settings).name == name
    assert isinstance(settings, MuonSettings) and settings.adjust_lr_fn == "match_rms_adamw"


# ---- one-line errors -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change,field",
    [
        ({"name": "muom"}, "optimizer.name='muom' is not a registered optimizer; valid names: adamw, muon"),
        ({"momentun": 0.9}, "optimizer.momentun is not a setting of optimizer=muon"),
        ({"lr": None}, "optimizer.lr=None must be a number > 0"),
        ({"lr": "1e-3"}, "optimizer.lr='1e-3' must be a number > 0"),
        ({"lr": 0}, "optimizer.lr=0"),
        ({"weight_decay": -0.1}, "optimizer.weight_decay=-0.1"),
        ({"betas": [0.9]}, "optimizer.betas=[0.9] must be two numbers"),
        ({"betas": [0.9, 1.0]}, "optimizer.betas[1]=1.0"),
        ({"momentum": 1.0}, "optimizer.momentum=1.0"),
        ({"nesterov": "yes"}, "optimizer.nesterov='yes' must be true or false"),
        ({"ns_steps": 0}, "optimizer.ns_steps=0"),
        ({"ns_steps": 2.5}, "optimizer.ns_steps=2.5"),
        ({"adjust_lr_fn": "keller"}, "optimizer.adjust_lr_fn='keller' must be one of original, match_rms_adamw"),
        ({"adamw_lr": -1}, "optimizer.adamw_lr=-1"),
        ({"fused": "auto"}, "optimizer.fused='auto'"),
    ],
)
def test_bad_settings_are_one_line_config_errors_naming_the_field(change, field):
    with pytest.raises(zoo.ConfigError) as caught:
        optimizer_settings({**MUON, **change})
    assert str(caught.value).startswith(field) and "\n" not in str(caught.value)


def test_muon_settings_are_not_adamws_and_a_missing_one_is_named():
    with pytest.raises(zoo.ConfigError, match=r"^optimizer.momentum is not a setting of optimizer=adamw"):
        optimizer_settings({**ADAMW, "momentum": 0.9})
    with pytest.raises(zoo.ConfigError, match=r"^optimizer.betas is missing: optimizer=muon needs lr, weight_decay"):
        optimizer_settings({"name": "muon", "lr": 1e-3, "weight_decay": 0.0})


def test_resuming_with_another_optimizer_is_refused_in_one_line():
    task = _task("decoder")
    adamw_state = _round_trip(build_optimizer(task, ADAMW).state_dict())
    with pytest.raises(zoo.ConfigError, match="not Muon \\+ AdamW's"):
        build_optimizer(task, MUON).load_state_dict(adamw_state)
    check_same_optimizer(ADAMW, {**ADAMW, "name": "adamw"})  # no name was AdamW
    with pytest.raises(zoo.ConfigError, match=r"^optimizer.name=muon cannot resume .* optimizer.name=adamw"):
        check_same_optimizer(ADAMW, MUON)


# ---- zoo-train end to end: needs ZooTask.configure_optimizers to build through tasks.optim --------
@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["gpt_generator", "bert_classifier", "bert_mlm", "t5_translator"])
def test_zoo_train_trains_each_form_with_muon(experiment, tmp_path):
    from test_tasks import compose_train

    from tasks.cli.train.training import train

    metric = train(compose_train(experiment, tmp_path, "optimizer=muon", "test=false"))
    assert metric is not None and metric == metric  # the monitored metric came back, not NaN
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    groups = checkpoint["optimizer_states"][0]["param_groups"]
    assert [g.get("name") for g in groups] == ["muon", "adamw", "adamw_no_decay"]
    assert checkpoint["hyper_parameters"]["optimizer"]["name"] == "muon"


@pytest.mark.slow
def test_a_killed_muon_run_resumes_bit_for_bit(tmp_path):
    """test_resume's kill-and-resume with optimizer=muon: both resumes repeat the losses to the bit."""
    from test_resume import RUNS, _crash, _losses

    run = ["model.dropout=0.1", "trainer.max_steps=10", "optimizer=muon", *RUNS["gpt_generator"]]
    whole = _losses("gpt_generator", tmp_path / "whole", *run)
    _crash("gpt_generator", tmp_path / "killed", 8, tmp_path / "whole", *run)
    for name in ("last", "on_exception"):
        checkpoint = tmp_path / "killed" / "checkpoints" / f"{name}.ckpt"
        start = torch.load(checkpoint, weights_only=True)["global_step"]
        again = [f"ckpt_path={checkpoint}", "trainer.num_sanity_val_steps=1"]
        resumed = _losses("gpt_generator", tmp_path / f"from_{name}", *run, *again)
        assert resumed == {s: whole[s] for s in range(start + 1, 11)}, name
