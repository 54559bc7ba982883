"""A corpus tokenized once into flat files of ids: training memory does not grow with the corpus.

The first run on a corpus (``LMDataModule``) streams its records, splits them by a hash of their
group as every data module does (``split_records``), and writes each split's token ids as one flat
file (``uint16`` when the vocabulary fits, else ``uint32``) with the end offset of every document
(``int64``), into a cache folder (``cache_root``: ``data.cache_dir``, else ``$ZOO_CACHE``, else
``~/.cache/zoo``) named by a hash of what decides the ids: the sources' identity (a local corpus: each
file's path, size and modification time; any other source: its records' text), the split settings
and the tokenizer. A changed file or tokenizer is a new name, never a stale map. The folder is
written whole (``zoo.folders.atomic_folder``) under a lock: a second process preparing the same corpus
waits and reuses it, and what a killed preparation left is removed by the next one.

The tokenizer is trained on a seeded sample of the training split (``tokenizer_sample_mb``) and kept
in the same cache, so a second run on a corpus reads neither the corpus nor the sample. Encoding runs
in ``tokenizers``' own thread pool (``encode_batch``: every core, without copying the text to other
processes).

A preparation says so in one line (``Report``: the corpus, the cache, its files and MB), then shows a bar
of the text it tokenizes in MB/s; a run that finds it all in the cache says that in one line (the
folder, its tokens, when it was prepared). Only rank 0 of a distributed run speaks.

Training reads blocks of a split's file (``TokenBlocks``): batch by batch, the same blocks in the same
order as the tensor of the whole split that earlier versions built in memory, each read with
``os.pread`` (``IdReader``), so that the process holds its batches and no page of the corpus.

Before a run uses a prepared corpus (found or just written) it is checked (``read_prepared``): meta.json
names every split with counts, the files have the sizes those counts give, the document ends rise to
the token count, every id is below the tokenizer's vocabulary and the bytes have the CRC-32 recorded as
they were written (``SplitTokens.check``: one pass at reading speed). A cache an older zoo wrote has no
CRC-32 and gets the other checks. What fails is one line naming the folder: delete it to prepare anew.
A disk that fills while a corpus is prepared is one line naming the cache, its half-written folder gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeRemainingColumn
from rich.text import Text
from tokenizers import Tokenizer

from tasks.data.token_files import SplitTokens, crc32_of, damaged
from tasks.errors import NO_SPACE, DataError
from zoo.folders import atomic_folder
from zoo.io import atomic_write_text

CACHE_ENV = "ZOO_CACHE"
VERSION = 1  # of the layout below: a new one is a new cache name
SPLITS = ("train", "val", "test")
Encoder = Callable[[list[str]], tuple[np.ndarray, np.ndarray]]
"""Texts -> their ids one after the other, and the length of each text's (a data module's
``encode_documents``; ``joined`` makes them)."""
CHUNK_CHARS = 4 << 20  # the text encoded in one encode_batch call (about 4 MB)


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where prepared corpora and their tokenizers are kept: ``cache_dir`` (data.cache_dir), else
    ``$ZOO_CACHE``, else ``$XDG_CACHE_HOME/zoo`` (``~/.cache/zoo``)."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zoo"


def digest(*parts: Any) -> str:
    """A short stable name for ``parts`` (JSON-able values)."""
    text = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=12).hexdigest()


def unit(seed: int, key: str) -> float:
    """A number in [0, 1) that is a pure function of (seed, key)."""
    value = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(value, "little") / 2**64


def extent_words(count: int | None, unit: str, size: int | None) -> str:
    """What a preparation says of its corpus' size (``3 files, 1.2 MB``): the parts that are known."""
    parts = [] if count is None else [f"{count:,} {unit}"]
    if size is not None:
        parts.append(f"{megabytes(size)} MB")
    return ", ".join(parts)


def megabytes(size: float) -> str:
    """``size`` bytes in MB (10^6 bytes), with the digits that say something at any size."""
    return f"{size / 1e6:,.1f}" if size >= 1e5 else f"{size / 1e6:.3f}"


