"""A corpus tokenized once into a memory map (tasks/data/prepared.py): the ids are the tokenizer's, a
changed file or tokenizer is never served stale, a killed or failed preparation is never half-used,
and training reads the same blocks as from memory."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from tasks.data import LMDataModule
from tasks.data import prepared as prep
from tasks.data.tokenizers import train_tokenizer
from tasks.errors import DataError


def _line(i: int) -> str:
    return f"line {i}: " + (f"def f(x): return x * {i}" if i % 3 else "The quick brown fox " * (i % 7 + 1))


LINES = [_line(i) for i in range(400)]


def corpus(folder: Path, files: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        (folder / f"part{f}.txt").write_text("\n".join(LINES[f::files]) + "\n", encoding="utf-8")
    return folder


def module(path: Path, cache: Path, **kwargs) -> LMDataModule:
    args = dict(vocab_size=300, seq_len=16, batch_size=4, val_fraction=0.1, test_fraction=0.1)
    return LMDataModule(source="local", source_args={"path": str(path)}, cache_dir=str(cache), **{**args, **kwargs})


def stores(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "tokens").iterdir() if p.is_dir() and not p.name.startswith("."))


def test_the_prepared_ids_are_the_tokenizers_document_by_document(tmp_path):
    dm = module(corpus(tmp_path / "text"), tmp_path / "cache")
    dm.setup("fit")
    splits = prep.prepared_tokens(dm.corpus(), dm.encode_documents, dm.tokenizer, {}, tmp_path / "other")
    by_split: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    for split, record in dm.corpus().records():
        by_split[split].append(record["text"])
    assert all(by_split.values())
    for name, texts in by_split.items():
        ids, ends = splits[name].read_ids(), splits[name].read_ends()
        starts = np.concatenate([[0], ends[:-1]])
        assert len(ends) == len(texts)
        for text, start, end in zip(texts, starts, ends, strict=True):
            assert ids[start:end].tolist() == dm.encode_with_eos(text)
    assert splits["train"].read_ids().dtype == np.uint16


def test_blocks_from_the_map_are_those_built_in_memory(tmp_path):
    dm = module(corpus(tmp_path / "text"), tmp_path / "cache")
    dm.setup("fit")
    records = [r for split, r in dm.corpus().records() if split == "train"]
    in_memory = dm.build_dataset(records, "train").items
    mapped = dm.datasets["train"]
    assert torch.equal(mapped.items, in_memory)
    assert torch.equal(torch.stack(mapped.__getitems__([3, 0, 5])), in_memory[[3, 0, 5]])
    assert torch.equal(mapped[-1], in_memory[-1])
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (4, 16) and torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])


def test_a_second_run_reads_the_cache_and_a_changed_file_or_tokenizer_prepares_anew(tmp_path):
    text, cache = corpus(tmp_path / "text"), tmp_path / "cache"
    first = module(text, cache)
    first.setup("fit")
    assert len(stores(cache)) == 1
    again = module(text, cache)
    again.setup("fit")
    assert len(stores(cache)) == 1 and again.tokenizer.to_str() == first.tokenizer.to_str()
    assert torch.equal(again.datasets["train"].items, first.datasets["train"].items)

    (text / "part1.txt").write_text("\n".join(LINES[1::3][:-5]) + "\n", encoding="utf-8")  # a changed file
    changed = module(text, cache)
    changed.setup("fit")
    assert len(stores(cache)) == 2

    other = train_tokenizer(LINES[::2], "bpe", 280)  # another tokenizer: another map
    (tmp_path / "tok.json").write_text(other.to_str())
    module(text, cache, tokenizer_path=str(tmp_path / "tok.json")).setup("fit")
    assert len(stores(cache)) == 3


def test_the_tokenizer_learns_from_a_seeded_sample_of_its_size(tmp_path):
    text, cache = corpus(tmp_path / "text"), tmp_path / "cache"
    size = sum(f.stat().st_size for f in text.iterdir())
    mb = size / 4 / 2**20  # a quarter of the corpus
    a = module(text, cache, tokenizer_sample_mb=mb, seed=1)
    a.setup("fit")
    (record,) = [json.loads(p.read_text()) for p in (cache / "tokenizers").glob("*.sample.json")]
    assert 0 < record["sampled_bytes"] <= mb * 2**20 and record["seed"] == 1 and record["sample_mb"] == mb
    b = module(text, tmp_path / "cache2", tokenizer_sample_mb=mb, seed=1)
    b.setup("fit")
    assert b.tokenizer.to_str() == a.tokenizer.to_str()  # the same seed: the same sample
    whole = module(text, tmp_path / "cache3")
    whole.setup("fit")
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "cache3" / "tokenizers").glob("*.sample.json")]
    assert record["sampled_bytes"] > mb * 2**20 * 2  # a corpus under the sample size is read whole


KILLED = """
import os, signal, sys
from tasks.data import prepared as prep
from tasks.data import LMDataModule
prep.CHUNK_CHARS = 200
chunks = prep._chunks
def killed(corpus):
    for n, chunk in enumerate(chunks(corpus)):
        if n == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        yield chunk
