"""A handed folder must not carry files from outside it into what zoo writes (issue 34, class 1).

Every file zoo reads out of a folder a user hands it (an HF model folder: config.json, the weights
and their index, tokenizer.json, tokenizer_config.json, special_tokens_map.json, chat_template.jinja;
a zoo model folder: config.json, model.safetensors, tokenizer.json) goes through
``zoo.io.handed_path`` / ``read_handed``: a symbolic link out of the folder, a hard link to a file
with a name elsewhere, a FIFO, a device, a folder in the file's place and a file larger than its
kind allows are each refused in one line naming the file, before anything is read. A link to another
file of the folder, a second name inside it, and the Hugging Face hub cache's layout
(``snapshots/<rev>/<file>`` -> ``../../blobs/<hash>``) still load.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import zoo
from tasks.data.tokenizers import read_folder_tokenizer, read_hf_tokenizer
from tasks.errors import UserError
from zoo.io import INDEX_LIMIT, JSON_LIMIT, TEMPLATE_LIMIT, TOKENIZER_LIMIT

transformers = pytest.importorskip("transformers")

from hf_tiny import _gpt2_config  # noqa: E402  (after the importorskip)
from safetensors.torch import load_file, save_file  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402

SECRET = "SECRET=do-not-copy-me"
TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


# ---- the folders --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, Path]:
    """One tiny folder of each layout, built once; each test hostile-edits a copy."""
    root = tmp_path_factory.mktemp("originals")
    torch.manual_seed(0)
    hf = root / "hf"
    transformers.GPT2LMHeadModel(_gpt2_config()).save_pretrained(hf)
    vocab = {"<|endoftext|>": 0, "<unk>": 1, "<s>": 2, "hello": 3, "world": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(hf / "tokenizer.json"))
    (hf / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "unk_token": "<unk>"}))
    (hf / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    (hf / "chat_template.jinja").write_text(TEMPLATE)

    sharded = root / "sharded"
    shutil.copytree(hf, sharded)
    tensors = load_file(sharded / "model.safetensors")
    (sharded / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, part in halves.items():
        save_file({n: tensors[n].contiguous() for n in part}, str(sharded / shard), metadata={"format": "pt"})
    weight_map = {n: shard for shard, part in halves.items() for n in part}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    bin_folder = root / "bin"
    shutil.copytree(hf, bin_folder)
    torch.save(load_file(bin_folder / "model.safetensors"), bin_folder / "pytorch_model.bin")
    (bin_folder / "model.safetensors").unlink()

    native = root / "native"
    zoo.save_pretrained(zoo.from_hf(hf), native)
    shutil.copy(hf / "tokenizer.json", native / "tokenizer.json")
    return {"hf": hf, "sharded": sharded, "bin": bin_folder, "native": native}


def _hf_model(folder: Path) -> object:
    return zoo.from_hf(folder)


def _hf_tokenizer(folder: Path) -> object:
    return read_hf_tokenizer(folder)


def _native_model(folder: Path) -> object:
    return zoo.load_pretrained(folder)


def _native_tokenizer(folder: Path) -> object:
    return read_folder_tokenizer(folder, "model_dir", "pass the tokenizer.json the model was trained with")


# (layout, file, its size limit or None, the reader that reads it)
FILES: list[tuple[str, str, int | None, Callable[[Path], object]]] = [
    ("hf", "config.json", JSON_LIMIT, _hf_model),
    ("hf", "config.json", JSON_LIMIT, _hf_tokenizer),
    ("hf", "model.safetensors", None, _hf_model),
    ("sharded", "model.safetensors.index.json", INDEX_LIMIT, _hf_model),
    ("sharded", "model-00002-of-00002.safetensors", None, _hf_model),
    ("bin", "pytorch_model.bin", None, _hf_model),
    ("hf", "tokenizer.json", TOKENIZER_LIMIT, _hf_tokenizer),
    ("hf", "tokenizer_config.json", JSON_LIMIT, _hf_tokenizer),
    ("hf", "special_tokens_map.json", JSON_LIMIT, _hf_tokenizer),
    ("hf", "chat_template.jinja", TEMPLATE_LIMIT, _hf_tokenizer),
    ("native", "config.json", JSON_LIMIT, _native_model),
    ("native", "model.safetensors", None, _native_model),
    ("native", "tokenizer.json", TOKENIZER_LIMIT, _native_tokenizer),
]
IDS = [f"{layout}-{name}-{reader.__name__.strip('_')}" for layout, name, _, reader in FILES]


@pytest.fixture
def copy(originals, tmp_path) -> Callable[[str], Path]:
    def make(layout: str) -> Path:
        return Path(shutil.copytree(originals[layout], tmp_path / layout))

    return make


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail (not hang) when the body takes longer than ``seconds``: a read that waits on a FIFO."""

    def expired(signum, frame):
        raise TimeoutError(f"still reading after {seconds} s: the file was opened and read")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def refused(read: Callable[[Path], object], folder: Path, name: str, *needles: str) -> str:
    """The one-line refusal ``read(folder)`` raises; it names the file and each of ``needles``."""
    with deadline(10), pytest.raises((zoo.CheckpointError, UserError)) as caught:
        read(folder)
    message = str(caught.value)
    assert "\n" not in message
    assert name in message
    for needle in needles:
        assert needle in message, message
    return message


