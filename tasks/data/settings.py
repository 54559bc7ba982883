"""What each data module takes (``data.*`` in a config) and its defaults, in one place: the data
modules read them, and so does the config schema (``schema/data/<DataModule>``), which composing a
verb's config needs before Lightning and the data modules are imported."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
