"""The base every task's data module extends (``TextDataModule``). It loads records from a source,
splits them deterministically by a hash of their key, trains (or loads) a tokenizer on the training
split or uses one handed in (a Hugging Face model's: ``use_tokenizer``), and says which sizes the
model must take from the data (``model_sizes``). Special tokens are wherever the tokenizer has them
(``specials``), not at fixed ids. The tasks' own modules are in modules.py.

Training resumes exactly: the order of a training epoch is a pure function of (seed, epoch), the
train loader (``ResumableLoader``, in loading.py) tells Lightning how many batches of which epoch it handed out
and skips them after a resume, and per-batch randomness (MLM's masks) is drawn from a generator
seeded by (seed, epoch, rank, batch position), never from the global RNG.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

import lightning as L
import torch
from tokenizers import Tokenizer
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from tasks.data.loading import (
    BucketBatchSampler,
    EpochBatchSampler,
    ResumableLoader,
    ShuffledBatchSampler,
    world_rank,
)
from tasks.data.sources import check_texts, load_records, split_of
from tasks.data.tokenizers import Specials, added_around, load_or_train, misplaced_specials
from tasks.errors import DataError


class TextDataModule(L.LightningDataModule):
    """The tokenizer is zoo's own (trained, or loaded from data.tokenizer_path), or another handed in
    with ``use_tokenizer`` before setup; ``specials`` says where its special tokens are."""

    tokenizer_kind: ClassVar[str] = "bpe"
    fields: ClassVar[tuple[str, ...]] = ("text",)  # what every record must have (see texts, build_dataset)
    needs: ClassVar[tuple[str, ...]] = ()  # special tokens the task needs besides pad (see use_tokenizer)

    def __init__(
        self,
        *,
        source: str,
        source_args: dict[str, Any] | None = None,
        tokenizer_path: str | None = None,
        tokenizer_kind: str | None = None,
        vocab_size: int = 4096,
        seq_len: int = 128,
        batch_size: int = 32,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        max_records: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.source, self.source_args = source, dict(source_args or {})
        self.tokenizer_path = tokenizer_path
        self.kind = tokenizer_kind or self.tokenizer_kind
        self.vocab_size, self.seq_len, self.batch_size = vocab_size, seq_len, batch_size
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.max_records, self.num_workers, self.seed = max_records, num_workers, seed
        self.tokenizer: Tokenizer | None = None
        self.specials = Specials.zoo()
        self.added: tuple[list[int], list[int]] = ([], [])  # ids the tokenizer puts before / after a text (setup)
        self.datasets: dict[str, Dataset] = {}

    # ---- what subclasses define -----------------------------------------------------------------
    def texts(self, record: dict[str, Any]) -> list[str]:
        """The texts of a record the tokenizer learns from."""
        return [record["text"]]

    def build_dataset(self, records: list[dict[str, Any]], split: str) -> Dataset:
        raise NotImplementedError

    def collate(self, batch: list[Any]) -> dict[str, Tensor]:
        raise NotImplementedError

    def task_info(self) -> dict[str, Any]:
        return {}

    def collate_for(self, split: str) -> Callable[[list[Any]], dict[str, Any]]:
        return self.collate

    # ---- shared ---------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        records = load_records(self.source, needs=self.fields, **self.source_args)
        check_texts(records, self.texts, self.source, self.source_args)
        if self.max_records is not None:
            records = sorted(records, key=lambda r: split_of(str(r["key"]), 0.0, 0.0) + str(r["key"]))
            random.Random(self.seed).shuffle(records)
            records = records[: self.max_records]
        splits: dict[str, list[dict[str, Any]]] = {"train": [], "val": [], "test": []}
        for record in records:  # records of one group (e.g. one source file) stay in one split
            group = str(record.get("group", record["key"]))
            splits[split_of(group, self.val_fraction, self.test_fraction)].append(record)
        for name in ("val", "test"):  # a record a source repeats weights training; a score counts it once
            splits[name] = list({str(r["key"]): r for r in splits[name]}.values())
        if not splits["train"] or not splits["val"]:
            raise DataError(
                f"data.source={self.source}: {len(records)} records (data.max_records="
                f"{self.max_records}) leave the train or the validation split empty (data.val_fraction="
                f"{self.val_fraction}); add data or raise data.val_fraction"
            )
        if self.tokenizer is None:  # a tokenizer set before setup (from a checkpoint, by use_tokenizer) is kept
            texts = (t for r in splits["train"] for t in self.texts(r))
            self.tokenizer = load_or_train(self.tokenizer_path, texts, self.kind, self.vocab_size)
        elif self.specials == Specials.zoo() and (wrong := misplaced_specials(self.tokenizer)):
            raise DataError(
                f"the tokenizer set before setup does not have zoo's special tokens at ids 0..4 (found "
                f"{', '.join(wrong)}); hand it in with use_tokenizer(tokenizer, specials) instead"
            )
        self.tokenizer = self.prepare_tokenizer(self.tokenizer)
        self.added = added_around(self.tokenizer)
        self.datasets = {name: self.build_dataset(rs, name) for name, rs in splits.items() if rs}

    def use_tokenizer(self, tokenizer: Tokenizer, specials: Specials) -> None:
        """Use ``tokenizer`` (e.g. a Hugging Face model's, from ``read_hf_tokenizer``) instead of
        training or loading one; call before setup, which keeps it. A tokenizer without a pad token
        (GPT-2, Llama) pads with its eos: attention masks come from the sequences' lengths, so a pad
        that is also a real token is harmless. One without a token the task needs is a DataError."""
        if specials.pad is None:
            specials = replace(specials, pad=specials.eos)
        if specials.decoder_start is None:
            specials = replace(specials, decoder_start=specials.pad)
        for role in ("pad", *self.needs):
            if getattr(specials, role) is None:
                also = " nor an eos token to pad with" if role == "pad" else ""
                raise DataError(
                    f"{specials.origin}: the tokenizer has no {role} token{also}, which "
                    f"{type(self).__name__} needs; name one as {role}_token in the folder's "
                    f"tokenizer_config.json, or use a model whose tokenizer has one"
                )
        self.tokenizer, self.specials = tokenizer, specials

    def specials_record(self) -> dict[str, Any] | None:
        """What a checkpoint keeps so that a resumed run finds the special tokens again
        (``Specials.from_record``): None for zoo's own tokenizers, whose ids are fixed."""
        return None if self.specials == Specials.zoo() else self.specials.record()

    def prepare_tokenizer(self, tokenizer: Tokenizer) -> Tokenizer:
        return tokenizer

    def model_sizes(self) -> dict[str, int | None]:
        """ModelConfig fields the data decides. The vocabulary is the tokenizer's; a Hugging Face
        model's embedding may have more rows than that."""
        assert self.tokenizer is not None, "call setup() first"
        return {
            "vocab_size": self.tokenizer.get_vocab_size(),
            "pad_token_id": self.specials.pad,
            "eos_token_id": self.specials.eos,
        }

    def tokenizer_json(self) -> str:
        assert self.tokenizer is not None, "call setup() first"
        return self.tokenizer.to_str()

    def draw(self, batch: dict[str, Any], generator: torch.Generator) -> dict[str, Any]:
        """The random part of a training batch (MLM's masks), drawn in the main process from
        ``generator``, which the train loader seeds by the batch's place in the run."""
        return batch

    def train_dataloader(self) -> ResumableLoader:
        """This process's shard of a seeded order (the trainer configs set use_distributed_sampler=false:
        the data modules shard themselves, bucketing included); every process runs as many steps.
        With the trainer's overfit_batches every epoch repeats the first one (Lightning unshuffles
        only loaders with a RandomSampler)."""
        dataset = self.datasets["train"]
        lengths = getattr(dataset, "lengths", None)
        world, rank = world_rank()
        repeat = bool(self.trainer and self.trainer.overfit_batches)
        if lengths is None:
            batches: EpochBatchSampler = ShuffledBatchSampler(
                len(dataset), self.batch_size, seed=self.seed, world=world, rank=rank, repeat=repeat
            )
        else:
            batches = BucketBatchSampler(
                lengths, self.batch_size, shuffle=True, seed=self.seed, world=world, rank=rank, repeat=repeat
            )
        return ResumableLoader(
            dataset,
            batches,
            collate_fn=self.collate_for("train"),
            num_workers=self.num_workers,
            seed=self.seed,
            draw=self.draw,
        )

    def _eval_loader(self, split: str) -> DataLoader:
        """In order; in a distributed run each process evaluates its share. Its own generator: a
        DataLoader's iterator draws its workers' base seed from it, not from the global RNG that
        dropout uses (a validation would otherwise shift the training run's random stream)."""
        dataset = self.datasets[split]
        lengths = getattr(dataset, "lengths", None)
        world, rank = world_rank()
        if lengths is None:
            sampler = DistributedSampler(dataset, world, rank, shuffle=False) if world > 1 else None
            return DataLoader(
                dataset,
                batch_size=self.batch_size,
                sampler=sampler,
                num_workers=self.num_workers,
                collate_fn=self.collate_for(split),
                generator=torch.Generator().manual_seed(self.seed),
            )
        batches = BucketBatchSampler(lengths, self.batch_size, shuffle=False, seed=self.seed, world=world, rank=rank)
        return DataLoader(
            dataset,
            batch_sampler=batches,
            num_workers=self.num_workers,
            collate_fn=self.collate_for(split),
            generator=torch.Generator().manual_seed(self.seed),
        )

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test" if "test" in self.datasets else "val")

    def encode(self, text: str) -> list[int]:
        assert self.tokenizer is not None
        return self.tokenizer.encode(text).ids

    def encode_with_eos(self, text: str, max_len: int | None = None) -> list[int]:
        """``text``'s ids ending in one eos, at most ``max_len`` of them. The eos is appended unless
        the tokenizer's post-processor appends it already (a T5's does)."""
        ids, (_, after) = self.encode(text), self.added
        if after[-1:] == [self.specials.eos]:
            ids = ids[:-1]
        return ids[: None if max_len is None else max_len - 1] + [self.specials.eos]
