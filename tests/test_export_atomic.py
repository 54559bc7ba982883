"""Exports on bad ground: every zoo-export format is written into a temporary sibling of ``out=`` and
appears whole or not at all, on a full disk too (one line naming the file); ``out=`` through a
symbolic link or below a file is one line; the folder and its files get the umask's modes; and a
killed export's temporary sibling is gone after the next export that succeeds, while a live
writer's is kept. zoo.save_pretrained and zoo.to_hf write their tensors through zoo.io."""

from __future__ import annotations

import fcntl
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import safetensors.torch
from conftest import tiny_model
from safetensors import SafetensorError
from test_export_safety import assert_one_line_error, export_in_process, modes, normal_mode, snapshot, zoo_export

import zoo
import zoo.folders
from tasks.cli.export.formats import EXPORT_FORMATS, export_safetensors
from tasks.cli.loading import load_task

FULL_DISK = "Error while serializing: I/O error: No space left on device (os error 28)"  # as safetensors says it


def normal_folder_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o777 & ~mask


def siblings(folder: Path) -> list[str]:
    """Every name beside ``folder`` that zoo may have made for it (its own, and hidden ones)."""
    return sorted(p.name for p in folder.parent.iterdir() if p.name == folder.name or p.name.startswith("."))


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def full_disk(*args, **kwargs):
    raise SafetensorError(FULL_DISK)


# ---- whole or nothing -------------------------------------------------------------------------------
@pytest.mark.parametrize("fails_at", ["model.safetensors", "config.json", "tokenizer.json", "README.md"])
def test_a_failed_export_into_a_new_folder_leaves_nothing(gpt_base, tmp_path, monkeypatch, fails_at):
    """Before: config.json was written into out= first, so a failure later left a folder holding a
    config that claims to be an export."""
    task, info = load_task(gpt_base)
    out = tmp_path / "exports" / "gpt"
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst).name == fails_at:
            raise OSError(28, "No space left on device", os.fspath(dst))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError) as error:
        export_safetensors(task, info, out, card="# card\n")
    assert error.value.errno == 28 and error.value.filename == str(out / fails_at)  # the path asked for
    assert list((tmp_path / "exports").iterdir()) == []


def test_a_full_disk_in_save_pretrained_names_the_file_and_leaves_no_config(tmp_path, monkeypatch):
    monkeypatch.setattr(safetensors.torch, "save_model", full_disk)
    with pytest.raises(OSError) as error:
        zoo.save_pretrained(tiny_model(), tmp_path / "m")
    assert error.value.errno == 28 and error.value.filename == str(tmp_path / "m" / "model.safetensors")
    assert list((tmp_path / "m").iterdir()) == []  # no config.json without its weights, no temporary file


def test_a_full_disk_in_to_hf_names_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(OSError) as error:
        zoo.to_hf(tiny_model(position="learned", norm="layernorm", ffn="gelu", bias=True), tmp_path / "hf")
    assert error.value.errno == 28 and error.value.filename == str(tmp_path / "hf" / "model.safetensors")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_file_size_limit_is_one_line_naming_the_file_and_leaves_nothing(gpt_base, tmp_path):
    """A real failed write: the kernel refuses to grow a file past RLIMIT_FSIZE (EFBIG), in
    safetensors' Rust writer as in Python's."""
    probe = tmp_path / "probe"
    export_safetensors(*load_task(gpt_base), probe)
    weights = (probe / "model.safetensors").stat().st_size
    small = max(p.stat().st_size for p in probe.iterdir() if p.name != "model.safetensors")
    assert small < weights // 2, "the limit must stop the weights and nothing else"
    limit = weights // 2

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    out = tmp_path / "out"
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore", "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "tasks.cli.export", f"ckpt_path={gpt_base}", f"out={out}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limited,
    )
    assert_one_line_error(done.stderr)
    assert done.returncode == 1 and f"cannot write {out / 'model.safetensors'}: File too large" in done.stderr
    assert siblings(out) == []


# ---- out= on bad ground -------------------------------------------------------------------------------
def _link_to_empty(tmp_path: Path) -> Path:
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    return tmp_path / "link"


def _dangling(tmp_path: Path) -> Path:
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    return tmp_path / "link"


def _below_a_file(tmp_path: Path) -> Path:
    (tmp_path / "notes.txt").write_text("keep me")
    return tmp_path / "notes.txt" / "model"


def _below_a_broken_link(tmp_path: Path) -> Path:
    return _dangling(tmp_path) / "model"


BAD_OUT = {
    "symlink_to_a_folder": (_link_to_empty, "is a symbolic link"),
    "dangling_symlink": (_dangling, "is a symbolic link"),
    "below_a_file": (_below_a_file, "which is a file"),
    "below_a_broken_link": (_below_a_broken_link, "a broken symbolic link"),
}


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
@pytest.mark.parametrize("case", list(BAD_OUT))
def test_out_through_a_link_or_below_a_file_is_one_line(gpt_base, tmp_path, monkeypatch, capsys, fmt, case):
    make, words = BAD_OUT[case]
    out = make(tmp_path)
    before = {p.name: (p.is_symlink(), p.is_dir()) for p in tmp_path.iterdir()}
    with pytest.raises(SystemExit) as exit_:
        export_in_process(monkeypatch, f"ckpt_path={gpt_base}", f"out={out}", f"format={fmt}")
    err = capsys.readouterr().err
    assert_one_line_error(err)
    assert exit_.value.code == 2 and f"out={out} " in err and words in err
    assert {p.name: (p.is_symlink(), p.is_dir()) for p in tmp_path.iterdir()} == before  # the link is still there
    if (tmp_path / "target").exists():
        assert list((tmp_path / "target").iterdir()) == []