def split_records(
    records: Iterable[dict[str, Any]], split_of: Callable[[str], str]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(split, record) for each record, the split of its group (``split_of(group)``; the group is the
    record's key unless it names one). A key that repeats in the validation or test split counts once
    there (a record a source repeats weights training; a score counts it once)."""
    seen: dict[str, set[str]] = {"val": set(), "test": set()}
    for record in records:
        split = split_of(str(record.get("group", record["key"])))
        if split in seen:
            key = str(record["key"])
            if key in seen[split]:
                continue
            seen[split].add(key)
        yield split, record


# ---- the corpus ----------------------------------------------------------------------------------------
@dataclass
class Corpus:
    """The split records of a data module's source, read again on each call of ``records`` (streamed
    where the source can be), and what identifies them (``identity``)."""

    records_of: Callable[[], Iterator[tuple[str, dict[str, Any]]]]
    texts: Callable[[dict[str, Any]], list[str]]
    known: Any  # the sources' identity without reading them, or None: hashed from their records
    settings: dict[str, Any]  # what else decides the splits (fractions, max_records, seed, module)
    size: int | None = None  # bytes of text, where known without reading (a local corpus' files)
    train_share: float = 1.0  # the part of ``size`` the training split holds, about
    windows: Callable[[float, int], Iterator[str]] | None = None  # a seeded share of the files' text (see sample)
    name: str = "the corpus"  # as the user named it (a path, a dataset's or a source's name); see Report
    extent: str = ""  # its files (or records) and MB, where known (``extent_words``); see Report
    _identity: str | None = field(default=None, repr=False)

    def records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        return self.records_of()

    def identity(self) -> str:
        """A hash of the sources' identity and the split settings; where the sources' identity is not
        known without reading them, of their records' text (one pass over them)."""
        if self._identity is None:
            known = self.known
            if known is None:
                h = hashlib.blake2b(digest_size=16)
                for split, record in self.records():
                    h.update(json.dumps([split, self.texts(record)], ensure_ascii=False).encode("utf-8"))
                known = h.hexdigest()
            self._identity = digest(VERSION, known, self.settings)
        return self._identity

    def sample(self, sample_bytes: int, seed: int) -> Iterator[str]:
        """Texts for the tokenizer, in corpus order: every text of the training split when it holds at
        most ``sample_bytes``; else, where the source reads seeded windows of its files (``windows``:
        .txt files), windows of every split with the probability that takes about that much, without
        reading the rest (the tokenizer sees some held-out text, as GPT-2's saw all of WebText; the model
        never trains on it); else each record of the
        training split with that probability, by a hash of (seed, key). Never more than ``sample_bytes``
        in all (where the size is not known: the first ``sample_bytes`` of the training split)."""
        train = None if self.size is None else self.size * self.train_share
        share = 1.0 if train is None or train <= sample_bytes else sample_bytes / train
        capped, taken = self.size is None or share < 1.0, 0
        if share < 1.0 and self.windows is not None and self.size:
            texts: Iterator[str] = self.windows(sample_bytes / self.size, seed)
        else:
            texts = self._train_texts(share, seed)
        for text in texts:
            taken += len(text.encode("utf-8"))
            if capped and taken > sample_bytes:
                return
            yield text

    def _train_texts(self, share: float, seed: int) -> Iterator[str]:
        """The texts of the training split's records, each record with probability ``share``."""
        for split, record in self.records():
            if split != "train" or (share < 1.0 and unit(seed, str(record["key"])) >= share):
                continue
            for text in self.texts(record):
                if isinstance(text, str):  # else refused with its record's place when the corpus is tokenized
                    yield text


# ---- the tokenizer, trained once on a sample -----------------------------------------------------------
def cached_tokenizer(
    corpus: Corpus,
    train: Callable[[Iterator[str]], Tokenizer],
    recipe: dict[str, Any],
    sample_mb: float,
    seed: int,
    root: Path,
    report: Report | None = None,
) -> Tokenizer:
    """The tokenizer ``train`` makes from a sample of ``corpus`` (``Corpus.sample``: ``sample_mb`` MB,
    ``seed``), kept in ``root``/tokenizers with a record of its sample beside it; ``recipe``: what else
    decides it (kind, vocabulary size). Training it is where a preparation starts (``report``)."""
    name = digest(VERSION, corpus.identity(), recipe, sample_mb, seed)
    folder = writable(root / "tokenizers", root)
    path = folder / f"{name}.json"
    with locked(folder / f"{name}.lock"):
        if path.is_file():
            with contextlib.suppress(Exception):  # a damaged file is trained again
                return Tokenizer.from_file(str(path))
        if report is not None:
            report.preparing()
        sampled = _Counted(corpus.sample(int(sample_mb * 2**20), seed))
        tokenizer = train(iter(sampled))
        record = {"sample_mb": sample_mb, "seed": seed, "sampled_bytes": sampled.bytes, "recipe": recipe}
        with disk_full(root):
            atomic_write_text(folder / f"{name}.sample.json", json.dumps(record, indent=1) + "\n")
            atomic_write_text(path, tokenizer.to_str())
    return tokenizer


class _Counted:
    """The texts of ``texts``, counting their bytes as they pass."""

    def __init__(self, texts: Iterator[str]) -> None:
        self.texts, self.bytes = texts, 0

    def __iter__(self) -> Iterator[str]:
        for text in self.texts:
            self.bytes += len(text.encode("utf-8"))
            yield text


# ---- the token store (tasks/data/token_files.py reads it) ------------------------------------------------
def prepared_tokens(
    corpus: Corpus,
    encode: Encoder,
    tokenizer: Tokenizer,
    settings: dict[str, Any],
    root: Path,
    report: Report | None = None,
) -> dict[str, SplitTokens]:
    """Each split's token ids of ``corpus``, written once into ``root``/tokens/<name> (``encode``: texts
    -> ids as the data module builds its examples; ``settings``: what else decides them) and read from
    there on every later call, checked each time (``read_prepared``); ``report`` says which of the two
    it was."""
    name = digest(VERSION, corpus.identity(), tokenizer.to_str(), settings)
    folder = writable(root / "tokens", root) / name
    with locked(folder.parent / f"{name}.lock"):
        reused = folder.exists()  # written whole (atomic_folder): its meta.json, or it was changed since
        if not reused:
            if report is not None:
                report.preparing()
            width = "uint16" if id_bound(tokenizer) <= 2**16 else "uint32"
            with disk_full(root), atomic_folder(folder) as stage:
                _write_splits(corpus, encode, width, stage, shown=report is not None and report.speaks)
    splits = read_prepared(folder, id_bound(tokenizer))
    if reused and report is not None:
        report.reusing(folder, sum(split.tokens for split in splits.values()))
    return splits


def id_bound(tokenizer: Tokenizer) -> int:
    """One past the largest id ``tokenizer`` gives: its vocabulary's size, or more where its ids have gaps
    (an added token placed past the rest)."""
    return max(tokenizer.get_vocab_size(), max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1)


def _write_splits(corpus: Corpus, encode: Encoder, width: str, stage: Path, *, shown: bool = False) -> None:
    """Each split's ids and document ends into ``stage``. A chunk is encoded in a thread (the tokenizer
    lets go of the GIL while it works) while the next one is read: reading the records and encoding
    them overlap, and no more than two chunks are held. ``shown``: with a bar of the text tokenized."""
    counts = {split: [0, 0] for split in SPLITS}  # tokens, documents
    sums = {split: [0, 0] for split in SPLITS}  # CRC-32 of the ids' and the ends' bytes
    with contextlib.ExitStack() as files, _progress(corpus.size, shown) as advance, ThreadPoolExecutor(1) as pool:
        out = {s: [files.enter_context(open(stage / f"{s}.{kind}", "wb")) for kind in ("ids", "ends")] for s in SPLITS}

        def write(split: str, texts: list[str], job: Future[tuple[list[int], list[int]]]) -> None:
            ids, lengths = job.result()
            ends = counts[split][0] + np.cumsum(lengths, dtype=np.int64)
            for i, array in enumerate((np.asarray(ids).astype(width, copy=False), ends)):
                sums[split][i] = _append(out[split][i], array, sums[split][i])
            counts[split][0] += len(ids)
            counts[split][1] += len(lengths)
            advance(sum(len(t.encode("utf-8")) for t in texts))

        pending = None
        for split, texts in _chunks(corpus):
            job = pool.submit(encode, texts)
            if pending is not None:
                write(*pending)
            pending = (split, texts, job)
        if pending is not None:
            write(*pending)
    meta = {
        "version": VERSION,
        "prepared": datetime.now().astimezone().isoformat(timespec="seconds"),
        "dtype": width,
        "splits": {s: {"tokens": t, "documents": d, "crc32": sums[s]} for s, (t, d) in counts.items()},
    }
    (stage / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")


def _append(file: BinaryIO, array: np.ndarray, crc: int) -> int:
    """Write ``array``'s bytes at the end of ``file``; their CRC-32 continued from ``crc``. Through the
    file's own write, whose OSError carries the system's errno (numpy's ``tofile`` raises one without)."""
    data = memoryview(np.ascontiguousarray(array)).cast("B")
    file.write(data)
    return crc32_of(data, crc)


@contextlib.contextmanager
def disk_full(root: Path) -> Iterator[None]:
    """A disk that fills (or a quota reached) while the cache in ``root`` is written: one DataError naming
    the cache and the fix; what was half written is gone already (``atomic_folder``, ``atomic_write_text``)."""
    try:
        yield
    except OSError as error:
        if error.errno not in NO_SPACE:
            raise
        raise DataError(
            f"data.cache_dir={root}: cannot write the prepared corpus there ({error.strerror}; nothing "
            f"half-written was kept); free some space on that disk, or set data.cache_dir (or ${CACHE_ENV}) "
            f"to a folder on a disk with room"
        ) from None


def _chunks(corpus: Corpus) -> Iterator[tuple[str, list[str]]]:
    """(split, texts) in corpus order, each list of one split and about CHUNK_CHARS characters; a
    DataError at the first record whose text is not a string."""
    pending: dict[str, tuple[list[str], list[int]]] = {s: ([], [0]) for s in SPLITS}
    for n, (split, record) in enumerate(corpus.records()):
        texts, size = pending[split]
        for text in corpus.texts(record):
            if not isinstance(text, str):
                raise DataError(
                    f"record {n} (key {str(record.get('key'))[:80]!r}) has {str(text)[:40]!r} (of type "
                    f"{type(text).__name__}), not text; make every text a string or remove the record"
                )
            texts.append(text)
            size[0] += len(text)
        if size[0] >= CHUNK_CHARS:
            yield split, texts
            pending[split] = ([], [0])
    for split, (texts, _) in pending.items():
        if texts:
            yield split, texts


@contextlib.contextmanager
def _progress(total: int | None, shown: bool) -> Iterator[Callable[[int], None]]:
    """What advances a bar of the bytes of text tokenized, in MB/s with an ETA where ``total`` (the
    files' bytes) is known; none unless ``shown``. Rich's, as the training bar: live on a terminal,
    its last state printed once where the output is a file or a pipe. It ends at the bytes tokenized
    (a file's line breaks and columns are not text, a compressed file holds more)."""
    if not shown:
        yield lambda n: None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), _Rate(), TimeRemainingColumn()) as bar:
        task = bar.add_task("tokenizing", total=total)
        yield lambda n: bar.advance(task, n)
        bar.update(task, total=bar.tasks[task].completed)


