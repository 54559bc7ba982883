"""``zoo-info``: parameters, FLOPs per token and KV-cache size of presets, as a table (with the active
parameters, those one token uses, where a mixture-of-experts preset is among them)."""

from __future__ import annotations

import argparse
import json
import sys

import torch
from rich.console import Console
from rich.table import Table

from zoo.kv_cache import KV_FORMATS
from zoo.presets import list_models
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

    names: list[str] = []
    for pattern in args.models or ["*"]:
        matched = list_models(pattern)
        if not matched:
            print(
                f"zoo: ConfigError: no preset matches {pattern!r}; presets: {', '.join(list_models())}", file=sys.stderr
            )
            sys.exit(2)
        names += [n for n in matched if n not in names]
    rows = [
        stats(n, seq_len=args.seq_len, batch_size=args.batch_size, dtype=DTYPES[args.dtype], kv_dtype=args.kv_dtype)
        for n in names
    ]
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    table = Table(title=f"KV cache in {args.kv_dtype or args.dtype}, batch {args.batch_size} (exact numbers: --json)")
    sparse = any(r.active_params != r.params for r in rows)  # a mixture of experts: show what a token uses
    columns = ["model", "params", "non-emb.", "seq len", "FLOPs/token fwd", "train", "KV cache"]
    for column in columns[:2] + ["active"] * sparse + columns[2:]:
        table.add_column(column, justify="left" if column == "model" else "right")
    for r in rows:
        active = [_human(r.active_params, prefixes=" KMBT")] * sparse
        table.add_row(
            r.name,
            _human(r.params, prefixes=" KMBT"),
            *active,
            _human(r.non_embedding_params, prefixes=" KMBT"),
            f"{r.seq_len:,}",
            _human(r.flops_per_token_forward),
            _human(r.flops_per_token_train),
            _human(r.kv_cache_bytes, "B"),
        )
    Console().print(table)


if __name__ == "__main__":
    info_main()
