"""GGUF in: a file's metadata -> a HF-style config -> the zoo.hf family's :class:`ModelConfig`; its
tensors (checked against that config before any is read, dequantized, put back in HF's layout) ->
the family's weight map -> the zoo model; its vocabulary -> a ``tokenizers.Tokenizer``."""

from __future__ import annotations

import math
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import Tensor

from zoo.config import ModelConfig
from zoo.gguf.names import ARCHS, EXPERTS, Arch, Slot, convert, hf_tensors, per_expert
from zoo.gguf.reader import MISSING, GGUFFile
from zoo.gguf.tokenizer import build_tokenizer, read_specials, read_vocab
from zoo.hf.mapping import FAMILIES, Importer
from zoo.io import CheckpointError
from zoo.models import ZooModel, build_model
from zoo.ranges import FloatRange

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
EXTENSION = FloatRange(1.0, hint="the context extension; 1: none")  # rope.scaling.factor, rope.scale_linear


@dataclass
class GGUFContents:
    """What :func:`read_gguf` found in a GGUF file.

    ``loaded`` names the ggml type of each kind of tensor in the file (``"attn_q.weight": "Q4_1"``;
    several types are joined by ``+``), ``dtype`` the torch dtype the weights were dequantized to.
    ``specials`` maps roles (bos, eos, pad, unk, ...) to ids; ``add_bos``/``add_eos`` say whether
    llama.cpp puts them around a text (the tokenizer's post-processor does the same).
    ``chat_template`` is a Jinja template as text: render it in a sandbox, never as code."""

    path: Path
    architecture: str
    model: ZooModel
    dtype: torch.dtype
    loaded: dict[str, str]
    tokenizer: Tokenizer | None = None
    specials: dict[str, int] = field(default_factory=dict)
    add_bos: bool = False
    add_eos: bool = False
    chat_template: str | None = None
    name: str | None = None

    @property
    def config(self) -> ModelConfig:
        return self.model.config