class _Rate(ProgressColumn):
    """``12.3/45.6 MB 7.8 MB/s``: the bytes done (of the total where known) and their rate, in MB
    whatever the size (rich's own columns turn to kB, and show no rate for a short task)."""

    def render(self, task: Task) -> Text:
        total = "" if task.total is None else f"/{megabytes(task.total)}"
        rate = task.completed / task.elapsed if task.elapsed else 0.0
        return Text(f"{megabytes(task.completed)}{total} MB {megabytes(rate)} MB/s", style="progress.data.speed")


def read_prepared(folder: Path, vocab_size: int) -> dict[str, SplitTokens]:
    """Each split of the prepared corpus in ``folder``, checked before anything reads it: meta.json
    (``read_meta``), then each split's files against it and ``vocab_size`` (``SplitTokens.check``)."""
    splits = read_meta(folder)
    for split in splits.values():
        split.check(vocab_size)
    return splits


def read_meta(folder: Path) -> dict[str, SplitTokens]:
    """The splits meta.json names, once it is known to hold what zoo writes: JSON, an ids type zoo
    writes, and for every split (``SPLITS``) its token and document counts (whole numbers, not negative)
    and, where recorded, two CRC-32s; else a DataError naming the folder (``damaged``)."""
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise damaged(folder, f"meta.json cannot be read: {getattr(error, 'strerror', None) or error}") from None
    splits = meta.get("splits") if isinstance(meta, dict) else None
    if not isinstance(splits, dict):
        raise damaged(folder, "meta.json has no splits")
    dtype = meta.get("dtype")
    if dtype not in ("uint16", "uint32"):
        raise damaged(folder, f"meta.json's dtype is {dtype!r}, not uint16 or uint32")
    read = {}
    for name in SPLITS:
        split = splits.get(name)
        if not isinstance(split, dict):
            raise damaged(folder, f"meta.json has no {name} split")
        for count in ("tokens", "documents"):
            value = split.get(count)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise damaged(folder, f"meta.json's {name} split has {count} {value!r}, not a count")
        crc = split.get("crc32")
        if crc is not None and not (
            isinstance(crc, list) and len(crc) == 2 and all(type(c) is int and 0 <= c < 2**32 for c in crc)
        ):
            raise damaged(folder, f"meta.json's {name} split has crc32 {crc!r}, not two CRC-32s")
        files = folder / f"{name}.ids", folder / f"{name}.ends"
        sums = None if crc is None else (crc[0], crc[1])
        read[name] = SplitTokens(*files, dtype, split["tokens"], split["documents"], sums)
    return read