# ---- refused --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("layout", "name", "limit", "read"), FILES, ids=IDS)
def test_a_link_to_a_file_outside_the_folder_is_refused(copy, tmp_path, layout, name, limit, read):
    folder = copy(layout)
    secret = tmp_path / "elsewhere" / "environ"
    secret.parent.mkdir()
    secret.write_text(SECRET)
    (folder / name).unlink()
    (folder / name).symlink_to(secret)
    message = refused(read, folder, name, "outside the folder", "copy the file into the folder")
    assert SECRET not in message


@pytest.mark.parametrize(("layout", "name", "limit", "read"), FILES, ids=IDS)
def test_a_relative_link_climbing_out_of_the_folder_is_refused(copy, tmp_path, layout, name, limit, read):
    folder = copy(layout)
    (tmp_path / "key").write_text(SECRET)
    (folder / name).unlink()
    (folder / name).symlink_to(Path("..") / "key")
    refused(read, folder, name, "outside the folder")


@pytest.mark.parametrize(("layout", "name", "limit", "read"), FILES, ids=IDS)
def test_a_hard_link_to_a_file_named_elsewhere_is_refused(copy, tmp_path, layout, name, limit, read):
    folder = copy(layout)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.replace(folder / name, elsewhere / name)  # the very same bytes: only the second name is wrong
    os.link(elsewhere / name, folder / name)
    refused(read, folder, name, "hard link", "cp --remove-destination")


@pytest.mark.parametrize(("layout", "name", "limit", "read"), FILES, ids=IDS)
def test_a_fifo_is_refused_without_waiting_on_it(copy, layout, name, limit, read):
    folder = copy(layout)
    (folder / name).unlink()
    os.mkfifo(folder / name)
    refused(read, folder, name, "a FIFO, not a regular file")


@pytest.mark.parametrize(("layout", "name", "limit", "read"), FILES, ids=IDS)
def test_a_folder_in_the_files_place_is_refused(copy, layout, name, limit, read):
    folder = copy(layout)
    (folder / name).unlink()
    (folder / name).mkdir()
    (folder / name / "inside").write_text("{}")
    refused(read, folder, name, "a folder, not a regular file")


