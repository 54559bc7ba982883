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

import itertools
import random
import typing
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any, ClassVar

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from tokenizers import Tokenizer
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler

from tasks.data.columns import Ragged, id_width
from tasks.data.loading import (
    BucketBatchSampler,
    EpochBatchSampler,
    ResumableLoader,
    ShuffledBatchSampler,
    ZooDataset,
    feeding,
    world_rank,
)
from tasks.data.prepared import (
    Corpus,
    Report,
    cache_root,
    cached_tokenizer,
    encode_fast,
    extent_words,
    prepared_tokens,
    split_records,
)
from tasks.data.settings import PreparedData, TextData
from tasks.data.sources import (
    check_source,
    check_texts,
    load_records,
    source_identity,
    source_windows,
    split_of,
    stream_records,
)
from tasks.data.token_files import SplitTokens
from tasks.data.tokenizers import Specials, added_around, load_or_train, misplaced_specials, train_tokenizer
from tasks.errors import DataError

ENCODE_BATCH = 1024  # texts encoded in one call of the tokenizer's thread pool (``encoded``)


class SplitRecords:
    """The records of one split of a streamed source, read from the source again on each iteration."""

    def __init__(self, records: Callable[[], Iterator[tuple[str, dict[str, Any]]]], split: str) -> None:
        self.records, self.split = records, split

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (record for split, record in self.records() if split == self.split)


