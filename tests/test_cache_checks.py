"""A prepared corpus is checked before a run trains on it (tasks/data/prepared.py, ``read_prepared``;
tasks/data/token_files.py, ``SplitTokens.check``): a tampered or damaged cache, and a disk that fills
while one is prepared, end zoo-train in one line that names the cache folder and how to prepare it
again, with no traceback; a cache an older zoo wrote (no CRC-32 in its meta.json) is still used."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from test_prepared import corpus, module, stores

from tasks.cli.boundary import user_errors
from tasks.cli.schemas import conf_dir
from tasks.cli.verbs import _train_job
from tasks.data import prepared as prep
from tasks.errors import DataError

RUN = [
    "data=local_text",
    "data.vocab_size=300",
    "data.seq_len=16",
    "data.packing=documents",
    "model/mask=document",
    "model.d_model=32",
    "model.n_heads=2",
    "model.n_layers=1",
    "trainer.max_steps=2",
    "trainer.limit_val_batches=1",
    "trainer.num_sanity_val_steps=0",
    "callbacks.rich_progress_bar=null",
    "test=false",
]
AGAIN = "delete that folder and run again to prepare it anew"


def config(text: Path, cache: Path, out: Path):
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose(
            "train",
            overrides=[*RUN, f"data.source_args.path={text}", f"data.cache_dir={cache}", f"paths.output_dir={out}"],
        )


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, Path]:
    """A corpus and the cache zoo-train prepares for it (by the data module the config builds)."""
    root = tmp_path_factory.mktemp("prepared")
    text, cache = corpus(root / "text"), root / "cache"
    instantiate(config(text, cache, root / "unused").data).setup("fit")
    return text, cache


def refused(cfg, capsys) -> str:
    """The one line zoo-train (as the console verb runs it) ends in, exit 2, no traceback."""
    with pytest.raises(SystemExit) as stop:
        user_errors(_train_job)(cfg)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert stop.value.code == 2 and "Traceback" not in err and len(lines) == 1, err
    return lines[0]


@pytest.fixture
def copy(prepared, tmp_path) -> tuple[Path, Path]:
    """The prepared cache copied for one test to tamper with, and its store (the folder of one corpus)."""
    text, cache = prepared
    shutil.copytree(cache, tmp_path / "cache")
    (store,) = stores(tmp_path / "cache")
    return text, store


def _meta(store: Path) -> dict:
    return json.loads((store / "meta.json").read_text(encoding="utf-8"))


def _write_meta(store: Path, meta: dict) -> None:
    (store / "meta.json").write_text(json.dumps(meta), encoding="utf-8")


def test_ends_all_set_to_2_62_are_refused_with_packed_documents(copy, tmp_path, capsys):
    text, store = copy
    ends = store / "train.ends"
    size = ends.stat().st_size
    np.full(size // 8, 2**62, dtype=np.int64).tofile(ends)
    assert ends.stat().st_size == size
    line = refused(config(text, tmp_path / "cache", tmp_path / "run"), capsys)
    assert line.startswith(f"zoo: DataError: {store}: the prepared corpus is damaged (train.ends: ") and AGAIN in line


def test_ids_beyond_the_vocabulary_are_refused_before_the_model_sees_them(copy, tmp_path, capsys):
    text, store = copy
    ids = np.fromfile(store / "train.ids", dtype=np.uint16)
    ids[len(ids) // 2 :] = 65535
    ids.tofile(store / "train.ids")
    line = refused(config(text, tmp_path / "cache", tmp_path / "run"), capsys)
    assert f"{store}: the prepared corpus is damaged (train.ids: id 65535 at token {len(ids) // 2:,}" in line
    assert "beyond the tokenizer's 300 ids" in line and AGAIN in line


@pytest.mark.parametrize(
    ("tamper", "said"),
    [
        (lambda meta: meta["splits"]["train"].update(tokens=-5), "train split has tokens -5, not a count"),
        (lambda meta: meta["splits"].pop("train"), "meta.json has no train split"),
        (lambda meta: meta["splits"]["val"].update(documents="12"), "val split has documents '12', not a count"),
        (lambda meta: meta.update(dtype="float64"), "dtype is 'float64', not uint16 or uint32"),
        (lambda meta: meta["splits"]["test"].update(tokens=10**30), "test.ids holds"),
        (lambda meta: meta["splits"]["train"].update(crc32=[1]), "crc32 [1], not two CRC-32s"),
    ],
)
def test_a_meta_json_that_does_not_hold_counts_is_refused(copy, tmp_path, capsys, tamper, said):
    text, store = copy
    meta = _meta(store)
    tamper(meta)
    _write_meta(store, meta)
    line = refused(config(text, tmp_path / "cache", tmp_path / "run"), capsys)
    assert line.startswith(f"zoo: DataError: {store}: the prepared corpus is damaged (") and said in line, line
    assert AGAIN in line


def test_a_full_disk_while_the_ids_are_written_is_one_line_naming_the_cache(prepared, tmp_path, capsys, monkeypatch):
    text, _ = prepared
    cache = tmp_path / "cache"

    def full(file, array, crc):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(prep, "_append", full)
    line = refused(config(text, cache, tmp_path / "run"), capsys)
    assert line.startswith(f"zoo: DataError: data.cache_dir={cache}: cannot write the prepared corpus there (No sp")
    assert "free some space" in line
    assert stores(cache) == [] and not [p for p in (cache / "tokens").iterdir() if p.name.endswith(".tmp")]


def test_a_cache_of_an_older_zoo_without_crc32_is_used_and_still_checked(tmp_path):
    text, cache = corpus(tmp_path / "text"), tmp_path / "cache"
    module(text, cache).setup("fit")
    (store,) = stores(cache)
    meta = _meta(store)
    assert all(len(split["crc32"]) == 2 for split in meta["splits"].values())
    for split in meta["splits"].values():
        del split["crc32"]  # as zoo wrote it before the checks
    _write_meta(store, meta)
    again = module(text, cache)
    again.setup("fit")  # used as it is: no new store
    assert stores(cache) == [store] and len(again.datasets["train"]) > 0
    ids = np.fromfile(store / "val.ids", dtype=np.uint16)
    ids[0] = 300  # one past the vocabulary: found without a checksum
    ids.tofile(store / "val.ids")
    with pytest.raises(DataError, match=r"val.ids: id 300 at token 0 is beyond the tokenizer's 300 ids"):
        module(text, cache).setup("fit")


def test_bytes_changed_within_the_vocabulary_are_found_by_the_crc32(tmp_path):
    text, cache = corpus(tmp_path / "text"), tmp_path / "cache"
    module(text, cache).setup("fit")
    (store,) = stores(cache)
    ids = np.fromfile(store / "train.ids", dtype=np.uint16)
    ids[[5, 6]] = ids[[6, 5]]  # two ids swapped: every other check holds
    ids.tofile(store / "train.ids")
    with pytest.raises(DataError, match=r"train.ids: its bytes are not those written when it was prepared"):
        module(text, cache).setup("fit")


def test_a_cut_or_missing_file_and_a_store_without_meta_are_named(tmp_path):
    text, cache = corpus(tmp_path / "text"), tmp_path / "cache"
    module(text, cache).setup("fit")
    (store,) = stores(cache)
    (store / "val.ends").write_bytes((store / "val.ends").read_bytes()[:-3])
    with pytest.raises(DataError, match=rf"^{store}: .*\(val.ends holds [\d,]+ bytes where meta.json's count"):
        module(text, cache).setup("fit")
    (store / "val.ends").unlink()
    with pytest.raises(DataError, match=r"\(val.ends: No such file"):
        module(text, cache).setup("fit")
    (store / "meta.json").unlink()
    with pytest.raises(DataError, match=r"\(meta.json cannot be read: No such file"):
        module(text, cache).setup("fit")
    assert (store / "train.ids").is_file()  # nothing zoo found is deleted: the user does


@pytest.mark.slow
def test_zoo_train_on_a_tampered_cache_ends_in_one_line(copy, tmp_path):
    from real_commands import one_line_error, run

    text, store = copy
    meta = _meta(store)
    meta["splits"]["train"]["tokens"] = -5
    _write_meta(store, meta)
    paths = [f"data.source_args.path={text}", f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'r'}"]
    done = run("train", *RUN, *paths, cwd=tmp_path)
    line = one_line_error(done, f"{store}: the prepared corpus is damaged", "tokens -5, not a count", AGAIN)
    assert not (tmp_path / "r").exists() and (store / "train.ids").is_file()
    print(line)


def test_a_real_write_the_system_refuses_is_the_same_line(tmp_path):
    """Not a stand-in: the files' own writes past a file size limit (EFBIG, as a full disk's ENOSPC), which
    numpy's ``tofile`` raised as an OSError without the system's errno (a traceback)."""
    import resource
    import signal

    from test_prepared import LINES

    from tasks.data.tokenizers import train_tokenizer

    text, cache = corpus(tmp_path / "text"), tmp_path / "cache"
    dm = module(text, cache)
    dm.set_tokenizer(lambda: train_tokenizer(LINES, "bpe", 300))
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limits[1]))
    try:
        with pytest.raises(DataError, match=rf"^data.cache_dir={cache}: cannot write the prepared corpus there \(File"):
            prep.prepared_tokens(dm.corpus(), dm.encode_documents, dm.tokenizer, {}, cache)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert stores(cache) == [] and not [p for p in (cache / "tokens").iterdir() if p.name.endswith(".tmp")]
