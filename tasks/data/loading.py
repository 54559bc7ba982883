"""Batches in an order that survives a restart: the order of a training epoch is a pure function of
(seed, epoch, rank), and the train loader (``ResumableLoader``) tells Lightning how many batches of which
epoch it handed out, skips them after a resume, and seeds each batch's random part by its position."""

from __future__ import annotations

import hashlib
import random
from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch.utils.data import DataLoader, Dataset, Sampler


class ZooDataset(Dataset):
    """A split's examples as a data module builds them. ``lengths``: each example's length, which
    the loaders bucket by; None: the examples are alike (full blocks) and batches are plain shuffles."""

    lengths: Sequence[int] | None = None


class ListDataset(ZooDataset):
    def __init__(self, items: Sequence[Any], lengths: Sequence[int] | None = None) -> None:
        self.items, self.lengths = items, lengths

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


def world_rank() -> tuple[int, int]:
    """(world size, this process's rank): (1, 0) outside a distributed run."""
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

    def epoch_batches(self, epoch: int) -> Sequence[list[int]]:
        """This process's batches of ``epoch``, in order (the hook each sampler defines)."""
        raise NotImplementedError(f"{type(self).__name__} must define epoch_batches")

    def rng(self, epoch: int) -> random.Random:
        """The random source of one epoch's order."""
        return random.Random(_mix(self.seed, epoch))

    def shard(self, n: int, rng: random.Random | None) -> Sequence[int]:
        """This process's indices of ``range(n)``: every world-th of the order ``rng`` shuffles
        (kept in order without one). A shuffled order first drops the remainder, so that every
        process gets as many. Held as a machine-integer array (4 bytes an index below 2**31): the
        order of a corpus of millions of blocks costs megabytes, not a list of Python ints; its
        shuffle makes the same draws as shuffling a list, so the order is the same."""
        order = array("i" if n < 2**31 else "q", range(n))
        if rng is not None:
            rng.shuffle(order)
            del order[n // self.world * self.world :]
        return order[self.rank :: self.world]

    def __iter__(self) -> Iterator[list[int]]:
        # a generator: the epoch is taken at the first batch (a DataLoader with workers calls iter() twice)
        epoch, start = self.upcoming()
        self.epoch, self._resume = epoch + 1, None
        batches = self.epoch_batches(epoch)
        for i in range(start, len(batches)):
            yield batches[i]


class ShuffledBatchSampler(EpochBatchSampler):
    """Full batches of ``batch_size`` in a seeded random order; the last incomplete one is dropped."""

    def __init__(
        self, n: int, batch_size: int, *, seed: int = 0, world: int = 1, rank: int = 0, repeat: bool = False
    ) -> None:
        super().__init__(seed=seed, world=world, rank=rank, repeat=repeat)
        self.n, self.batch_size = n, batch_size

    def epoch_batches(self, epoch: int) -> Sequence[list[int]]:
        return Batched(self.shard(self.n, self.rng(epoch)), self.batch_size)

    def __len__(self) -> int:
        return self.n // self.world // self.batch_size


class Batched(Sequence[list[int]]):
    """The full batches of ``size`` consecutive indices of ``order``, each made when it is asked for."""

    def __init__(self, order: Sequence[int], size: int) -> None:
        self.order, self.size = order, size

    def __len__(self) -> int:
        return len(self.order) // self.size

    @overload
    def __getitem__(self, i: int) -> list[int]: ...
    @overload
    def __getitem__(self, i: slice) -> list[list[int]]: ...
    def __getitem__(self, i: int | slice) -> list[int] | list[list[int]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"batch {i} of {len(self)}")
        start = i % len(self) * self.size
        return list(self.order[start : start + self.size])


class BucketBatchSampler(EpochBatchSampler):
    """Batches of similar length: sort within windows of 50 batches, then shuffle the batches.
    Without shuffling (evaluation) batches follow the sorted order. Padding per batch shrinks.

    In a distributed run process ``rank`` of ``world`` takes every world-th example of the same
    (seeded) order, then batches its share; training first drops the remainder so that every
    process runs the same number of steps."""

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        *,
        shuffle: bool,
        seed: int = 0,
        window: int = 50,
        world: int = 1,
        rank: int = 0,
        repeat: bool = False,
    ) -> None:
        super().__init__(seed=seed, world=world, rank=rank, repeat=repeat)
        self.lengths, self.batch_size, self.shuffle, self.window = lengths, batch_size, shuffle, window

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        rng = self.rng(epoch)
        order = list(self.shard(len(self.lengths), rng if self.shuffle else None))
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


def feeding(device_type: str, num_workers: int) -> dict[str, bool]:
    """The DataLoader options that feed a device: batches in page-locked (pinned) memory where it is a
    GPU, which Lightning's non-blocking copy (``batch_to_device``) sends while the GPU still computes
    the step before, and workers that live as long as the loader instead of starting again each epoch
    (and each validation) where there are any."""
    return {"pin_memory": device_type == "cuda", "persistent_workers": num_workers > 0}


def pinned(batch: Any) -> Any:
    """``batch``'s tensors (in dicts, lists and tuples) in page-locked memory: a pageable tensor's copy to
    a GPU first waits for every step queued before it (CUDA syncs the stream), a pinned one's does not."""
    return apply_to_collection(batch, torch.Tensor, torch.Tensor.pin_memory)


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

    def __init__(
        self,
        dataset: Dataset,
        batch_sampler: EpochBatchSampler,
        *,
        collate_fn: Callable[[list[Any]], Any],
        num_workers: int = 0,
        seed: int = 0,
        draw: Callable[[Any, torch.Generator], Any] | None = None,
        **feeding: bool,
    ) -> None:
        super().__init__(
            dataset,
            batch_sampler=batch_sampler,
            collate_fn=collate_fn,
            num_workers=num_workers,
            generator=torch.Generator(),
            **feeding,
        )
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
                if self.pin_memory and torch.cuda.is_available():  # the drawn tensors are new: pin them as the
                    batch = pinned(batch)  # loader pinned its own, or their copy to the GPU waits for the step
            self.batches += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches": self.batches}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batches = int(state["epoch"]), int(state["batches"])
        self.batch_sampler.set_epoch(self.epoch)
        self.batch_sampler.resume(self.epoch, self.batches)
