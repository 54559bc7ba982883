"""``zoo-train init_from=<Hugging Face model folder | hf:repo | file.gguf>``: a run that starts from a
pretrained model. The source decides the model (its config replaces the experiment's preset, said in
one line) and the tokenizer (its vocabulary and special tokens); the command line may still change
what does not touch the weights (dropout, the attention kernel, the heads a task adds). Any other
``model.*`` override that disagrees with the source stops the run before anything is read.

Each kind of source is a :class:`PretrainedSource` (:data:`SOURCES`): an HF folder (config.json,
safetensors, tokenizer.json) or a llama.cpp GGUF file (everything in one file, quantized tensors
dequantized to float32).

zoo-eval, zoo-generate and zoo-attention take a source where they take a checkpoint (``load_model_task``):
the source gives the model and the tokenizer, and the task that answers with that model's form
(``source_task``: a decoder continues text, an encoder-decoder translates)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import fields
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict
from tokenizers import Tokenizer

import zoo
from tasks import TASKS, ZooTask
from tasks.cli.loading import load_task
from tasks.cli.schemas import model_config
from tasks.data.tokenizers import Specials, read_hf_tokenizer
from tasks.errors import DataError, UserError

ADJUSTABLE = ("dropout", "attn_dropout", "attention", "init_std", "pooler", "mlm_head", "vocab_multiple_of")
"""Model fields a run may set on top of a pretrained model: regularisation, the kernel, the heads a
task needs (``pooler``, ``mlm_head``: taken from the experiment, new ones start fresh) and the padding
of the vocabulary's rows (``vocab_multiple_of``: the experiment's, 128 in the gpt and bert presets; the
padding rows start at zero, and exports write the true vocabulary)."""
FROM_EXPERIMENT = ("pooler", "mlm_head", "vocab_multiple_of")


class PretrainedSource(ABC):
    """A pretrained model ``init_from`` names: its model and its tokenizer, each read once."""

    kind: ClassVar[str]  # what the source is, in the line adopt_model prints ("folder", "file")

    def __init__(self, path: Path, given: str) -> None:
        self.path, self.given = path, given  # given: init_from= as the user wrote it

    @classmethod
    @abstractmethod
    def names(cls, init_from: str) -> bool:
        """Whether ``init_from`` names a source of this kind."""

    @classmethod
    def resolve(cls, init_from: str) -> Path:
        """The local path of the source (a download for a hub name)."""
        return Path(init_from).expanduser()

    @abstractmethod
    def model(self) -> zoo.ZooModel:
        """The source's model; a CheckpointError for a missing or damaged file, a ValueError for a
        setting zoo cannot reproduce."""

    @abstractmethod
    def tokenizer(self) -> tuple[Tokenizer, Specials]:
        """The tokenizer the weights were trained with, and where its special tokens are."""

    def loaded(self) -> str:
        """What reading the source did to the weights, for the line adopt_model prints ("" when nothing)."""
        return ""


class HFFolder(PretrainedSource):
    """A Hugging Face model folder (save_pretrained's files) or ``hf:<repo>``."""

    kind = "folder"

    @classmethod
    def names(cls, init_from: str) -> bool:
        return init_from.startswith("hf:") or zoo.hf.is_hf_folder(init_from)

    @classmethod
    def resolve(cls, init_from: str) -> Path:
        return zoo.hf.resolve(init_from)  # hf:<repo> fetched into the hub cache

    def model(self) -> zoo.ZooModel:
        return zoo.from_hf(self.path, dtype=torch.float32)

    def loaded(self) -> str:
        stored = sorted(str(t).removeprefix("torch.") for t in zoo.hf.stored_dtypes(self.path) - {torch.float32})
        return f", {'/'.join(stored)} weights read as float32" if stored else ""

    def tokenizer(self) -> tuple[Tokenizer, Specials]:
        return read_hf_tokenizer(self.path)


class GGUFFile(PretrainedSource):
    """A llama.cpp GGUF file (its name ends in .gguf): weights, vocabulary and special ids in one file."""

    kind = "file"

    @classmethod
    def names(cls, init_from: str) -> bool:
        return init_from.lower().endswith(".gguf")

    @cached_property
    def contents(self) -> zoo.GGUFContents:
        return zoo.read_gguf(self.path, dtype=torch.float32)

    def model(self) -> zoo.ZooModel:
        return self.contents.model

    def tokenizer(self) -> tuple[Tokenizer, Specials]:
        got, where = self.contents, f"init_from={self.given}"
        if got.tokenizer is None:
            raise DataError(
                f"{where}: the file holds no vocabulary (tokenizer.ggml.*), so its token ids mean "
                "nothing to zoo's data; use a GGUF file with its tokenizer"
            )
        roles = {f.name for f in fields(Specials)} - {"others", "origin", "chat_template"}
        ids = {role: i for role, i in got.specials.items() if role in roles}
        others = frozenset(i for role, i in got.specials.items() if role not in roles)  # eot...
        return got.tokenizer, Specials(
            **{"decoder_start": ids.get("pad"), **ids}, others=others, origin=where, chat_template=got.chat_template
        )

    def loaded(self) -> str:
        types = sorted({t for kinds in self.contents.loaded.values() for t in kinds.split("+")})
        return f", {'/'.join(types)} weights read as float32"


SOURCES: tuple[type[PretrainedSource], ...] = (GGUFFile, HFFolder)


def is_pretrained_source(init_from: Any) -> bool:
    """Whether ``init_from`` names a pretrained model (HF folder, ``hf:<repo>``, GGUF file) rather than
    a zoo checkpoint (or nothing)."""
    return bool(init_from) and any(source.names(str(init_from)) for source in SOURCES)


def pretrained_source(init_from: Any) -> PretrainedSource:
    """The pretrained source ``init_from`` names (``is_pretrained_source``)."""
    cls = next(source for source in SOURCES if source.names(str(init_from)))
    return cls(cls.resolve(str(init_from)), str(init_from))


def read_model(source: PretrainedSource, field: str) -> zoo.ZooModel:
    """The source's model; a setting of its family that zoo cannot reproduce is a ConfigError naming
    ``field`` (the setting that gave the source), a missing or damaged file the source's CheckpointError."""
    try:
        return source.model()
    except zoo.CheckpointError:  # a missing or damaged file: its own one-line error
        raise
    except ValueError as error:  # a setting of the family zoo cannot reproduce
        raise zoo.ConfigError(f"{field}={source.given}: {error}") from None


def load_model_task(path: str | Path) -> tuple[ZooTask, dict[str, Any]]:
    """What the verbs read from ``ckpt_path``: a zoo-train checkpoint (``load_task``), or a pretrained
    source (``source_task``); the task in eval mode and its run record."""
    return source_task(pretrained_source(path)) if is_pretrained_source(path) else load_task(path)


def source_task(source: PretrainedSource) -> tuple[ZooTask, dict[str, Any]]:
    """The task that answers with the source's model and tokenizer, as zoo-train would have built it
    from ``init_from`` before any step; its run record names the task and no data (the source has none)."""
    model = read_model(source, "ckpt_path")
    names = [name for name in TASKS.names() if model.config.arch in TASKS.get(name).forms]
    if len(names) != 1:  # an encoder: a classifier's or an MLM's, which the source cannot say
        raise UserError(
            f"ckpt_path={source.given} is a pretrained {model.config.arch}, which {' and '.join(names)} "
            f"tasks train alike; fine-tune it with zoo-train init_from={source.given} task=<one of them> "
            f"and pass that run's checkpoint"
        )
    tokenizer, specials = source.tokenizer()
    task = TASKS.get(names[0])(model=model.config.to_dict(), optimizer={}, tokenizer_json=tokenizer.to_str())
    task.model = model  # the source's weights (the task's own fresh model is dropped)
    task.specials = specials.record()
    task.run_info = {"task": names[0], "data_module": None, "data": {}, "source": source.given}
    return task.eval(), task.run_info


def adopt_model(cfg: DictConfig, source: PretrainedSource) -> zoo.ZooModel:
    """Read the source's model and make ``cfg.model`` its config (plus the adjustable fields the run
    sets, and the experiment's heads and vocabulary padding); returns the model as the source holds it,
    whose weights the task then loads (its vocabulary's rows padded there: ``ZooTask.init_from``)."""
    model = read_model(source, "init_from")
    theirs, explicit = model.config, _model_overrides()
    for key in explicit:
        mine = cfg.model.get(key)
        if key not in ADJUSTABLE and key in theirs.to_dict() and mine != getattr(theirs, key):
            raise zoo.ConfigError(
                f"model.{key}={mine}: the weights in {source.path} have {key}="
                f"{getattr(theirs, key)}; drop the override (a pretrained model keeps its shape; "
                f"only {', '.join(ADJUSTABLE)} may change)"
            )
    wanted = model_config(cfg.model)  # the experiment's model: its heads are what the task trains
    adjusted = {k: getattr(wanted, k) for k in ADJUSTABLE if k in explicit or k in FROM_EXPERIMENT}
    chosen = theirs.replace(**adjusted)  # padded as the experiment pads (ZooTask.init_from fits the rows)
    with open_dict(cfg):
        for key, value in chosen.to_dict().items():
            cfg.model[key] = value
        cfg.model.preset = None
    print(
        f"init_from {source.path}: the model is the {source.kind}'s {theirs.arch} ({theirs.n_layers} layers, "
        f"d_model {theirs.d_model}, {zoo.count_parameters(model):,} parameters{source.loaded()}{_rows(chosen)}); it "
        f"replaces the experiment's model preset, and the {source.kind}'s tokenizer replaces data.tokenizer_*"
    )
    return model


def _rows(cfg: zoo.ModelConfig) -> str:
    """What the line adopt_model prints says of the vocabulary's padding ("" without any)."""
    if cfg.padded_vocab_size == cfg.vocab_size:
        return ""
    rows = f"{cfg.padded_vocab_size:,} rows (vocab_multiple_of={cfg.vocab_multiple_of})"
    return f", its {cfg.vocab_size:,} tokens padded to {rows}"


def as_checkpoint(model: zoo.ZooModel) -> dict[str, Any]:
    """The model's weights in the layout ``ZooTask.init_from`` reads."""
    return {
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "hyper_parameters": {"model": model.config.to_dict()},
    }


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
