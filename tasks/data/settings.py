"""What each data module takes (``data.*`` in a config), its defaults and the values it refuses, in one
place: the data modules read them, and so does the config schema (``schema/data/<DataModule>``), which
composing a verb's config needs before Lightning and the data modules are imported. Each field
declares the range of its values (``ranged``), and ``check_settings`` is the one check of them: a data
module asks it when it is built, zoo-train and zoo-eval when the config is composed
(``tasks.cli.values``), before anything is read."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import zoo

MAX_VOCAB = 1 << 22  # 4,194,304: beyond any tokenizer in use (the largest are ~256k); training one would not fit


@dataclass(frozen=True)
class Count:
    """A whole number at least ``least`` (and at most ``most``, where a larger one is a mistake); ``hint``
    ends the error of one below ``least``."""

    least: int = 1
    most: int | None = None
    hint: str = ""

    def check(self, key: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise zoo.ConfigError(f"data.{key}={value!r} must be a finite number")
        if not isinstance(value, int):
            raise zoo.ConfigError(f"data.{key}={value!r} must be a whole number")
        if value < self.least:
            raise zoo.ConfigError(f"data.{key}={value} must be {'> 0' if self.least else '>= 0'}{self.hint}")
        if self.most is not None and value > self.most:
            raise zoo.ConfigError(
                f"data.{key}={value} is more than any tokenizer needs (at most {self.most:,}); lower it"
            )


@dataclass(frozen=True)
class Share:
    """A share of something, a number in [0, 1]; ``nothing``: where 0 is refused, the error's fix."""

    nothing: str = ""

    def check(self, key: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
            raise zoo.ConfigError(f"data.{key}={value!r} must be a number in [0.0, 1.0]")
        if self.nothing and value == 0:
            raise zoo.ConfigError(f"data.{key}=0 {self.nothing}")


@dataclass(frozen=True)
class Positive:
    """A finite number above 0 (``what``: what it measures, for the error)."""

    what: str

    def check(self, key: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise zoo.ConfigError(f"data.{key}={value!r} must be > 0 ({self.what})")


def ranged(default: Any, rule: Count | Share | Positive) -> Any:
    """A settings field with its default and the rule its values keep (``check_settings``)."""
    return field(default=default, metadata={"rule": rule})


def check_settings(values: Mapping[str, Any]) -> None:
    """A zoo.ConfigError naming ``data.<key>`` and the fix for the first of ``values`` (a data module's
    settings, or the ``data`` node of a config) that no data module can use, by the rule each settings
    field declares (``ranged``): a count that is not a whole number at least its least
    (``max_records=-5`` would read all records but five), a share out of [0, 1], ``tokenizer_sample_mb``
    not above 0, a vocabulary no tokenizer needs. Keys it does not know, and None (not set), pass."""
    for key, rule in _rules().items():
        value = values.get(key)
        if value is not None:
            rule.check(key, value)


def _rules() -> dict[str, Count | Share | Positive]:
    """The rule of each settings field that declares one, over every data module's settings."""
    return {
        f.name: f.metadata["rule"]
        for settings in SETTINGS.values()
        for f in dataclasses.fields(settings)
        if "rule" in f.metadata
    }


@dataclass(kw_only=True)
class TextData:
    """Every data module's settings (``TextDataModule``)."""

    source: str
    source_args: dict[str, Any] = field(default_factory=dict)
    tokenizer_path: str | None = None
    tokenizer_kind: str | None = None  # None: the data module's own (bpe, wordpiece, unigram)
    vocab_size: int = ranged(4096, Count(most=MAX_VOCAB))
    seq_len: int = ranged(128, Count())
    batch_size: int = ranged(32, Count())
    val_fraction: float = ranged(0.05, Share())
    test_fraction: float = ranged(0.05, Share())
    max_records: int | None = ranged(None, Count(hint="; leave it out (null) to read every record"))
    num_workers: int = ranged(0, Count(least=0, hint=" (0 reads in the training process)"))
    seed: int = 0
    # MB of the training split's text the tokenizer is trained on, at most
    tokenizer_sample_mb: float = ranged(64.0, Positive("MB of text to train on"))

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
    mask_prob: float = ranged(
        0.15, Share(nothing="masks nothing, so nothing is learned; give a share above 0, e.g. 0.15")
    )


@dataclass(kw_only=True)
class TranslationData(TextData):
    """A translator's: its unigram tokenizer trains on at most 4 MB of text (HF's unigram trainer takes about
    100 MB of memory and 4 s per MB of text on 2 cores, ``scripts/bench/records.py --task translator``;
    the shipped data, up to 3 MB, is read whole). Raise it for a larger vocabulary, at that cost."""

    tokenizer_sample_mb: float = ranged(4.0, Positive("MB of text to train on"))


SETTINGS: dict[str, type[TextData]] = {
    "LMDataModule": LMData,
    "ClassificationDataModule": TextData,
    "MLMDataModule": MLMData,
    "TranslationDataModule": TranslationData,
}
"""Each data module's settings by the module's name (``DATA_MODULES``; a test keeps the two alike)."""
