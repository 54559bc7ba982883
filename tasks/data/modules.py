"""LightningDataModules for the four tasks. Each loads records from a source, splits them
deterministically by a hash of their key, trains (or loads) a tokenizer on the training split, and
says which sizes the model must take from the data (``model_sizes``) and what the task must know
(``task_info``, e.g. the label names).

Batches are dicts of tensors. Language modelling packs documents into full blocks; the others pad
each batch only to its longest sequence and group sequences of similar length (bucketing).

Training resumes exactly: the order of a training epoch is a pure function of (seed, epoch), the
train loader (``ResumableLoader``) tells Lightning how many batches of which epoch it handed out
and skips them after a resume, and per-batch randomness (MLM's masks) is drawn from a generator
seeded by (seed, epoch, rank, batch position), never from the global RNG.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, ClassVar

import lightning as L
import torch
from tokenizers import Tokenizer
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from tasks.data.sources import load_records, split_of
from tasks.data.tokenizers import EOS, MASK, PAD, SPECIALS, load_or_train, with_cls_sep
from tasks.errors import DataError

IGNORE = -100  # label of positions that carry no loss


class TextDataModule(L.LightningDataModule):
    tokenizer_kind: ClassVar[str] = "bpe"
    fields: ClassVar[tuple[str, ...]] = ("text",)  # what every record must have (see texts, build_dataset)

    def __init__(self, *, source: str, source_args: dict[str, Any] | None = None, tokenizer_path: str | None = None,
                 tokenizer_kind: str | None = None, vocab_size: int = 4096, seq_len: int = 128, batch_size: int = 32,
                 val_fraction: float = 0.05, test_fraction: float = 0.05, max_records: int | None = None,
                 num_workers: int = 0, seed: int = 0) -> None:
        super().__init__()
        self.source, self.source_args = source, dict(source_args or {})
        self.tokenizer_path = tokenizer_path
        self.kind = tokenizer_kind or self.tokenizer_kind
        self.vocab_size, self.seq_len, self.batch_size = vocab_size, seq_len, batch_size
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.max_records, self.num_workers, self.seed = max_records, num_workers, seed
        self.tokenizer: Tokenizer | None = None
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
            raise DataError(f"data.source={self.source}: {len(records)} records (data.max_records="
                            f"{self.max_records}) leave the train or the validation split empty (data.val_fraction="
                            f"{self.val_fraction}); add data or raise data.val_fraction")
        if self.tokenizer is None:  # a tokenizer set before setup (from a checkpoint) is kept
            texts = (t for r in splits["train"] for t in self.texts(r))
            self.tokenizer = load_or_train(self.tokenizer_path, texts, self.kind, self.vocab_size)
        self.tokenizer = self.prepare_tokenizer(self.tokenizer)
        self.datasets = {name: self.build_dataset(rs, name) for name, rs in splits.items() if rs}

    def prepare_tokenizer(self, tokenizer: Tokenizer) -> Tokenizer:
        return tokenizer

    def model_sizes(self) -> dict[str, int]:
        """ModelConfig fields the data decides."""
        assert self.tokenizer is not None, "call setup() first"
        return {"vocab_size": self.tokenizer.get_vocab_size(), "pad_token_id": PAD, "eos_token_id": EOS}

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
        world, rank = _world()
        repeat = bool(self.trainer and self.trainer.overfit_batches)
        if lengths is None:
            batches: EpochBatchSampler = ShuffledBatchSampler(len(dataset), self.batch_size, seed=self.seed,
                                                              world=world, rank=rank, repeat=repeat)
        else:
            batches = BucketBatchSampler(lengths, self.batch_size, shuffle=True, seed=self.seed, world=world,
                                         rank=rank, repeat=repeat)
        return ResumableLoader(dataset, batches, collate_fn=self.collate_for("train"), num_workers=self.num_workers,
                               seed=self.seed, draw=self.draw)

    def _eval_loader(self, split: str) -> DataLoader:
        """In order; in a distributed run each process evaluates its share. Its own generator: a
        DataLoader's iterator draws its workers' base seed from it, not from the global RNG that
        dropout uses (a validation would otherwise shift the training run's random stream)."""
        dataset = self.datasets[split]
        lengths = getattr(dataset, "lengths", None)
        world, rank = _world()
        if lengths is None:
            sampler = DistributedSampler(dataset, world, rank, shuffle=False) if world > 1 else None
            return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers,
                              collate_fn=self.collate_for(split), generator=torch.Generator().manual_seed(self.seed))
        batches = BucketBatchSampler(lengths, self.batch_size, shuffle=False, seed=self.seed, world=world, rank=rank)
        return DataLoader(dataset, batch_sampler=batches, num_workers=self.num_workers,
                          collate_fn=self.collate_for(split), generator=torch.Generator().manual_seed(self.seed))

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test" if "test" in self.datasets else "val")

    def encode(self, text: str) -> list[int]:
        assert self.tokenizer is not None
        return self.tokenizer.encode(text).ids


