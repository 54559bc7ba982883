"""GGUF, the file llama.cpp, Ollama and LM Studio run, in and out.

    got = zoo.read_gguf("model.gguf")  # model, tokenizer, specials, chat template, what was loaded
    model = zoo.from_gguf("model.gguf", dtype=torch.float32)  # the model alone
    zoo.gguf_exportable(model)  # "llama", "qwen2", "qwen3", "gemma2", "olmo2", "mixtral", "gpt2"; or a ConfigError
    zoo.to_gguf(model, "out/model.gguf", dtype="q8_0", tokenizer=tok, chat_template=template)

llama.cpp's architectures are records in :data:`ARCHS` (zoo/gguf/names.py), each tied to the zoo.hf
family that computes the same model: a GGUF file is read through that family's config reader and
weight map, and written through them backwards. Quantized tensors (Q4_0, Q4_1, Q8_0, K-quants...)
are dequantized with the ``gguf`` package (llama.cpp's own), which writing also needs.
"""

from __future__ import annotations

import os

import torch

from zoo.gguf import archs as _archs  # noqa: F401  (registers qwen3, gemma2, olmo2 and mixtral)
from zoo.gguf.loader import GGUFContents, read_gguf
from zoo.gguf.names import ARCHS, Arch
from zoo.gguf.writer import FILE_TYPES, gguf_exportable, to_gguf
from zoo.models import ZooModel

__all__ = ["ARCHS", "FILE_TYPES", "Arch", "GGUFContents", "from_gguf", "gguf_exportable", "read_gguf", "to_gguf"]


def from_gguf(path: str | os.PathLike, *, dtype: torch.dtype = torch.float32) -> ZooModel:
    """The zoo model of a llama.cpp GGUF file (eval mode, weights dequantized to ``dtype``); its
    tokenizer, special ids and chat template come with :func:`read_gguf`."""
    return read_gguf(path, dtype=dtype, tokenizer=False).model
