"""What each data module takes (``data.*`` in a config), its defaults and the values it refuses, in one
place: the data modules read them, and so does the config schema (``schema/data/<DataModule>``), which
composing a verb's config needs before Lightning and the data modules are imported. ``check_settings``
is the one rule for their values: a data module asks it when it is built, zoo-train and zoo-eval when
the config is composed (``tasks.cli.values``), before anything is read."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import zoo

COUNTS = {"vocab_size": 1, "seq_len": 1, "batch_size": 1, "max_records": 1, "num_workers": 0}
"""The whole-number settings and the least each takes (``max_records``: null reads every record)."""
SHARES = {"val_fraction": (0.0, 1.0), "test_fraction": (0.0, 1.0), "mask_prob": (0.0, 1.0)}
"""The settings that are a share of something, and the range each lies in (``mask_prob``: above 0)."""
MAX_VOCAB = 1 << 22  # 4,194,304: beyond any tokenizer in use (the largest are ~256k); training one would not fit
HINTS = {
    "max_records": "; leave it out (null) to read every record",
    "num_workers": " (0 reads in the training process)",
}


def check_settings(values: Mapping[str, Any]) -> None:
    """A zoo.ConfigError naming ``data.<key>`` and the fix for the first of ``values`` (a data module's
    settings, or the ``data`` node of a config) that no data module can use: a count that is not a
    whole number at least its least (``COUNTS``: ``max_records=-5`` would read all records but five),
    a share out of its range, ``tokenizer_sample_mb`` not above 0, a vocabulary no tokenizer needs.
    Keys it does not know, and None (not set), pass."""
    for key, least in COUNTS.items():
        value = values.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise zoo.ConfigError(f"data.{key}={value!r} must be a finite number")
        if not isinstance(value, int):
            raise zoo.ConfigError(f"data.{key}={value!r} must be a whole number")
        if value < least:
            raise zoo.ConfigError(f"data.{key}={value} must be {'> 0' if least else '>= 0'}{HINTS.get(key, '')}")
    for key, (low, high) in SHARES.items():
        value = values.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise zoo.ConfigError(f"data.{key}={value!r} must be a number in [{low}, {high}]")
        if key == "mask_prob" and value == 0:
            raise zoo.ConfigError(f"data.{key}=0 masks nothing, so nothing is learned; give a share above 0, e.g. 0.15")
    sample_mb = values.get("tokenizer_sample_mb")
    if sample_mb is not None and (
        isinstance(sample_mb, bool) or not isinstance(sample_mb, int | float) or not 0 < sample_mb < math.inf
    ):
        raise zoo.ConfigError(f"data.tokenizer_sample_mb={sample_mb!r} must be > 0 (MB of text to train on)")
    vocab = values.get("vocab_size")
    if isinstance(vocab, int) and vocab > MAX_VOCAB:
        raise zoo.ConfigError(
            f"data.vocab_size={vocab} is more than any tokenizer needs (at most {MAX_VOCAB:,}); lower it"
        )


@dataclass(kw_only=True)
class TextData:
    """Every data module's settings (``TextDataModule``)."""

    source: str
    source_args: dict[str, Any] = field(default_factory=dict)
    tokenizer_path: str | None = None
    tokenizer_kind: str | None = None  # None: the data module's own (bpe, wordpiece, unigram)
    vocab_size: int = 4096
    seq_len: int = 128
    batch_size: int = 32
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    max_records: int | None = None
    num_workers: int = 0
    seed: int = 0
    tokenizer_sample_mb: float = 64.0  # MB of the training split's text the tokenizer is trained on, at most

    def __post_init__(self) -> None:
        check_settings({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})


@dataclass(kw_only=True)
class PreparedData(TextData):
    """A corpus tokenized once into the cache (``PreparedDataModule``)."""

    cache_dir: str | None = None


@dataclass(kw_only=True)
class LMData(PreparedData):
    packing: str = "concat"  # or "documents" (LMDataModule)


@dataclass(kw_only=True)
class MLMData(PreparedData):
    mask_prob: float = 0.15


@dataclass(kw_only=True)
class TranslationData(TextData):
    """A translator's: its unigram tokenizer trains on at most 4 MB of text (HF's unigram trainer takes about
    100 MB of memory and 4 s per MB of text on 2 cores, ``scripts/bench/records.py --task translator``;
    the shipped data, up to 3 MB, is read whole). Raise it for a larger vocabulary, at that cost."""

    tokenizer_sample_mb: float = 4.0


SETTINGS: dict[str, type[TextData]] = {
    "LMDataModule": LMData,
    "ClassificationDataModule": TextData,
    "MLMDataModule": MLMData,
    "TranslationDataModule": TranslationData,
}
"""Each data module's settings by the module's name (``DATA_MODULES``; a test keeps the two alike)."""