class ListDataset(Dataset):
    def __init__(self, items: Sequence[Any], lengths: Sequence[int] | None = None) -> None:
        self.items, self.lengths = items, lengths

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


def _world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


def _mix(*numbers: int) -> int:
    """A 63-bit seed from integers; different tuples give unrelated seeds."""
    digest = hashlib.blake2b(repr(numbers).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class EpochBatchSampler(Sampler[list[int]]):
    """Batches of indices for process ``rank`` of ``world``, in an order that is a pure function
    of (seed, epoch). Subclasses say how an epoch is batched (``epoch_batches``).

    Each iteration is one epoch: the one ``set_epoch`` named (Lightning calls it before every
    epoch), else the one after the previous iteration's; with ``repeat`` always epoch 0 (the same
    batches every time). ``resume(epoch, start)`` makes the next iteration, if it is of that
    epoch, begin at its batch ``start``: the batches before it are dropped as lists of indices, so
    no data is read for them. ``len()`` stays the whole epoch's (Lightning counts on it).
    """

    def __init__(self, *, seed: int, world: int, rank: int, repeat: bool = False) -> None:
        self.seed, self.world, self.rank, self.repeat = seed, world, rank, repeat
        self.epoch = 0  # of the next iteration
        self._resume: tuple[int, int] | None = None

    @property
    def sampler(self) -> EpochBatchSampler:
        """This object: where Lightning looks for ``set_epoch`` (``batch_sampler.sampler``)."""
        return self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume(self, epoch: int, start: int) -> None:
        self._resume = (epoch, start)

    def upcoming(self) -> tuple[int, int]:
        """(epoch, first batch) of the next iteration."""
        epoch, resume = 0 if self.repeat else self.epoch, self._resume
        return epoch, resume[1] if resume is not None and resume[0] == epoch else 0

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This process's batches of ``epoch``, in order (the hook each sampler defines)."""
        raise NotImplementedError(f"{type(self).__name__} must define epoch_batches")

    def rng(self, epoch: int) -> random.Random:
        """The random source of one epoch's order."""
        return random.Random(_mix(self.seed, epoch))

    def shard(self, n: int, rng: random.Random | None) -> list[int]:
        """This process's indices of ``range(n)``: every world-th of the order ``rng`` shuffles
        (kept in order without one). A shuffled order first drops the remainder, so that every
        process gets as many."""
        order = list(range(n))
        if rng is not None:
            rng.shuffle(order)
            order = order[: n // self.world * self.world]
        return order[self.rank :: self.world]

    def __iter__(self) -> Iterator[list[int]]:
        # a generator: the epoch is taken at the first batch (a DataLoader with workers calls iter() twice)
        epoch, start = self.upcoming()
        self.epoch, self._resume = epoch + 1, None
        yield from self.epoch_batches(epoch)[start:]


class ShuffledBatchSampler(EpochBatchSampler):
    """Full batches of ``batch_size`` in a seeded random order; the last incomplete one is dropped."""

    def __init__(self, n: int, batch_size: int, *, seed: int = 0, world: int = 1, rank: int = 0,
                 repeat: bool = False) -> None:
        super().__init__(seed=seed, world=world, rank=rank, repeat=repeat)
        self.n, self.batch_size = n, batch_size

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        order = self.shard(self.n, self.rng(epoch))
        return [order[i : i + self.batch_size] for i in range(0, len(order) - self.batch_size + 1, self.batch_size)]

    def __len__(self) -> int:
        return self.n // self.world // self.batch_size


class BucketBatchSampler(EpochBatchSampler):
    """Batches of similar length: sort within windows of 50 batches, then shuffle the batches.
    Without shuffling (evaluation) batches follow the sorted order. Padding per batch shrinks.

    In a distributed run process ``rank`` of ``world`` takes every world-th example of the same
    (seeded) order, then batches its share; training first drops the remainder so that every
    process runs the same number of steps."""

    def __init__(self, lengths: Sequence[int], batch_size: int, *, shuffle: bool, seed: int = 0,
                 window: int = 50, world: int = 1, rank: int = 0, repeat: bool = False) -> None:
        super().__init__(seed=seed, world=world, rank=rank, repeat=repeat)
        self.lengths, self.batch_size, self.shuffle, self.window = lengths, batch_size, shuffle, window

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        rng = self.rng(epoch)
        order = self.shard(len(self.lengths), rng if self.shuffle else None)
        span = self.batch_size * self.window if self.shuffle else len(order)
        batches = []
        for start in range(0, len(order), span):
            chunk = sorted(order[start : start + span], key=lambda i: self.lengths[i])
            batches += [chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def __len__(self) -> int:
        n = len(self.shard(len(self.lengths), random.Random(0) if self.shuffle else None))
        span = self.batch_size * self.window if self.shuffle else max(n, 1)
        return sum(-(-min(span, n - start) // self.batch_size) for start in range(0, n, span))


class ResumableLoader(DataLoader):
    """The train loader: batches from an EpochBatchSampler, and a state Lightning keeps in
    checkpoints (``state_dict``: the epoch and how many of its batches were handed out, counted
    here in the main process, so worker prefetching does not count) and gives back on resume
    (``load_state_dict``: the epoch continues after those batches, which are not read).

    Each batch passes through ``draw(batch, generator)`` with a generator seeded by (seed, epoch,
    rank, batch position): its random part is the same in a resumed run. The loader has its own
    torch generator (reseeded per epoch) so that starting an epoch leaves the global RNG alone.
    An epoch starts at its first batch, after Lightning's ``set_epoch``.
    """

    def __init__(self, dataset: Dataset, batch_sampler: EpochBatchSampler, *,
                 collate_fn: Callable[[list[Any]], Any], num_workers: int = 0, seed: int = 0,
                 draw: Callable[[Any, torch.Generator], Any] | None = None) -> None:
        super().__init__(dataset, batch_sampler=batch_sampler, collate_fn=collate_fn, num_workers=num_workers,
                         generator=torch.Generator())
        self.seed, self.draw = seed, draw
        self.epoch, self.batches = batch_sampler.epoch, 0  # the epoch being read; its batches handed out

    def __iter__(self) -> Iterator[Any]:  # a generator: the epoch starts at the first next()
        sampler: EpochBatchSampler = self.batch_sampler
        self.epoch, self.batches = sampler.upcoming()
        self.generator.manual_seed(_mix(self.seed, self.epoch, sampler.rank))  # the workers' seeds
        for batch in super().__iter__():
            if self.draw is not None:
                generator = torch.Generator().manual_seed(_mix(self.seed, self.epoch, sampler.rank, self.batches))
                batch = self.draw(batch, generator)
            self.batches += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches": self.batches}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batches = int(state["epoch"]), int(state["batches"])
        self.batch_sampler.set_epoch(self.epoch)
        self.batch_sampler.resume(self.epoch, self.batches)


def pad_batch(seqs: Sequence[Sequence[int]], value: int = PAD) -> Tensor:
    """Right-pad to the longest sequence: (B, T_max)."""
    out = torch.full((len(seqs), max(len(s) for s in seqs)), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


# ---- language modelling (decoder) ---------------------------------------------------------------
class LMDataModule(TextDataModule):
    """Causal LM: documents joined with </s> and cut into blocks of seq_len + 1 tokens."""

    tokenizer_kind = "bpe"

    def build_dataset(self, records: list[dict[str, Any]], split: str) -> Dataset:
        ids: list[int] = []
        for record in records:
            ids += self.encode(record["text"]) + [EOS]
        block = self.seq_len + 1
        n = len(ids) // block
        if n == 0:
            raise DataError(f"data.seq_len={self.seq_len}: the {split} split has {len(ids)} tokens, fewer than one "
                            f"block of {block}; lower data.seq_len, add data, or raise data.val_fraction / "
                            f"data.test_fraction")
        return ListDataset(torch.tensor(ids[: n * block]).view(n, block))

    def collate(self, batch: list[Tensor]) -> dict[str, Tensor]:
        blocks = torch.stack(batch)  # (B, T+1)
        return {"input_ids": blocks[:, :-1], "labels": blocks[:, 1:]}


# ---- sequence classification (encoder) ---------------------------------------------------------
class ClassificationDataModule(TextDataModule):
    """Text -> label. Labels are the sorted distinct values of the records' ``label`` field."""

    tokenizer_kind = "wordpiece"
    fields = ("text", "label")

    def prepare_tokenizer(self, tokenizer: Tokenizer) -> Tokenizer:
        tokenizer = with_cls_sep(tokenizer)
        tokenizer.enable_truncation(self.seq_len)
        return tokenizer

    def build_dataset(self, records: list[dict[str, Any]], split: str) -> Dataset:
        if split == "train":
            self.label_names = sorted({str(r["label"]) for r in records})
        index = {name: i for i, name in enumerate(self.label_names)}
        items = [(self.encode(r["text"]), index[str(r["label"])]) for r in records if str(r["label"]) in index]
        return ListDataset(items, [len(ids) for ids, _ in items])

    def collate(self, batch: list[tuple[list[int], int]]) -> dict[str, Tensor]:
        input_ids = pad_batch([ids for ids, _ in batch])
        return {"input_ids": input_ids, "attention_mask": (input_ids != PAD).long(),
                "labels": torch.tensor([label for _, label in batch])}

    def task_info(self) -> dict[str, Any]:
        return {"label_names": list(self.label_names)}


# ---- masked language modelling (encoder) -------------------------------------------------------
class MLMDataModule(TextDataModule):
    """BERT pretraining: 15% of tokens are chosen; 80% of those become <mask>, 10% a random token,
    10% stay; the loss is on the chosen ones only (Devlin et al. 2019)."""

    tokenizer_kind = "wordpiece"

    def __init__(self, *, mask_prob: float = 0.15, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mask_prob = mask_prob

    def prepare_tokenizer(self, tokenizer: Tokenizer) -> Tokenizer:
        tokenizer = with_cls_sep(tokenizer)
        tokenizer.enable_truncation(self.seq_len)
        return tokenizer

    def build_dataset(self, records: list[dict[str, Any]], split: str) -> Dataset:
        items = [ids for r in records if len(ids := self.encode(r["text"])) > 3]
        return ListDataset(items, [len(ids) for ids in items])

    def collate(self, batch: list[list[int]], *, fixed: bool = False) -> dict[str, Tensor]:
        """``fixed``: the same masks for the same batch every time (comparable validation numbers);
        else masks from the global RNG."""
        input_ids = pad_batch(batch)
        return self.mask(input_ids, torch.Generator().manual_seed(int(input_ids.sum())) if fixed else None)

    def mask(self, input_ids: Tensor, generator: torch.Generator | None) -> dict[str, Tensor]:
        labels = input_ids.clone()
        special = input_ids < len(SPECIALS)
        chosen = (torch.rand(input_ids.shape, generator=generator) < self.mask_prob) & ~special
        labels[~chosen] = IGNORE
        action = torch.rand(input_ids.shape, generator=generator)
        masked = input_ids.masked_fill(chosen & (action < 0.8), MASK)
        random_tokens = torch.randint(len(SPECIALS), self.tokenizer.get_vocab_size(), input_ids.shape,
                                      generator=generator)
        swap = chosen & (action >= 0.8) & (action < 0.9)
        masked = torch.where(swap, random_tokens, masked)
        return {"input_ids": masked, "attention_mask": (input_ids != PAD).long(), "labels": labels}

    def pad(self, batch: list[list[int]]) -> dict[str, Tensor]:
        return {"input_ids": pad_batch(batch)}

    def draw(self, batch: dict[str, Any], generator: torch.Generator) -> dict[str, Any]:
        return self.mask(batch["input_ids"], generator)

    def collate_for(self, split: str) -> Callable[[list[Any]], dict[str, Any]]:
        """Training batches are only padded here; ``draw`` masks them (seeded by their place in the run)."""
        return self.pad if split == "train" else partial(self.collate, fixed=True)


# ---- translation (encoder-decoder) -------------------------------------------------------------
class TranslationDataModule(TextDataModule):
    """Source -> target pairs with one tokenizer for both sides. The decoder input is the target
    shifted right behind the start token (<pad>, as in T5); the labels end with </s>."""

    tokenizer_kind = "unigram"
    fields = ("source", "target")

    def texts(self, record: dict[str, Any]) -> list[str]:
        return [record["source"], record["target"]]

    def build_dataset(self, records: list[dict[str, Any]], split: str) -> Dataset:
        items = [(self.encode(r["source"])[: self.seq_len - 1] + [EOS], self.encode(r["target"])[: self.seq_len - 1]
                  + [EOS], r["target"]) for r in records]
        return ListDataset(items, [len(s) + len(t) for s, t, _ in items])

    def collate(self, batch: list[tuple[list[int], list[int], str]]) -> dict[str, Any]:
        src = pad_batch([s for s, _, _ in batch])
        labels = pad_batch([t for _, t, _ in batch], IGNORE)
        decoder_input_ids = pad_batch([[PAD] + t[:-1] for _, t, _ in batch])
        return {"input_ids": src, "attention_mask": (src != PAD).long(), "decoder_input_ids": decoder_input_ids,
                "labels": labels, "references": [ref for _, _, ref in batch]}