@pytest.mark.slow
def test_out_through_a_link_is_one_line_from_the_command(gpt_base, tmp_path):
    out = _link_to_empty(tmp_path)
    done = zoo_export(tmp_path, f"ckpt_path={gpt_base}", f"out={out}", "format=hf")
    assert_one_line_error(done.stderr)
    assert done.returncode == 2 and f"out={out} is a symbolic link" in done.stderr
    assert out.is_symlink() and list((tmp_path / "target").iterdir()) == []


# ---- modes and killed exports ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["safetensors", "hf"])
def test_exports_get_the_umasks_modes(gpt_base, tmp_path, fmt):
    """Before: format=hf's folder kept mkdtemp's 0700."""
    out = tmp_path / "out"
    done = zoo_export(tmp_path, f"ckpt_path={gpt_base}", f"out={out}", f"format={fmt}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert stat.S_IMODE(out.stat().st_mode) == normal_folder_mode()
    assert set(modes(out).values()) == {normal_mode()}


KILLED = {  # the function each format calls on its finished temporary folder, before it takes its name
    "safetensors": ("zoo", "load_pretrained"),
    "hf": ("tasks.cli.export.hf", "check_reload"),
}


def _killed_export(ckpt: Path, out: Path, fmt: str) -> None:
    """A real zoo-export, SIGKILLed once its files are written, before its folder takes its name."""
    module, name = KILLED[fmt]
    script = textwrap.dedent(f"""
        import importlib, os, signal, sys
        from tasks.cli import verbs
        setattr(importlib.import_module({module!r}), {name!r}, lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL))
        sys.argv = ["zoo-export", "ckpt_path={ckpt}", "out={out}", "format={fmt}"]
        verbs.export()
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=out.parent,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"},
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", list(KILLED))
def test_a_killed_export_leaves_nothing_after_the_next_one(gpt_base, tmp_path, fmt):
    out = tmp_path / "out"
    _killed_export(gpt_base, out, fmt)
    assert not out.exists()  # nothing under its name; what it wrote waits in a hidden sibling
    assert len(siblings(out)) == 1
    (tmp_path / ".out.backup").mkdir()  # the user's own hidden folder, beside it
    done = zoo_export(tmp_path, f"ckpt_path={gpt_base}", f"out={out}", f"format={fmt}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert siblings(out) == [".out.backup", "out"]


def _stage(folder: Path, pid: int) -> Path:
    stage = folder.parent / f".{folder.name}.zoo-{pid}-abcd1234.tmp"
    stage.mkdir()
    (stage / "model.safetensors").write_bytes(b"half a file")
    return stage


def test_only_dead_writers_temporary_folders_are_removed(tmp_path):
    out = tmp_path / "out"
    dead, alive = _stage(out, dead_pid()), _stage(out, os.getpid())
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import sys, time
        import zoo.folders
        with zoo.folders.atomic_folder({str(tmp_path / "out")!r}) as stage:
            print(stage, flush=True)
            time.sleep(120)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        running = Path(writer.stdout.readline().strip())  # another live writer of the same folder
        locked = _stage(out, dead_pid())  # a dead pid (as seen from another PID namespace) whose lock is held
        fd = os.open(locked, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        others = [tmp_path / ".out.zoo-12-.tmp", tmp_path / ".outer.zoo-1-abcd1234.tmp", tmp_path / ".out.old"]
        for other in others:
            other.mkdir()
        (tmp_path / f".out.zoo-{dead_pid()}-linkabcd.tmp").symlink_to(tmp_path / ".out.old")
        assert zoo.folders.remove_stale_stages(out) == [dead]
        assert running.is_dir() and alive.is_dir() and locked.is_dir() and all(p.is_dir() for p in others)
        os.close(fd)
        assert zoo.folders.remove_stale_stages(out) == [locked]
    finally:
        writer.kill()
        writer.wait()
    time.sleep(0.1)
    assert zoo.folders.remove_stale_stages(out) == [running]


# ---- merging into a previous export ------------------------------------------------------------------
def test_an_export_into_a_previous_one_moves_config_json_last(gpt_base, tmp_path, monkeypatch):
    """Into a folder that already holds an export, each file moves in by its own rename; the
    config.json that records them comes last, so a kill in between never records a file that is
    not there."""
    task, info = load_task(gpt_base)
    export_safetensors(task, info, tmp_path / "out")
    (tmp_path / "out" / "notes.md").write_text("mine")
    moved: list[str] = []
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst).parent == tmp_path / "out":
            moved.append(Path(dst).name)
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    export_safetensors(task, info, tmp_path / "out", card="# card\n")
    assert moved[-1] == "config.json" and sorted(moved) == sorted(
        json.loads((tmp_path / "out" / "config.json").read_text())["zoo_export"]["files"]
    )
    assert (tmp_path / "out" / "notes.md").read_text() == "mine" and siblings(tmp_path / "out") == ["out"]
    assert set(snapshot(tmp_path / "out")) == {*moved, "notes.md"}
