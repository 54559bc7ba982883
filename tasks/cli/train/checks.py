"""What zoo-train (and zoo-eval, for its values) refuses, each a zoo.ConfigError that names the key
and the fix: before any data is read, combinations the model, task, data and adapter cannot run,
values that would only fail later and a model ``export_check=`` cannot write; once the data is
read, sizes it disagrees with and a resumed checkpoint's other model."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

import zoo
from tasks import TASKS, ZooTask
from tasks.cli.schemas import model_config
from tasks.cli.values import check_model, check_values
from tasks.optim import optimizer_settings
from tasks.run.init_from import no_base_error
from tasks.strategy import ZooStrategy, strategy_class
from zoo.measuring import free_bytes


def check_composition(cfg: DictConfig) -> zoo.ModelConfig:
    """Everything that can be checked before data is loaded; raises zoo.ConfigError."""
    task_cls = task_class(cfg.task._target_)
    model = model_config(cfg.model)
    task_cls.check_model_config(model)  # the task's needs first (arch), then ModelConfig.validate
    check_values(cfg)
    check_model(cfg)  # the model's rules, and what it asks of the data (zoo-train asked before Lightning too)
    task_cls.check_settings(OmegaConf.to_container(cfg.task, resolve=True), model)
    based = cfg.get("init_from") or cfg.get("ckpt_path")
    if OmegaConf.select(cfg, "adapter.save", default="full") == "only" and not based:
        raise no_base_error("no init_from")  # a resumed checkpoint may name one: the task checks it once read
    adapter = OmegaConf.select(cfg, "adapter.name", default="none")
    if zoo.adapters.ADAPTERS.get(adapter, field="adapter").freezes_base and not based:
        print(
            "zoo: warning: the adapter trains beside a frozen model with random weights (no init_from=): nothing "
            "pretrained is adapted; give init_from=<checkpoint, HF folder or GGUF file>, or drop adapter=",
            file=sys.stderr,
        )
    check_strategy(cfg, model)
    check_loggers(cfg)
    check_fits(cfg, model)
    return model


def check_loggers(cfg: DictConfig) -> None:
    """A logger class that can refuse its own node (``check_installed(key)``: a tracker whose package is
    not installed) refuses it now, before data is read; a ``_target_`` that does not resolve is left to
    Hydra's own line when the loggers are built."""
    for key, node in (cfg.get("logger") or {}).items():
        if node and "_target_" in node:
            try:
                logger = get_class(node._target_)
            except ImportError:
                continue
            check = getattr(logger, "check_installed", None)
            if check is not None:
                check(key)


def check_strategy(cfg: DictConfig, model: zoo.ModelConfig) -> None:
    """A strategy class that can refuse a model (``check_model(model, devices, **settings)``, settings: the
    strategy node's other keys; trainer=tp's groups cannot split it) refuses it now, before data is read or
    a run directory claimed; the model is built on the meta device, so nothing is allocated."""
    target = OmegaConf.select(cfg, "trainer.strategy._target_", default=None)
    devices = OmegaConf.select(cfg, "trainer.devices", default=None)
    strategy = strategy_class(get_class(target) if target else None)
    if strategy is ZooStrategy:  # Lightning's own: the model whole, nothing to refuse
        return
    nodes = OmegaConf.select(cfg, "trainer.num_nodes", default=1)
    strategy.check_run(  # the task, optimizer and nodes it cannot run, before any process starts
        task=task_class(str(cfg.task._target_)),
        optimizer=optimizer_settings(OmegaConf.to_container(cfg.optimizer, resolve=True)),
        num_nodes=nodes if isinstance(nodes, int) else 1,
    )
    if isinstance(devices, int) and devices > 0:
        settings = OmegaConf.to_container(cfg.trainer.strategy, resolve=True)
        settings.pop("_target_")
        with torch.device("meta"):
            strategy.check_model(zoo.build_model(model), devices, **settings)


