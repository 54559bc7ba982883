"""``zoo-info``: parameters, FLOPs per token and KV-cache size of presets, or of the model of a checkpoint,
a zoo or Hugging Face model folder or a GGUF file, as a table (with the active parameters, those one token
uses, where a mixture-of-experts model is among them)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from zoo.config import ModelConfig
from zoo.hf import from_hf_config
from zoo.hf.folder import is_hf_folder
from zoo.hf.folder import read_config as read_hf_config
from zoo.io import CheckpointError, load_weights_file
from zoo.kv_cache import KV_FORMATS
from zoo.presets import list_models
from zoo.pretrained import read_config as read_zoo_config
from zoo.registry import ConfigError
from zoo.stats import stats

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "int8": torch.int8,
    "float8": torch.float8_e4m3fn,
}


def _human(n: float, unit: str = "", prefixes: str = " KMGTPE") -> str:
    for prefix in prefixes[:-1]:
        if abs(n) < 1000:
            return f"{n:.3g} {prefix.strip()}{unit}".rstrip()
        n /= 1000
    return f"{n:.3g} {prefixes[-1]}{unit}"


def config_of(path: str) -> ModelConfig:
    """The model config of a file or folder: a zoo or Hugging Face model folder (config.json), a GGUF file
    (its header and tensor table), or a checkpoint (``torch.save``: its ``hyper_parameters.model``,
    read weights-only)."""
    source = Path(path)
    if source.is_dir():
        if is_hf_folder(source):
            return from_hf_config(read_hf_config(source))
        return read_zoo_config(source)
    if source.suffix.lower() == ".gguf":
        from zoo.gguf import read_gguf  # noqa: PLC0415  (its reader only when a GGUF file is asked about)

        return read_gguf(source).model.config
    checkpoint = load_weights_file(source)
    model = (checkpoint.get("hyper_parameters") or {}).get("model") if isinstance(checkpoint, dict) else None
    if not isinstance(model, dict):
        raise CheckpointError(
            f"{path}: holds no model config (a zoo-train checkpoint does); pass one, or a preset name"
        )
    return ModelConfig.from_dict(model)


def _one_line(read: Callable[[], ModelConfig]) -> ModelConfig:
    try:
        return read()
    except (CheckpointError, ConfigError) as error:
        print(f"zoo: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(2)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def info_main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="zoo-info", description=__doc__)
    parser.add_argument("models", nargs="*", help="preset names or fnmatch patterns (default: all presets)")
    parser.add_argument("--seq-len", type=positive_int, default=None, help="context length (default: the preset's)")
    parser.add_argument("--batch-size", type=positive_int, default=1)
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument(
        "--kv-dtype",
        default=None,
        choices=KV_FORMATS.names(),
        help="how the KV cache is stored (int8: with a scale per head and position; default: --dtype)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)

    models: list[tuple[str, str | ModelConfig]] = []
    for pattern in args.models or ["*"]:
        if os.path.exists(pattern):  # a checkpoint, a model folder, a GGUF file: its model
            shown = pattern if len(pattern) <= 24 else "…" + pattern[-23:]
            models.append((shown, _one_line(lambda path=pattern: config_of(path))))
            continue
        matched = list_models(pattern)
        if not matched:
            print(
                f"zoo: ConfigError: {pattern!r} is no file or folder, and no preset matches it; presets: "
                f"{', '.join(list_models())}",
                file=sys.stderr,
            )
            sys.exit(2)
        models += [(n, n) for n in matched if (n, n) not in models]
    settings = dict(seq_len=args.seq_len, batch_size=args.batch_size, dtype=DTYPES[args.dtype], kv_dtype=args.kv_dtype)
    rows = [replace(stats(model, **settings), name=name) for name, model in models]
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    table = Table(
        title=f"KV cache in {args.kv_dtype or args.dtype}, batch {args.batch_size} (exact numbers: --json)",
        caption="vocab: the tokens predicted, and the embedding and head rows where padded (vocab_multiple_of);\n"
        "params and FLOPs count the true vocabulary, FLOPs attention whole (--json: the causal half too)",
    )
    sparse = any(r.active_params != r.params for r in rows)  # a mixture of experts: show what a token uses
    columns = ["model", "params", "non-emb.", "vocab", "seq len", "FLOPs/token fwd", "train", "KV cache"]
    for column in columns[:2] + ["active"] * sparse + columns[2:]:
        table.add_column(column, justify="left" if column == "model" else "right", no_wrap=column == "model")
    for r in rows:
        active = [_human(r.active_params, prefixes=" KMBT")] * sparse
        padded = f" ({r.padded_vocab_size:,} rows)" if r.padded_vocab_size != r.vocab_size else ""
        table.add_row(
            r.name,
            _human(r.params, prefixes=" KMBT"),
            *active,
            _human(r.non_embedding_params, prefixes=" KMBT"),
            f"{r.vocab_size:,}{padded}",
            f"{r.seq_len:,}",
            _human(r.flops_per_token_forward),
            _human(r.flops_per_token_train),
            _human(r.kv_cache_bytes, "B"),
        )
    Console().print(table)


if __name__ == "__main__":
    info_main()