def read_gguf(path: str | os.PathLike, *, dtype: torch.dtype = torch.float32, tokenizer: bool = True) -> GGUFContents:
    """Read a llama.cpp GGUF file: the zoo model (eval mode, weights dequantized to ``dtype``), and
    with ``tokenizer`` its vocabulary, special ids and chat template. Architectures: those of
    :data:`zoo.gguf.names.ARCHS` (llama, which also carries Mistral, and Mixtral where the file has
    ``llama.expert_count``; qwen2; qwen3; gemma2; olmo2; gpt2).

    Raises:
        CheckpointError: one line naming the file and the key or tensor: not a GGUF file, truncated,
            an unknown architecture, a metadata value of the wrong type, a tensor missing, extra or
            of a shape that disagrees with the metadata, a type gguf cannot dequantize, a tokenizer
            kind zoo cannot read.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype}: zoo.read_gguf dequantizes to one of {', '.join(map(str, DTYPES))}")
    with GGUFFile(path) as f:
        arch = _architecture(f)
        cfg = _config(f, arch)
        slots = _expected(f, arch, cfg)
        model, cfg = _model(f, arch, cfg, slots, dtype)
        contents = GGUFContents(f.path, arch.name, model, dtype, _loaded(f), name=f.get("general.name", "str", None))
        if tokenizer:
            _read_tokenizer(f, contents)
    return contents


def _architecture(f: GGUFFile) -> Arch:
    """The record of the file's ``general.architecture``: the one whose ``requires`` key the file sets
    to a nonzero number (Mixtral's ``llama.expert_count``), else the one that requires none."""
    name = f.get("general.architecture", "str")
    records = [ARCHS.get(key) for key in ARCHS.names() if ARCHS.get(key).name == name]
    if not records:
        supported = sorted({ARCHS.get(key).name for key in ARCHS.names()})
        raise CheckpointError(
            f"{f.path}: general.architecture={name!r} is not an architecture zoo reads; supported: "
            f"{', '.join(supported)}"
        )
    marked = [a for a in records if a.requires is not None and f.get(f"{name}.{a.requires}", "int", 0)]
    return (marked or [a for a in records if a.requires is None])[0]


def _hf_values(f: GGUFFile, arch: Arch) -> dict[str, Any]:
    """The HF config attributes the file's metadata and tensor table give."""
    values: dict[str, Any] = {**FAMILIES.get(arch.family).defaults, "model_type": arch.family, **arch.fixed}
    for key in arch.keys:
        value = f.get(f"{arch.name}.{key.suffix}", key.kind, MISSING if key.required else None, within=key.within)
        if value is not None:
            values[key.attr] = value
    _check_counts(f, arch)
    values.update({attr: tensor in f.tensors for attr, tensor in arch.biases.items()})
    values.update(arch.implied(values))
    embedding = f.tensors.get("token_embd.weight")
    if embedding is None or len(embedding.shape) != 2:
        raise CheckpointError(
            f"{f.path}: no 2-D tensor token_embd.weight (the token embeddings); the file is incomplete"
        )
    values["vocab_size"] = embedding.shape[0]
    declared = f.get(f"{arch.name}.vocab_size", "int", None)
    if declared is not None and declared != embedding.shape[0]:
        raise CheckpointError(
            f"{f.path}: {arch.name}.vocab_size={declared} but token_embd.weight has "
            f"{embedding.shape[0]} rows; the file is corrupt"
        )
    values["tie_word_embeddings"] = "output.weight" not in f.tensors
    for role in ("bos", "eos"):
        values[f"{role}_token_id"] = f.get(f"tokenizer.ggml.{role}_token_id", "int", None)
    values["pad_token_id"] = f.get("tokenizer.ggml.padding_token_id", "int", None)
    if arch.rope:
        values["rope_parameters"] = _rope(f, arch, values)
    return values


BOUNDED = ("attention.head_count", "attention.head_count_kv", "attention.key_length", "feed_forward_length")
"""Counts of rows in some tensor: none exceeds the number of values the tensor table holds."""


def _check_counts(f: GGUFFile, arch: Arch) -> None:
    """The header's counts that size the model, compared with the tensor table before anything is built
    or listed (a model is laid out block by block, expert by expert, before its tensors are compared):
    ``block_count`` is the number of ``blk.<i>`` blocks the table holds, ``embedding_length`` the width
    of token_embd.weight, ``expert_count`` the first dimension of every stacked expert tensor, and no
    other count of rows exceeds the number of values in the table (their shapes are compared later)."""
    a, where = arch.name, "the file is corrupt or its metadata wrong"
    blocks = {int(m.group(1)) for name in f.tensors if (m := re.match(r"blk\.(\d+)\.", name))}
    declared = f.get(f"{a}.block_count", "int")
    if declared != len(blocks) or (blocks and max(blocks) != declared - 1):
        held = f"blocks {sorted(blocks)[:3]}{'…' if len(blocks) > 3 else ''}" if blocks else "no blocks"
        raise CheckpointError(f"{f.path}: {a}.block_count={declared} but the tensor table holds {held}; {where}")
    embedding = f.tensors.get("token_embd.weight")
    width = f.get(f"{a}.embedding_length", "int", None)
    if embedding is not None and width is not None and embedding.shape[-1] != width:
        raise CheckpointError(
            f"{f.path}: {a}.embedding_length={width} but token_embd.weight has rows of {embedding.shape[-1]}; {where}"
        )
    suffixes = {key.suffix for key in arch.keys}
    if "expert_count" in suffixes:
        experts = f.get(f"{a}.expert_count", "int", None)
        stacks = [s.gguf.format(i=0) + ".weight" for s in arch.slots if s.layout == EXPERTS]
        found = {name: f.tensors[name].shape[0] for name in stacks if name in f.tensors}
        if experts is not None and (not found or any(n != experts for n in found.values())):
            held = ", ".join(f"{name} stacks {n}" for name, n in found.items()) or f"the file has no {stacks[0]}"
            raise CheckpointError(f"{f.path}: {a}.expert_count={experts} but {held}; {where}")
    values = sum(math.prod(info.shape) for info in f.tensors.values() if info.nbytes)
    for suffix in BOUNDED:
        value = f.get(f"{a}.{suffix}", "int", None) if suffix in suffixes else None
        if value is not None and value > values:
            raise CheckpointError(
                f"{f.path}: {a}.{suffix}={value} is more than the {values} values all its tensors hold; {where}"
            )


def _rope(f: GGUFFile, arch: Arch, values: dict[str, Any]) -> dict[str, Any]:
    """RoPE settings in transformers' ``rope_parameters`` form; rotations zoo lacks are refused."""
    a = arch.name
    head_dim = values.get("head_dim") or values["hidden_size"] // max(values["num_attention_heads"], 1)
    for key in (f"{a}.rope.dimension_count", f"{a}.attention.value_length"):
        value = f.get(key, "int", head_dim)
        if value != head_dim:
            raise CheckpointError(
                f"{f.path}: {key}={value} differs from the head size {head_dim}; zoo rotates and "
                "projects whole heads (partial rotary embeddings are not supported)"
            )
    params = {"rope_type": "default", "rope_theta": values.get("rope_theta", 10000.0)}
    kind = f.get(f"{a}.rope.scaling.type", "str", "none")
    linear = f.get(f"{a}.rope.scale_linear", "float", 1.0, within=EXTENSION)
    factor = f.get(f"{a}.rope.scaling.factor", "float", linear, within=EXTENSION)
    if kind == "none" and factor != 1.0:
        kind = "linear"  # older files: rope.scale_linear alone
    if kind == "linear":
        return {**params, "rope_type": "linear", "factor": factor}
    if kind != "none":
        raise CheckpointError(
            f"{f.path}: {a}.rope.scaling.type={kind!r} is a RoPE scaling zoo does not compute (it has none and linear)"
        )
    return params


def _config(f: GGUFFile, arch: Arch) -> ModelConfig:
    """The family's ModelConfig of the file's metadata; what zoo cannot build names the file."""
    values = _hf_values(f, arch)
    try:
        return FAMILIES.get(arch.family).config(SimpleNamespace(**values)).validate()
    except CheckpointError:
        raise
    except (ValueError, TypeError) as error:
        raise CheckpointError(f"{f.path}: its {arch.name} metadata gives a model zoo cannot build: {error}") from None


def _expected(f: GGUFFile, arch: Arch, cfg: ModelConfig) -> dict[str, tuple[str, Slot, torch.Size]]:
    """GGUF tensor name -> (HF name, slot, shape) for every tensor ``cfg``'s model has, checked against
    the file's tensor table before anything is read."""
    with torch.device("meta"):
        shapes = {name: t.shape for name, t in hf_tensors(build_model(cfg).state_dict(), arch, cfg).items()}
    expected = {}
    for slot in arch.block_slots(cfg.n_layers):
        for suffix in ("weight", "bias"):
            hf = f"{slot.hf}.{suffix}"
            if hf in shapes:
                shape = shapes[hf]
                if slot.layout == "conv1d" and len(shape) == 2:
                    shape = torch.Size(reversed(shape))
                expected[f"{slot.gguf}.{suffix}"] = (hf, slot, shape)
    missing = [name for name in expected if name not in f.tensors]
    extra = [name for name in f.tensors if name not in expected]
    if missing or extra:
        what = (
            (f"lacks {', '.join(missing[:4])}" if missing else "")
            + (" and " if missing and extra else "")
            + (f"has tensors zoo cannot place: {', '.join(extra[:4])}" if extra else "")
        )
        raise CheckpointError(
            f"{f.path}: the file {what}{'…' if len(missing) > 4 or len(extra) > 4 else ''}; its "
            f"{arch.name} metadata describes another model, or a feature zoo lacks"
        )
    for name, (_, _, shape) in expected.items():
        found = torch.Size(f.tensors[name].shape)
        if found != shape:
            raise CheckpointError(
                f"{f.path}: tensor {name} has shape {tuple(found)} but the metadata gives "
                f"{tuple(shape)}; the file is corrupt or its metadata wrong"
            )
    return expected


def _model(
    f: GGUFFile, arch: Arch, cfg: ModelConfig, expected: dict[str, tuple[str, Slot, torch.Size]], dtype: torch.dtype
) -> tuple[ZooModel, ModelConfig]:
    """The zoo model from the file's tensors (a head equal to the embedding is tied)."""
    tensors: dict[str, Tensor] = {}
    for name, (hf, slot, _) in expected.items():
        tensors[hf] = convert(f.tensor(name), slot.layout, cfg, arch, to_gguf=False).to(dtype)
    embedding = expected["token_embd.weight"][0]
    if "lm_head.weight" in tensors and torch.equal(tensors["lm_head.weight"], tensors[embedding]):
        del tensors["lm_head.weight"]  # llama.cpp's converter writes GPT-2's tied head as a copy
        cfg = cfg.replace(tie_embeddings=True)
    family = FAMILIES.get(arch.family)
    weights = Importer(per_expert(tensors, arch, cfg), f"{family.prefix}.", str(f.path))
    cfg = family.weights(weights, cfg)
    weights.check_leftovers(family.backbone, family.ignored)
    with torch.device("meta"):
        model = build_model(cfg)
    model.load_state_dict(weights.out, strict=True, assign=True)
    unset = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if unset:
        raise RuntimeError(f"zoo.read_gguf left tensors without values: {unset[:5]}")
    return model.eval(), cfg


def _loaded(f: GGUFFile) -> dict[str, str]:
    kinds: dict[str, set[str]] = defaultdict(set)
    for name, info in f.tensors.items():
        kinds[re.sub(r"^blk\.\d+\.", "", name)].add(info.type_name)
    return {kind: "+".join(sorted(types)) for kind, types in kinds.items()}


def _read_tokenizer(f: GGUFFile, contents: GGUFContents) -> None:
    vocab = read_vocab(f)
    contents.specials = read_specials(f)
    contents.chat_template = f.get("tokenizer.chat_template", "str", None)
    if vocab is None:
        return
    if len(vocab.tokens) != contents.config.vocab_size:
        raise CheckpointError(
            f"{f.path}: tokenizer.ggml.tokens has {len(vocab.tokens)} tokens for "
            f"{contents.config.vocab_size} embedding rows; the file is corrupt"
        )
    contents.add_bos = f.get("tokenizer.ggml.add_bos_token", "bool", vocab.model == "llama")
    contents.add_eos = f.get("tokenizer.ggml.add_eos_token", "bool", False)
    contents.tokenizer = build_tokenizer(
        vocab, contents.specials, add_bos=contents.add_bos, add_eos=contents.add_eos, where=str(f.path)
    )