@dataclass
class Report:
    """What preparing a corpus prints, in the process that speaks (``speaks``: rank 0 of a run): one
    line when the work starts (``preparing``: the corpus, the cache, its files and MB), before the
    tokenizer is trained and the bar of the text tokenized; or one line when the cache holds it all
    (``reusing``: the folder, its tokens, when it was prepared)."""

    corpus: Corpus
    root: Path
    speaks: bool = True
    started: bool = False

    def preparing(self) -> None:
        if self.speaks and not self.started:
            told = f": {self.corpus.extent}" if self.corpus.extent else ""
            print(f"preparing {self.corpus.name} into {self.root}{told}", flush=True)
        self.started = True

    def reusing(self, folder: Path, tokens: int) -> None:
        if self.speaks and not self.started:
            print(f"reusing {folder}: {tokens:,} tokens, prepared {prepared_on(folder)}", flush=True)


def prepared_on(folder: Path) -> str:
    """When the prepared corpus in ``folder`` was written (its meta, else the meta file's time), to the minute."""
    meta = folder / "meta.json"
    written = json.loads(meta.read_text(encoding="utf-8")).get("prepared")
    try:
        when = datetime.fromisoformat(written)
    except (TypeError, ValueError):  # not recorded (an older zoo), or not a date
        when = datetime.fromtimestamp(meta.stat().st_mtime).astimezone()
    return when.strftime("%Y-%m-%d %H:%M")