prep._chunks = killed
dm = LMDataModule(source="local", source_args={"path": sys.argv[1]}, cache_dir=sys.argv[2], vocab_size=300,
                  seq_len=16, val_fraction=0.1, test_fraction=0.1)
dm.setup("fit")
"""


def test_a_preparation_killed_mid_way_is_never_used_and_the_rerun_gives_the_same_map(tmp_path, monkeypatch):
    text, cache = corpus(tmp_path / "text"), tmp_path / "cache"
    killed = subprocess.run([sys.executable, "-c", KILLED, str(text), str(cache)], capture_output=True, timeout=120)
    assert killed.returncode == -9
    assert stores(cache) == [] and [p for p in (cache / "tokens").iterdir() if p.name.endswith(".tmp")]
    monkeypatch.setattr(prep, "CHUNK_CHARS", 200)
    rerun = module(text, cache)
    rerun.setup("fit")
    assert [p.name for p in (cache / "tokens").iterdir() if p.name.endswith(".tmp")] == []  # the killed one's removed
    clean = module(text, tmp_path / "clean")
    clean.setup("fit")
    for split in ("train", "val", "test"):
        assert np.array_equal(rerun.datasets[split].split.read_ids(), clean.datasets[split].split.read_ids())


def test_a_full_disk_during_preparation_leaves_nothing_under_the_final_name(tmp_path, monkeypatch):
    text, cache = corpus(tmp_path / "text"), tmp_path / "cache"
    monkeypatch.setattr(prep, "CHUNK_CHARS", 200)
    calls = []

    def full(texts):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return dm.encode_documents(texts)

    dm = module(text, cache)
    dm.set_tokenizer(lambda: train_tokenizer(LINES, "bpe", 300))
    with pytest.raises(DataError, match=rf"^data.cache_dir={cache}: cannot write .*No space left on device"):
        prep.prepared_tokens(dm.corpus(), full, dm.tokenizer, {}, cache)
    assert stores(cache) == [] and [p for p in (cache / "tokens").iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.slow  # tens of seconds on 2 cores: CI's slow pass runs it
def test_two_processes_preparing_one_corpus_at_once_agree(tmp_path):
    text, cache = corpus(tmp_path / "text"), tmp_path / "cache"
    code = textwrap.dedent(
        """
        import sys, hashlib
        from tasks.data import LMDataModule
        dm = LMDataModule(source="local", source_args={"path": sys.argv[1]}, cache_dir=sys.argv[2], vocab_size=300,
                          seq_len=16, val_fraction=0.1, test_fraction=0.1)
        dm.setup("fit")
        print(hashlib.md5(dm.datasets["train"].split.read_ids().tobytes()).hexdigest())
        """
    )
    command = [sys.executable, "-c", code, str(text), str(cache)]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE) for _ in range(2)]
    outs = [run.communicate(timeout=180)[0].decode().splitlines()[-1] for run in runs]  # after what each says
    assert all(run.returncode == 0 for run in runs)
    assert outs[0] == outs[1] and len(stores(cache)) == 1


def test_bad_corpora_end_in_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="holds no data files"):
        module(empty, tmp_path / "cache").setup("fit")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "a.txt").write_bytes(b"text\x00\x01\x02")
    with pytest.raises(DataError, match="NUL byte"):
        module(tmp_path / "bin", tmp_path / "cache").setup("fit")
    small = corpus(tmp_path / "small")
    with pytest.raises(DataError, match="fewer than one block"):
        module(small, tmp_path / "cache", seq_len=100_000).setup("fit")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_cache_that_cannot_be_written_is_named(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o500)
    try:
        with pytest.raises(DataError, match=r"data.cache_dir=.*cannot write"):
            module(corpus(tmp_path / "text"), cache).setup("fit")
    finally:
        cache.chmod(0o700)


def test_a_cache_below_a_file_is_named(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match=r"data.cache_dir=.*cannot write"):
        module(corpus(tmp_path / "text"), tmp_path / "file" / "cache").setup("fit")


def test_the_cache_folder_is_chosen_by_setting_then_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(prep.CACHE_ENV, str(tmp_path / "env"))
    assert prep.cache_root(None) == tmp_path / "env"
    assert prep.cache_root(str(tmp_path / "set")) == tmp_path / "set"
    monkeypatch.delenv(prep.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert prep.cache_root(None) == tmp_path / "xdg" / "zoo"


def test_a_dataloader_worker_gets_the_path_not_the_data(tmp_path):
    import pickle

    dm = module(corpus(tmp_path / "text"), tmp_path / "cache")
    dm.setup("fit")
    blocks = dm.datasets["train"]
    blocks[0]  # the file opened here
    copy = pickle.loads(pickle.dumps(blocks))
    assert blocks.reader._fd is not None and copy.reader._fd is None and len(pickle.dumps(blocks)) < 2000
    assert torch.equal(copy[2], blocks[2]) and copy.reader._fd is not None


def test_a_masked_lms_documents_from_the_map_are_those_built_in_memory(tmp_path):
    from tasks.data import MLMDataModule

    text = corpus(tmp_path / "text")
    args = dict(vocab_size=300, seq_len=12, batch_size=4, val_fraction=0.1, test_fraction=0.1)
    dm = MLMDataModule(source="local", source_args={"path": str(text)}, cache_dir=str(tmp_path / "cache"), **args)
    dm.setup("fit")
    for name in ("train", "val"):
        records = [r for split, r in dm.corpus().records() if split == name]
        in_memory = dm.build_dataset(records, name)
        assert dm.datasets[name].items == in_memory.items and dm.datasets[name].lengths == in_memory.lengths
    assert max(dm.datasets["train"].lengths) == 12  # cut to seq_len, [CLS] and [SEP] included
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[0] == 4 and (batch["labels"] != -100).any()


def test_a_dataset_folder_streamed_shard_by_shard_gives_the_ids_it_gives_read_whole(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    for n in range(3):
        rows = [{"text": line, "id": i} for i, line in enumerate(LINES[n::3])]
        (shards / f"part-{n}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    args = dict(vocab_size=300, seq_len=16, batch_size=4, val_fraction=0.1, test_fraction=0.1, max_records=None)
    tokenizer = tmp_path / "tok.json"
    tokenizer.write_text(train_tokenizer(LINES, "bpe", 300).to_str())
    ids = {}
    for streaming in (True, False):
        dm = LMDataModule(
            source="hub",
            source_args={"name": str(shards), "streaming": streaming, "text": "text"},
            cache_dir=str(tmp_path / f"cache-{streaming}"),
            tokenizer_path=str(tokenizer),
            **args,
        )
        dm.setup("fit")
        ids[streaming] = {split: blocks.split.read_ids().tolist() for split, blocks in dm.datasets.items()}
    assert ids[True] == ids[False] and len(ids[True]["train"]) > 1000
    before = stores(tmp_path / "cache-True")
    (shards / "part-1.jsonl").write_text(json.dumps({"text": "a changed shard", "id": 0}) + "\n")
    dm = LMDataModule(
        source="hub",
        source_args={"name": str(shards), "streaming": True, "text": "text"},
        cache_dir=str(tmp_path / "cache-True"),
        tokenizer_path=str(tokenizer),
        **args,
    )
    dm.setup("fit")
    assert len(stores(tmp_path / "cache-True")) == len(before) + 1


def test_blocks_are_read_without_mapping_the_file_and_a_cut_file_is_named(tmp_path):
    dm = module(corpus(tmp_path / "text"), tmp_path / "cache")
    dm.setup("fit")
    blocks = dm.datasets["train"]
    whole = blocks.split.read_ids()
    n = len(blocks)
    assert [blocks[i].tolist() for i in (0, n - 1, -1)] == [
        whole[i * blocks.block : (i + 1) * blocks.block].tolist() for i in (0, n - 1, n - 1)
    ]
    del whole
    batch = blocks.__getitems__([3, 1])
    assert str(blocks.split.ids) not in Path("/proc/self/maps").read_text()  # read, never mapped
    assert [b.tolist() for b in batch] == [blocks[3].tolist(), blocks[1].tolist()]
    with pytest.raises(IndexError):
        blocks[n]
    os.truncate(blocks.split.ids, blocks.block * 2)  # a file cut short after preparation
    with pytest.raises(DataError, match="ids end before id .* remove its folder from the cache"):
        blocks[n - 1]


def test_ranks_train_on_disjoint_shares_of_the_prepared_split(tmp_path, monkeypatch):
    import tasks.data.text_module as text_module

    dm = module(corpus(tmp_path / "text"), tmp_path / "cache")
    dm.setup("fit")
    shares = []
    for rank in range(2):
        monkeypatch.setattr(text_module, "world_rank", lambda rank=rank: (2, rank))
        shares.append([i for batch in dm.train_dataloader().batch_sampler for i in batch])
    blocks = len(dm.datasets["train"])
    assert not set(shares[0]) & set(shares[1]) and len(shares[0]) == len(shares[1])
    assert len(set(shares[0]) | set(shares[1])) >= blocks - 2 * dm.batch_size  # all but each rank's last part batch