@pytest.mark.parametrize(("layout", "name", "limit", "read"), FILES[:4], ids=IDS[:4])
def test_a_device_is_refused_without_opening_it(copy, layout, name, limit, read):
    folder = copy(layout)
    (folder / name).unlink()
    try:
        os.mknod(folder / name, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers: endless
    except PermissionError:
        pytest.skip("this machine does not let the tests make a device")
    refused(read, folder, name, "a device, not a regular file")


LIMITED = [(f, i) for f, i in zip(FILES, IDS, strict=True) if f[2] is not None]


@pytest.mark.parametrize(("layout", "name", "limit", "read"), [f for f, _ in LIMITED], ids=[i for _, i in LIMITED])
def test_a_file_larger_than_its_kind_allows_is_refused_unread(copy, layout, name, limit, read):
    folder = copy(layout)
    os.truncate(folder / name, limit + 1)  # sparse: costs no disk
    refused(read, folder, name, f"{limit + 1:,} bytes", f"{limit // 2**20} MiB")
    os.truncate(folder / name, 2**40)  # a terabyte, which a read would never finish
    refused(read, folder, name, f"{2**40:,} bytes")


def test_a_link_out_of_the_folder_never_reaches_a_checkpoint(copy, tmp_path):
    """The issue's case: chat_template.jinja linked to the process's environment."""
    folder = copy("hf")
    (folder / "chat_template.jinja").unlink()
    (folder / "chat_template.jinja").symlink_to("/proc/self/environ")
    refused(_hf_tokenizer, folder, "chat_template.jinja", "outside the folder")


# ---- still read ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("layout", "name", "limit", "read"), FILES, ids=IDS)
def test_a_link_to_another_file_of_the_folder_is_read(copy, layout, name, limit, read):
    folder = copy(layout)
    os.replace(folder / name, folder / f"real-{name}")
    (folder / name).symlink_to(f"real-{name}")
    assert read(folder) is not None


@pytest.mark.parametrize(("layout", "name", "limit", "read"), FILES, ids=IDS)
def test_a_second_name_inside_the_folder_is_read(copy, layout, name, limit, read):
    folder = copy(layout)
    os.link(folder / name, folder / f"copy-{name}")
    assert read(folder) is not None


def test_the_chat_template_read_is_the_folders_own(copy):
    folder = copy("hf")
    assert read_hf_tokenizer(folder)[1].chat_template == TEMPLATE


def _hub_cache(originals, root: Path, layout: str = "hf") -> Path:
    """The folder as huggingface_hub's cache lays it out: snapshots/<rev>/<file> -> ../../blobs/<hash>."""
    repo = root / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    for i, file in enumerate(sorted(originals[layout].iterdir())):
        blob = f"{i:02d}{'e3b0c442' * 8}"[:64]
        shutil.copy(file, repo / "blobs" / blob)
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / blob)
    return snapshot


@pytest.mark.parametrize("layout", ["hf", "sharded"])
def test_the_hub_cache_layout_still_loads(originals, tmp_path, layout):
    snapshot = _hub_cache(originals, tmp_path, layout)
    model = zoo.from_hf(snapshot)
    expected = zoo.from_hf(originals[layout])
    for (name, got), want in zip(model.state_dict().items(), expected.state_dict().values(), strict=True):
        assert torch.equal(got, want), name
    tok, specials = read_hf_tokenizer(snapshot)
    assert specials.chat_template == TEMPLATE
    assert zoo.hf.stored_dtypes(snapshot) == {torch.float32}


def test_a_hub_snapshot_linking_to_another_repos_blobs_is_refused(originals, tmp_path):
    snapshot = _hub_cache(originals, tmp_path)
    other = tmp_path / "models--someone--else" / "blobs"
    other.mkdir(parents=True)
    (other / "feedface").write_text(SECRET)
    (snapshot / "chat_template.jinja").unlink()
    (snapshot / "chat_template.jinja").symlink_to(other / "feedface")
    refused(_hf_tokenizer, snapshot, "chat_template.jinja", "outside the folder")


def test_a_folder_outside_snapshots_gets_no_blobs_allowance(originals, tmp_path):
    """Only a folder sitting in ``snapshots/`` may read its repo's ``blobs``."""
    folder = Path(shutil.copytree(originals["hf"], tmp_path / "repo" / "plain" / "model"))
    blobs = tmp_path / "repo" / "blobs"
    blobs.mkdir()
    (blobs / "abc").write_text(TEMPLATE)
    (folder / "chat_template.jinja").unlink()
    (folder / "chat_template.jinja").symlink_to(blobs / "abc")
    refused(_hf_tokenizer, folder, "chat_template.jinja", "outside the folder")


def test_a_link_to_nothing_is_a_missing_file(copy):
    folder = copy("hf")
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to(folder / "gone.json")
    refused(_hf_model, folder, "config.json", "no config.json")


def test_links_in_a_loop_are_refused_in_one_line(copy):
    folder = copy("hf")
    (folder / "tokenizer_config.json").unlink()
    (folder / "tokenizer_config.json").symlink_to("loop.json")
    (folder / "loop.json").symlink_to("tokenizer_config.json")
    refused(_hf_tokenizer, folder, "tokenizer_config.json", "cannot be read")