TRAINING_COPIES = 4  # a trainable parameter's weight, gradient and AdamW's two moments, each of the weight's dtype
HALF_PRECISIONS = ("16-true", "bf16-true", "16", "bf16")  # weights kept in 2 bytes; others keep float32 weights
EXACT_LAYERS = 8  # deeper models are counted from 1- and 2-layer builds: the blocks of a stack are alike


def check_fits(cfg: DictConfig, model: zoo.ModelConfig) -> None:
    """Refuse, before anything is allocated, a model whose weights, gradients and optimizer state
    (``TRAINING_COPIES`` per trainable parameter; the weights alone where the adapter freezes them) cannot
    fit in the free memory of the devices the trainer uses. Activations come on top: passing is no promise."""
    vocab = OmegaConf.select(cfg, "data.vocab_size", default=None)
    if isinstance(vocab, int) and vocab > model.vocab_size and not cfg.get("init_from"):
        model = model.replace(vocab_size=vocab)  # the data decides it, up to data.vocab_size
    device, devices = _train_device(cfg)
    free = free_bytes(device)
    if free is None:
        return
    params = parameter_estimate(model)
    adapter = OmegaConf.select(cfg, "adapter.name", default="none")
    frozen = zoo.adapters.ADAPTERS.get(adapter, field="adapter").freezes_base
    precision = str(OmegaConf.select(cfg, "trainer.precision", default="32-true"))
    width = 2 if precision in HALF_PRECISIONS else 4
    copies = 1 if frozen else TRAINING_COPIES
    need, budget = params * width * copies, free * devices
    if need <= budget:
        return
    sizes = ", ".join(f"model.{name}={value}" for name, value in _sizes(model).items())
    what = "weights" if frozen else "weights, gradients and AdamW's two moments"
    raise zoo.ConfigError(
        f"the model has about {params:,} parameters ({sizes}): {need / 2**30:.3g} GiB for its {what} "
        f"({width * copies} bytes a parameter) but {devices} {device.type} device(s) have "
        f"{budget / 2**30:.3g} GiB free; lower those sizes"
    )


def _train_device(cfg: DictConfig) -> tuple[torch.device, int]:
    """The device the trainer puts the model on (the first of them) and how many it uses."""
    accelerator = str(OmegaConf.select(cfg, "trainer.accelerator", default="cpu"))
    gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    devices = OmegaConf.select(cfg, "trainer.devices", default=1)
    count = torch.cuda.device_count() if gpu else 1
    if isinstance(devices, int) and not isinstance(devices, bool):
        count = count if devices == -1 else max(devices, 1)
    return torch.device("cuda", 0) if gpu and torch.cuda.is_available() else torch.device("cpu"), max(count, 1)


def _sizes(model: zoo.ModelConfig) -> dict[str, int]:
    """The model fields that set its parameter count, resolved (``n_experts`` where its ffn reads it)."""
    sizes = {"vocab_size": model.vocab_size, "d_model": model.d_model, "d_ff": model.resolved_d_ff}
    if model.form.cross_attention:
        sizes |= {"n_encoder_layers": model.resolved_n_encoder_layers}
        sizes |= {"n_decoder_layers": model.resolved_n_decoder_layers}
    else:
        sizes |= {"n_layers": model.n_layers}
    if "n_experts" in zoo.registry.FFN.get(model.ffn, field="ffn").reads:
        sizes |= {"n_experts": model.n_experts}
    return sizes


