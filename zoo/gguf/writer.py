"""GGUF out: which llama.cpp architecture computes a zoo model (:func:`gguf_exportable`), and the file
itself (:func:`to_gguf`): the zoo.hf family's weight map gives HF tensors, the architecture's slots
turn them into llama.cpp's names and layouts (q/k rows permuted for ``llama``), and ``gguf``'s own
writer lays them out, written atomically."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import Tensor, nn

from zoo.config import ModelConfig
from zoo.gguf.names import ARCHS, Arch, convert, hf_tensors
from zoo.gguf.tokenizer import ROLES, Vocab, role_ids, tokenizer_vocab
from zoo.hf.mapping import FAMILIES
from zoo.io import atomic_write
from zoo.models import ZooModel
from zoo.registry import ConfigError

FILE_TYPES = {"f32": ("F32", 0), "f16": ("F16", 1), "bf16": ("BF16", 32), "q8_0": ("Q8_0", 7), "q4_0": ("Q4_0", 2)}
"""``dtype=`` -> (ggml type of the 2-D weights, ``general.file_type``); 1-D tensors (norms, biases)
stay F32, and a quantized weight whose rows do not fill its blocks is F16, as llama.cpp does."""
QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION, written with quantized files


def gguf_exportable(model: ZooModel | ModelConfig) -> str:
    """The :data:`~zoo.gguf.names.ARCHS` record whose llama.cpp architecture computes ``model``: its
    name there is llama.cpp's (``llama``, ``qwen2``, ``qwen3``, ``gemma2``, ``olmo2``, ``gpt2``) but for
    ``mixtral``, which llama.cpp runs as ``llama`` with experts (``ARCHS.get(name).name``).

    Raises:
        ConfigError: one line naming the settings the closest architecture does not compute (a mask,
            a position kind, a norm placement, biases...), and the formats that take any composition.
    """
    cfg = model.config if isinstance(model, nn.Module) else model
    found: dict[str, list[str]] = {}
    for name in ARCHS.names():
        arch = ARCHS.get(name)
        unfit = FAMILIES.get(arch.family).unfit
        problems = unfit(cfg) if unfit else []
        fields = {p.split("=")[0] for p in problems}
        problems += [p for p in arch.unfit(cfg) + _scaling_unfit(cfg, arch) if p.split("=")[0] not in fields]
        if not problems:
            return name
        found[name] = problems
    name, problems = min(found.items(), key=lambda item: (item[1][0].startswith("arch="), len(item[1])))
    raise ConfigError(
        f"model.{problems[0].split('=')[0]}: no llama.cpp architecture computes this {cfg.arch}; the "
        f"closest, {name}, differs in {'; '.join(problems)}. Export it with format=safetensors or "
        "format=onnx, or change those settings"
    )


def _scaling_unfit(cfg: ModelConfig, arch: Arch) -> list[str]:
    """A RoPE scaling other than none and linear: llama.cpp has yarn, but zoo.from_gguf reads back
    none and linear only, so zoo writes no yarn keys it would refuse to read."""
    if not arch.rope or cfg.rope_scaling in ("none", "linear"):
        return []
    return [f"rope_scaling={cfg.rope_scaling} (zoo's GGUF files carry none or linear)"]


def to_gguf(
    model: ZooModel,
    path: str | os.PathLike,
    *,
    dtype: str = "f32",
    tokenizer: Tokenizer | None = None,
    specials: Mapping[str, Any] | None = None,
    add_bos: bool = False,
    chat_template: str | None = None,
    name: str | None = None,
    check: Callable[[Path], None] | None = None,
) -> str:
    """Write ``model`` as a llama.cpp GGUF file at ``path`` (which must not exist); return the architecture.

    ``dtype``: f32, f16, bf16, q8_0 or q4_0 for the 2-D weights (see :data:`FILE_TYPES`).
    ``tokenizer``: a byte-level BPE ``tokenizers.Tokenizer`` (written as llama.cpp's ``gpt2`` vocabulary),
    or a SentencePiece one as :func:`~zoo.gguf.loader.read_gguf` reads it (``llama``); None: no
    vocabulary, which llama.cpp needs to run text. ``specials``: role -> id (bos, eos, pad,
    unk, sep, cls, mask, eot; other entries are skipped); by default the model's eos and pad ids.
    ``add_bos``: llama.cpp puts bos before a text. ``chat_template``: a Jinja chat template, stored as text.
    ``check(tmp)`` runs on the finished file before it takes its name (raise to leave nothing behind).
    A muP model is written as the standard model that computes the same logits (``ZooModel.without_mup``),
    a model with padded vocabulary rows with its true vocabulary alone (``ZooModel.with_vocab_multiple(None)``).

    Raises:
        ConfigError: for a model no llama.cpp architecture computes (:func:`gguf_exportable`), a
            tokenizer llama.cpp cannot reproduce, an unknown dtype: before anything is written.
        FileExistsError: ``path`` exists (nothing is overwritten).
    """
    model = model.without_mup()  # muP's multipliers folded into weights: llama.cpp knows none
    model = model.with_vocab_multiple(None)  # the true vocabulary: padding rows (vocab_multiple_of) left out
    arch = ARCHS.get(gguf_exportable(model))
    cfg = model.config
    if dtype not in FILE_TYPES:
        raise ConfigError(f"gguf.dtype={dtype!r} is not a GGUF weight type zoo writes; choose {', '.join(FILE_TYPES)}")
    vocab = tokenizer_vocab(tokenizer, cfg.vocab_size) if tokenizer is not None else None
    ids = role_ids(
        specials if specials is not None else {"eos": cfg.eos_token_id, "pad": cfg.pad_token_id}, cfg.vocab_size
    )
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path}: exists; choose a new file name (nothing is overwritten)")
    gguf = _require_gguf()
    tensors = gguf_tensors(model, arch)
    with atomic_write(path) as tmp:
        writer = gguf.GGUFWriter(tmp, arch.name)
        _write_metadata(writer, arch, cfg, dtype, name or "zoo model")
        if vocab is not None:
            _write_vocab(writer, vocab, add_bos)
        for role, i in ids.items():
            writer.add_uint32(f"tokenizer.ggml.{ROLES[role]}", i)
        if chat_template is not None:
            writer.add_chat_template(chat_template)
        for tensor_name, tensor in tensors.items():
            _add_tensor(writer, tensor_name, tensor, dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        if check is not None:
            check(tmp)
    return arch.name


def _require_gguf() -> Any:
    try:
        import gguf
    except ImportError as error:
        raise ConfigError("format=gguf needs the gguf package (llama.cpp's own writer): pip install gguf") from error
    return gguf


def gguf_tensors(model: ZooModel, arch: Arch) -> dict[str, Tensor]:
    """``model``'s weights under llama.cpp's names, in its layouts (fp32, CPU, torch's dimension order)."""
    cfg = model.config
    written = cfg.replace(tie_embeddings=False) if arch.output_copy else cfg  # GPT-2's head as a copy
    state = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    hf = hf_tensors(state, arch, written)
    out: dict[str, Tensor] = {}
    for slot in arch.block_slots(cfg.n_layers):
        for suffix in ("weight", "bias"):
            tensor = hf.pop(f"{slot.hf}.{suffix}", None)
            if tensor is not None:
                out[f"{slot.gguf}.{suffix}"] = convert(tensor, slot.layout, cfg, arch, to_gguf=True)
    if hf:
        raise RuntimeError(f"zoo.to_gguf: {arch.name} has no GGUF name for {sorted(hf)[:4]}")
    return out


def _write_metadata(writer: Any, arch: Arch, cfg: ModelConfig, dtype: str, name: str) -> None:
    """The architecture's hyperparameters (its :class:`~zoo.gguf.names.Key` table run backwards)."""
    values = FAMILIES.get(arch.family).write_config(cfg)
    writer.add_name(name)
    writer.add_file_type(FILE_TYPES[dtype][1])
    if dtype.startswith("q"):
        writer.add_quantization_version(QUANTIZATION_VERSION)
    for key in arch.keys:
        value = values.get(key.attr)
        if value is not None:
            add = writer.add_uint32 if key.kind == "int" else writer.add_float32
            add(f"{arch.name}.{key.suffix}", value)
    writer.add_uint32(f"{arch.name}.vocab_size", cfg.vocab_size)
    if arch.rope:
        writer.add_uint32(f"{arch.name}.rope.dimension_count", cfg.resolved_head_dim)
        writer.add_uint32(f"{arch.name}.attention.value_length", cfg.resolved_head_dim)
        if cfg.rope_scaling == "linear":
            writer.add_string(f"{arch.name}.rope.scaling.type", "linear")
            writer.add_float32(f"{arch.name}.rope.scaling.factor", cfg.rope_scaling_factor)


def _write_vocab(writer: Any, vocab: Vocab, add_bos: bool) -> None:
    writer.add_tokenizer_model(vocab.model)
    if vocab.pre is not None:
        writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_types(list(vocab.types))
    if vocab.merges:
        writer.add_token_merges(list(vocab.merges))
    if vocab.scores:
        writer.add_token_scores(list(vocab.scores))
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(vocab.add_space_prefix)
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(False)


def _add_tensor(writer: Any, name: str, tensor: Tensor, dtype: str) -> None:
    """One tensor in ``dtype``'s ggml type (1-D: F32; rows that do not fill a block: F16)."""
    import gguf

    kind = FILE_TYPES[dtype][0] if tensor.dim() >= 2 else "F32"
    qtype = gguf.GGMLQuantizationType[kind]
    if qtype not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16):
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        if tensor.shape[-1] % block:
            kind, qtype = "F16", gguf.GGMLQuantizationType.F16
    if kind == "F32":
        writer.add_tensor(name, tensor.numpy())
    elif kind == "F16":
        writer.add_tensor(name, tensor.half().numpy())
    elif kind == "BF16":  # torch rounds to nearest even, as ggml does
        writer.add_tensor(name, tensor.bfloat16().view(torch.int16).numpy(), raw_dtype=qtype)
    else:
        writer.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(tensor.numpy()), qtype), raw_dtype=qtype)


__all__ = ["FILE_TYPES", "gguf_exportable", "gguf_tensors", "to_gguf"]