def joined(rows: list[list[int]], end: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The ids of ``rows`` one after the other, each followed by ``end`` where one is given (uint32),
    and each row's length with it (int64): a data module's ``encode_documents`` at C speed."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows)) + (end is not None)
    body = np.fromiter(
        itertools.chain.from_iterable(rows), dtype=np.uint32, count=int(lengths.sum()) - (end is not None) * len(rows)
    )
    if end is None:
        return body, lengths
    ids = np.full(int(lengths.sum()), end, dtype=np.uint32)
    ends = np.cumsum(lengths)
    keep = np.ones(len(ids), dtype=bool)
    keep[ends - 1] = False
    ids[keep] = body
    return ids, lengths


def encode_fast(tokenizer: Tokenizer, texts: list[str]) -> list[Any]:
    """``tokenizer.encode_batch(texts)`` without the character offsets nothing here reads (tokenizers
    0.20 and later), in the tokenizer's thread pool."""
    return getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)(texts)


# ---- the cache folder ----------------------------------------------------------------------------------
def writable(folder: Path, root: Path) -> Path:
    """``folder`` (made if missing); a DataError naming the cache and the fix when it cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise DataError(
            f"data.cache_dir={root}: cannot write the prepared corpus there ({error.strerror}); set "
            f"data.cache_dir (or ${CACHE_ENV}) to a folder you can write"
        ) from None
    return folder


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (made if missing): another process preparing the same
    corpus waits here, then finds it ready. The lock ends with this process, however it ends."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