def parameter_estimate(model: zoo.ModelConfig) -> int:
    """The parameters of ``model``, counted on the meta device (nothing allocated). A stack of more than
    ``EXACT_LAYERS`` blocks is counted from models of 1 and 2 blocks per stack, as 10^6 blocks take
    minutes to lay out even on the meta device."""
    depths = (
        {"n_encoder_layers": model.resolved_n_encoder_layers, "n_decoder_layers": model.resolved_n_decoder_layers}
        if model.form.cross_attention
        else {"n_layers": model.n_layers}
    )
    stacks = tuple(depths)
    if sum(depths.values()) <= EXACT_LAYERS:
        return _meta_count(model)
    base = _meta_count(model.replace(**dict.fromkeys(stacks, 1)))
    total = base
    for name, depth in depths.items():
        per_block = _meta_count(model.replace(**{**dict.fromkeys(stacks, 1), name: 2})) - base
        total += per_block * (depth - 1)
    return total


def _meta_count(model: zoo.ModelConfig) -> int:
    with torch.device("meta"):
        return zoo.count_parameters(zoo.build_model(model))


def task_class(target: str) -> type[ZooTask]:
    """The task class a config names, among zoo's own tasks only."""
    for cls in map(TASKS.get, TASKS.names()):
        if target in (f"{cls.__module__}.{cls.__name__}", f"tasks.{cls.__name__}"):
            return cls
    raise zoo.ConfigError(f"task._target_={target!r} is not a zoo task; choose one of {TASKS.names()}")


EXPORT_CHECKS = ("hf",)


def check_export(cfg: DictConfig, model_cfg: zoo.ModelConfig, task: Any = None) -> None:
    """``export_check=hf``: the model (and, once built, the task's head) must be what zoo-export
    format=hf can write, or the run stops now instead of after training."""
    check = cfg.get("export_check")
    if check is None:
        return
    if check not in EXPORT_CHECKS:
        raise zoo.ConfigError(f"export_check={check}: not a check; choose export_check=hf or leave it null")
    zoo.hf_exportable(model_cfg)
    if task is not None:
        task.hf_classifier()


def data_sizes(
    cfg: DictConfig, model_cfg: zoo.ModelConfig, sizes: dict[str, int], *, pretrained: bool = False
) -> dict[str, int]:
    """The sizes the data decides; an explicit model.vocab_size that disagrees is a ConfigError. A
    pretrained model keeps its vocabulary (its embedding may have rows the tokenizer does not use)."""
    if pretrained:
        if sizes["vocab_size"] > model_cfg.vocab_size:
            raise zoo.ConfigError(
                f"init_from={cfg.init_from}: the tokenizer has {sizes['vocab_size']} tokens but the "
                f"model only {model_cfg.vocab_size} embeddings; use the folder's own tokenizer.json"
            )
        return {k: v for k, v in sizes.items() if k != "vocab_size"}
    explicit = cfg.model.get("vocab_size")
    if explicit is not None and explicit != sizes["vocab_size"]:
        raise zoo.ConfigError(
            f"model.vocab_size={explicit} but the tokenizer has {sizes['vocab_size']} tokens; "
            f"drop model.vocab_size (the data decides it) or set data.vocab_size={explicit}"
        )
    return sizes


HOW_IT_RUNS = ("activation_checkpointing",)  # model fields a resumed run may change: same weights, same outputs


def check_same_model(model_cfg: zoo.ModelConfig, checkpoint: dict[str, Any], path: str) -> None:
    """A resumed run trains the model it checkpointed: the composed model must be that one."""
    theirs = zoo.ModelConfig.from_dict(dict(checkpoint["hyper_parameters"]["model"])).to_dict()
    mine = model_cfg.to_dict()
    diff = [
        f"model.{k}={theirs[k]!r} there, {mine[k]!r} here"
        for k in mine
        if mine[k] != theirs.get(k) and k not in HOW_IT_RUNS
    ]
    if diff:
        run_dir = Path(path).resolve().parent.parent
        raise zoo.ConfigError(
            f"ckpt_path={path} was trained with another model ({'; '.join(diff[:3])}"
            f"{'; …' if len(diff) > 3 else ''}); continue that run with its own config: "
            f"zoo-train resume={run_dir} (key=value overrides apply on top)"
        )
