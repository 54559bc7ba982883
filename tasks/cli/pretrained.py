"""``zoo-train init_from=<Hugging Face model folder | hf:repo>``: a run that starts from a pretrained
model. The folder decides the model (its config.json replaces the experiment's preset, said in one
line) and the tokenizer (its tokenizer.json and special tokens); the command line may still change
what does not touch the weights (dropout, the attention kernel, the heads a task adds). Any other
``model.*`` override that disagrees with the folder stops the run before anything is read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

import zoo
from tasks.cli.common import model_config

ADJUSTABLE = ("dropout", "attn_dropout", "attention", "init_std", "pooler", "mlm_head")
"""Model fields a run may set on top of a pretrained model: regularisation, the kernel, and the
heads a task needs (``pooler``, ``mlm_head``: taken from the experiment, new ones start fresh)."""
HEADS = ("pooler", "mlm_head")


def is_hf_source(init_from: Any) -> bool:
    """Whether ``init_from`` names a HF model folder or ``hf:<repo>`` (else: a zoo checkpoint, or nothing)."""
    return bool(init_from) and (str(init_from).startswith("hf:") or zoo.hf.is_hf_folder(str(init_from)))


def hf_source(init_from: Any) -> Path:
    """The HF model folder ``init_from`` names, ``hf:<repo>`` fetched into the hub cache."""
    return zoo.hf.resolve(str(init_from))


def adopt_model(cfg: DictConfig, folder: Path) -> zoo.ZooModel:
    """Read the folder's model and make ``cfg.model`` its config (plus the adjustable fields the run
    sets); returns the model, whose weights the task then loads."""
    try:
        model = zoo.from_hf(folder)
    except zoo.CheckpointError:  # a missing or damaged file: its own one-line error
        raise
    except ValueError as error:  # a setting of the family zoo cannot reproduce
        raise zoo.ConfigError(f"init_from={cfg.init_from}: {error}") from None
    theirs, explicit = model.config, _model_overrides()
    for key in explicit:
        mine = cfg.model.get(key)
        if key not in ADJUSTABLE and key in theirs.to_dict() and mine != getattr(theirs, key):
            raise zoo.ConfigError(f"model.{key}={mine}: the weights in {folder} have {key}={getattr(theirs, key)}; "
                                  f"drop the override (a pretrained model keeps its shape; only "
                                  f"{', '.join(ADJUSTABLE)} may change)")
    wanted = model_config(cfg.model)  # the experiment's model: its heads are what the task trains
    adjusted = {k: getattr(wanted, k) for k in ADJUSTABLE if k in explicit or k in HEADS}
    chosen = theirs.replace(**adjusted)
    with open_dict(cfg):
        for key, value in chosen.to_dict().items():
            cfg.model[key] = value
        cfg.model.preset = None
    print(f"init_from {folder}: the model is the folder's {theirs.arch} ({theirs.n_layers} layers, d_model "
          f"{theirs.d_model}, {zoo.count_parameters(model):,} parameters); it replaces the experiment's model "
          f"preset, and the folder's tokenizer replaces data.tokenizer_*")
    return model


def as_checkpoint(model: zoo.ZooModel) -> dict[str, Any]:
    """The model's weights in the layout ``ZooTask.init_from`` reads."""
    return {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "hyper_parameters": {"model": model.config.to_dict()}}


def _model_overrides() -> list[str]:
    """The ``model.<field>`` keys given on the command line (none outside a Hydra run)."""
    if not HydraConfig.initialized():
        return []
    keys = []
    for override in HydraConfig.get().overrides.task:
        key = override.split("=", 1)[0].lstrip("+~")
        if key.startswith("model.") and key.count(".") == 1:
            keys.append(key.removeprefix("model."))
    return keys