class TextDataModule(L.LightningDataModule):
    """The tokenizer is zoo's own (trained, or loaded from data.tokenizer_path), or another handed in
    with ``use_tokenizer`` before setup; ``specials`` says where its special tokens are."""

    tokenizer_kind: ClassVar[str] = "bpe"
    fields: ClassVar[tuple[str, ...]] = ("text",)  # what every record must have (see texts, build_dataset)
    needs: ClassVar[tuple[str, ...]] = ()  # special tokens the task needs besides pad (see use_tokenizer)

    Settings: ClassVar[type[TextData]] = TextData  # what it takes (tasks/data/settings.py)

    def __init__(self, **settings: Any) -> None:
        super().__init__()
        # a key it does not take: TypeError naming it; a value no data module can use: ConfigError (check_settings)
        self.settings = given = self.Settings(**settings)
        self.source, self.source_args = given.source, dict(given.source_args or {})
        # before anything is read; a source read one record at a time is never held (``Source.streams``)
        self.streams = check_source(self.source, self.source_args, needs=self.fields).streams
        self.tokenizer_path = given.tokenizer_path
        self.kind = given.tokenizer_kind or self.tokenizer_kind
        self.vocab_size, self.seq_len, self.batch_size = given.vocab_size, given.seq_len, given.batch_size
        self.val_fraction, self.test_fraction = given.val_fraction, given.test_fraction
        self.max_records, self.num_workers, self.seed = given.max_records, given.num_workers, given.seed
        self.tokenizer_sample_mb = given.tokenizer_sample_mb
        self.tokenizer: Tokenizer | None = None
        self.specials = Specials.zoo()
        self.added: tuple[list[int], list[int]] = ([], [])  # ids the tokenizer puts before / after a text (setup)
        self.datasets: dict[str, ZooDataset] = {}

    # ---- what subclasses define -----------------------------------------------------------------
    def texts(self, record: dict[str, Any]) -> list[str]:
        """The texts of a record the tokenizer learns from."""
        return [record["text"]]

    def build_dataset(self, records: Iterable[dict[str, Any]], split: str) -> ZooDataset:
        """The examples of one split's ``records``, which may be read more than once (a list, or a
        :class:`SplitRecords` that reads a streamed source again on each pass), never indexed."""
        raise NotImplementedError

    def collate(self, batch: list[Any]) -> dict[str, Tensor]:
        raise NotImplementedError

    def task_info(self) -> dict[str, Any]:
        return {}

    def collate_for(self, split: str) -> Callable[[list[Any]], dict[str, Any]]:
        return self.collate

    # ---- shared ---------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        """The records split (a group, e.g. one source file, stays in one split), the tokenizer, each split's
        examples. A streamed source (a local file or folder, a hub dataset) is read again for each of these
        passes and never held: memory holds the examples, not the records; any other source, or a
        ``max_records`` choice, is read into a list once."""
        if self.datasets:
            return
        splits, counts, train_bytes = self.split_sources()
        self.check_splits(sum(counts.values()), counts["train"], counts["val"])
        # all of the training split's text up to tokenizer_sample_mb; beyond, a seeded sample of that much
        train = Corpus(lambda: (("train", r) for r in splits["train"]), self.texts, None, {}, size=train_bytes)
        sample = int(self.tokenizer_sample_mb * 2**20)
        self.set_tokenizer(lambda: train_tokenizer(train.sample(sample, self.seed), self.kind, self.vocab_size))
        self.datasets = {name: self.build_dataset(splits[name], name) for name in splits if counts[name]}

    def split_sources(self) -> tuple[dict[str, Iterable[dict[str, Any]]], Counter[str], int]:
        """Each split's records (re-readable), how many there are, and the training split's bytes of text."""
        if self.streams and self.max_records is None:
            source, args, needs = self.source, self.source_args, self.fields

            def records() -> Iterator[tuple[str, dict[str, Any]]]:
                return split_records(stream_records(source, needs=needs, texts=self.texts, **args), self.split_of)

            counts, train_bytes = Counter[str](), 0
            for split, record in records():  # a first pass checks every record
                counts[split] += 1
                train_bytes += self.text_bytes(record) if split == "train" else 0
            return {name: SplitRecords(records, name) for name in ("train", "val", "test")}, counts, train_bytes
        listed = self.chosen(load_records(self.source, needs=self.fields, **self.source_args))
        check_texts(listed, self.texts, self.source, self.source_args)
        splits: dict[str, list[dict[str, Any]]] = {"train": [], "val": [], "test": []}
        for split, record in split_records(listed, self.split_of):
            splits[split].append(record)
        train_bytes = sum(map(self.text_bytes, splits["train"]))
        return dict(splits), Counter({name: len(rs) for name, rs in splits.items()}), train_bytes

    def text_bytes(self, record: dict[str, Any]) -> int:
        """The bytes of the texts of ``record`` the tokenizer reads."""
        return sum(len(text.encode("utf-8")) for text in self.texts(record))

    def chosen(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``data.max_records`` of the records, a seeded choice (all of them when it is None)."""
        if self.max_records is None:
            return records
        records = sorted(records, key=lambda r: split_of(str(r["key"]), 0.0, 0.0) + str(r["key"]))
        random.Random(self.seed).shuffle(records)
        return records[: self.max_records]

    def set_tokenizer(self, train: Callable[[], Tokenizer]) -> None:
        """The tokenizer set before setup (from a checkpoint, by use_tokenizer), else the one at
        data.tokenizer_path, else ``train()``; then the task's post-processing."""
        if self.tokenizer is None:
            self.tokenizer = train() if self.tokenizer_path is None else load_or_train(self.tokenizer_path, (), "", 0)
        elif self.specials == Specials.zoo() and (wrong := misplaced_specials(self.tokenizer)):
            raise DataError(
                f"the tokenizer set before setup does not have zoo's special tokens at ids 0..4 (found "
                f"{', '.join(wrong)}); hand it in with use_tokenizer(tokenizer, specials) instead"
            )
        self.tokenizer = self.prepare_tokenizer(self.tokenizer)
        self.added = added_around(self.tokenizer)

    def split_of(self, group: str) -> str:
        """The split of the records of ``group``: a stable hash, the same on every machine and run."""
        return split_of(group, self.val_fraction, self.test_fraction)

    def check_splits(self, records: int, train: int, val: int) -> None:
        if not train or not val:
            raise DataError(
                f"data.source={self.source}: {records} records (data.max_records="
                f"{self.max_records}) leave the train or the validation split empty (data.val_fraction="
                f"{self.val_fraction}); add data or raise data.val_fraction"
            )

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
        lengths = dataset.lengths
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
            **self.feeding(),
        )

    def _eval_loader(self, split: str) -> DataLoader:
        """In order; in a distributed run each process evaluates its share. Its own generator: a
        DataLoader's iterator draws its workers' base seed from it, not from the global RNG that
        dropout uses (a validation would otherwise shift the training run's random stream)."""
        dataset = self.datasets[split]
        lengths = dataset.lengths
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
                **self.feeding(),
            )
        batches = BucketBatchSampler(lengths, self.batch_size, shuffle=False, seed=self.seed, world=world, rank=rank)
        return DataLoader(
            dataset,
            batch_sampler=batches,
            num_workers=self.num_workers,
            collate_fn=self.collate_for(split),
            generator=torch.Generator().manual_seed(self.seed),
            **self.feeding(),
        )

    def feeding(self) -> dict[str, bool]:
        """How the loaders hand batches to the trainer's device (``loading.feeding``): pinned for a GPU."""
        device = self.trainer.strategy.root_device.type if self.trainer is not None else "cpu"
        return feeding(device, self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test" if "test" in self.datasets else "val")

    def encode(self, text: str) -> list[int]:
        assert self.tokenizer is not None
        return self.tokenizer.encode(text).ids

    def encoded(self, texts: Iterable[str], *, ended: bool = False) -> Ragged:
        """The ids of ``texts`` (``encode``; ``ended``: ``encode_with_eos`` cut to seq_len), encoded in
        the tokenizer's thread pool a batch at a time and held compactly (tasks/data/columns.py)."""
        assert self.tokenizer is not None

        def batches() -> Iterator[list[list[int]]]:
            given = iter(texts)
            while chunk := list(itertools.islice(given, ENCODE_BATCH)):
                encodings = encode_fast(self.tokenizer, chunk)
                yield [self.ended(e.ids, self.seq_len) if ended else e.ids for e in encodings]

        return Ragged(batches(), id_width(self.tokenizer.get_vocab_size()))

    def encode_with_eos(self, text: str, max_len: int | None = None) -> list[int]:
        """``text``'s ids ending in one eos, at most ``max_len`` of them. The eos is appended unless
        the tokenizer's post-processor appends it already (a T5's does)."""
        return self.ended(self.encode(text), max_len)

    def ended(self, ids: list[int], max_len: int | None = None) -> list[int]:
        """``ids`` (a text's, with what the tokenizer's post-processor added) ending in one eos, at most
        ``max_len`` of them."""
        if self.added[1][-1:] == [self.specials.eos]:
            ids = ids[:-1]
        return ids[: None if max_len is None else max_len - 1] + [self.specials.eos]


class PreparedDataModule(TextDataModule):
    """A data module whose corpus is tokenized once into the cache (tasks/data/prepared.py) and read
    from a memory map: training memory does not grow with the corpus. The tokenizer is trained on a
    seeded sample of ``tokenizer_sample_mb`` MB and kept in the cache too. Subclasses say how texts
    become ids (``encode_documents``) and how a prepared split becomes a dataset (``prepared_dataset``)."""

    Settings: ClassVar[type[TextData]] = PreparedData

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.cache_dir = typing.cast(PreparedData, self.settings).cache_dir

    def encode_documents(self, texts: list[str]) -> tuple[list[int], list[int]]:
        """The ids of ``texts`` one after the other, and the length of each text's."""
        raise NotImplementedError

    def prepared_dataset(self, split: SplitTokens, name: str) -> ZooDataset:
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        corpus, root = self.corpus(), cache_root(self.cache_dir)
        # the rank is known from the launcher's environment before any process group starts
        report = Report(corpus, root, speaks=rank_zero_only.rank == 0)
        recipe = {"kind": self.kind, "vocab_size": self.vocab_size}

        def train(texts: Iterator[str]) -> Tokenizer:
            return train_tokenizer(texts, self.kind, self.vocab_size)

        sample_mb = self.tokenizer_sample_mb
        self.set_tokenizer(lambda: cached_tokenizer(corpus, train, recipe, sample_mb, self.seed, root, report))
        settings = {"module": type(self).__name__, "eos": self.specials.eos, "seq_len": self.seq_len}
        splits = prepared_tokens(corpus, self.encode_documents, self.tokenizer, settings, root, report)
        documents = sum(split.documents for split in splits.values())
        self.check_splits(documents, splits["train"].documents, splits["val"].documents)
        self.datasets = {name: self.prepared_dataset(split, name) for name, split in splits.items() if split.documents}

    def corpus(self) -> Corpus:
        """The source's records as the prepared path reads them: streamed from a local corpus, in bounded
        memory and known by its files; any other source (or a ``max_records`` choice) read as a list."""
        settings = {
            "module": type(self).__name__,
            "source": self.source,
            "source_args": self.source_args,
            "fractions": [self.val_fraction, self.test_fraction],
            "max_records": self.max_records,
            "seed": self.seed if self.max_records is not None else None,
        }
        name = str(self.source_args.get("path") or self.source_args.get("name") or self.source)
        if self.streams and self.max_records is None:
            known, files = source_identity(self.source, self.source_args)
            count, size = files or (None, None)
            source, args, needs = self.source, self.source_args, self.fields
            return Corpus(
                lambda: split_records(stream_records(source, needs=needs, texts=self.texts, **args), self.split_of),
                self.texts,
                known,
                settings,
                size=size,
                train_share=max(1.0 - self.val_fraction - self.test_fraction, 0.0),
                windows=source_windows(source, args),
                name=name,
                extent=extent_words(count, "files", size),
            )
        records = self.chosen(load_records(self.source, needs=self.fields, **self.source_args))
        check_texts(records, self.texts, self.source, self.source_args)
        size = sum(len(text.encode("utf-8")) for record in records for text in self.texts(record))
        return Corpus(
            lambda: split_records(records, self.split_of),
            self.texts,
            None,
            settings,
            name=name,
            extent=extent_words(len(records), "records", size),
        )
