"""One line, never a traceback, for what a user or a handed file can cause (issue 34, class 5):

- a prompt (``prompt=``, ``text=``, ``target=``) whose bytes are not UTF-8 (Python hands them on as
  lone surrogates) in zoo-generate and zoo-attention, with a zoo checkpoint or a GGUF file;
- a JSON file of a handed folder nested 100,000 levels deep (json recurses until Python stops it),
  and a RecursionError raised in any parser (JSON, YAML, OmegaConf);
- ``resume=`` of a run directory this process cannot write, and Hydra's own writes into a run
  directory (``.hydra/config.yaml``) on a read-only disk.

Tests run as root, whom ``chmod`` does not stop, and no read-only mount is at hand: a read-only disk
is simulated by making the write itself raise ``OSError(EROFS)`` (monkeypatched at the one place that
writes: ``claim_fresh`` for resume=, Hydra's ``_save_config`` for its records).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_generate_limits_verbs import LINES, ckpts, generate, one_line  # noqa: F401  (ckpts: a fixture)
from test_handed_folder_files import originals  # noqa: F401  (a fixture)

import zoo
from tasks.cli import hydra_callbacks, verbs
from tasks.cli.attention.maps import attention_report
from tasks.cli.boundary import one_line as one_line_of
from tasks.cli.console import quote_free_text
from tasks.cli.hydra_callbacks import FreshRunDir
from tasks.cli.schemas import conf_dir
from tasks.data.tokenizers import read_hf_tokenizer, train_tokenizer
from tasks.errors import UserError, utf8_text

NOT_UTF8 = [
    ("\udcff\udcfe", "byte 0xff (at character 0)"),  # $'\xff\xfe' on the command line
    ("caf\udce9", "byte 0xe9 (at character 3)"),  # "café" typed in a latin-1 terminal
    ("def f():\n    return \udc80", "byte 0x80"),
]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    """A tiny llama GGUF file with a byte-level BPE vocabulary (zoo.to_gguf)."""
    bpe = train_tokenizer(LINES, "bpe", vocab_size=300)  # past the 256 bytes: merges llama.cpp's gpt2 vocab needs
    cfg = zoo.get_config("llama-tiny").replace(
        vocab_size=bpe.get_vocab_size(), d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=32
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    zoo.to_gguf(zoo.build_model(cfg), path, tokenizer=bpe)
    return path


def attention(out: Path, *overrides: str) -> dict:
    """zoo-attention in this process, its command line quoted as the real command quotes it."""
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("attention", overrides=quote_free_text(list(overrides), keys=("prompt", "text", "target")))
    return attention_report(cfg, out)


def _source(name: str, ckpts, gguf_file) -> Path:  # noqa: F811
    return gguf_file if name == "gguf" else ckpts[name]


# ---- prompts that are not UTF-8 -------------------------------------------------------------------
@pytest.mark.parametrize("source", ["learned", "translator", "classifier", "gguf"])
@pytest.mark.parametrize(("prompt", "where"), NOT_UTF8)
def test_zoo_generate_refuses_a_prompt_that_is_not_utf8_in_one_line(
    source,
    prompt,
    where,
    ckpts,  # noqa: F811
    gguf_file,
    capsys,
):
    with pytest.raises(SystemExit) as stop:
        generate([f"ckpt_path={_source(source, ckpts, gguf_file)}", f"prompt={prompt}"])
    assert stop.value.code == 2
    line = one_line(capsys)
    assert line.startswith("zoo: UserError: prompt=: ") and where in line and "not UTF-8 text" in line


@pytest.mark.parametrize(
    ("source", "key"), [("rope", "prompt"), ("rope", "text"), ("gguf", "prompt"), ("translator", "target")]
)
@pytest.mark.parametrize(("prompt", "where"), NOT_UTF8[:2])
def test_zoo_attention_refuses_text_that_is_not_utf8_in_one_line(
    source,
    key,
    prompt,
    where,
    ckpts,  # noqa: F811
    gguf_file,
    tmp_path,
    capsys,
):
    overrides = [f"ckpt_path={_source(source, ckpts, gguf_file)}", "plots=false"]
    overrides += [f"{key}={prompt}"] if key != "target" else ["prompt=three hundred", f"target={prompt}"]
    with pytest.raises(SystemExit) as stop:
        attention(tmp_path / "out", *overrides)
    assert stop.value.code == 2
    line = one_line(capsys)
    assert line.startswith(f"zoo: UserError: {key}=: ") and where in line
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_utf8_text_names_a_lone_surrogate_and_passes_real_text():
    assert utf8_text("prompt", "naïve ☃ 猫 \U0001f600") == "naïve ☃ 猫 \U0001f600"
    with pytest.raises(UserError, match=r"prompt=: the lone surrogate U\+D800 \(at character 1\)"):
        utf8_text("prompt", "a\ud800")


def test_the_real_zoo_generate_refuses_argv_bytes_that_are_not_utf8(ckpts, tmp_path):  # noqa: F811
    """The one subprocess: bytes on a real command line, as a shell's $'\\xff\\xfe' passes them."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    argv = [sys.executable.encode(), b"-m", b"tasks.cli.generate", f"ckpt_path={ckpts['rope']}".encode()]
    argv += [b"prompt=\xff\xfe", f"hydra.run.dir={tmp_path / 'run'}".encode()]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, timeout=300)
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2 and "Traceback" not in err, err[-3000:]
    assert err.startswith("zoo: UserError: prompt=: byte 0xff") and err.count("\n") == 1, err


# ---- JSON nested too deep -------------------------------------------------------------------------
DEPTH = 100_000
DEEP = {
    "list": "[" * DEPTH + "]" * DEPTH,
    "object": '{"a": ' * DEPTH + "1" + "}" * DEPTH,
}


def _deep(folder: Path, name: str, kind: str) -> Path:
    (folder / name).write_text(DEEP[kind])
    return folder / name


@pytest.mark.parametrize("kind", DEEP)
@pytest.mark.parametrize(
    ("layout", "name", "read"),
    [
        ("hf", "config.json", zoo.from_hf),
        ("hf", "config.json", read_hf_tokenizer),
        ("hf", "tokenizer_config.json", read_hf_tokenizer),
        ("hf", "special_tokens_map.json", read_hf_tokenizer),
        ("hf", "tokenizer.json", read_hf_tokenizer),
        ("sharded", "model.safetensors.index.json", zoo.from_hf),
        ("native", "config.json", zoo.load_pretrained),
    ],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_a_json_file_nested_too_deep_is_one_line(originals, tmp_path, layout, name, read, kind):  # noqa: F811
    folder = Path(shutil.copytree(originals[layout], tmp_path / layout))
    _deep(folder, name, kind)
    with pytest.raises((zoo.CheckpointError, UserError)) as caught:
        read(folder)
    message = str(caught.value)
    assert name in message and "\n" not in message, message
    assert zoo.hf.is_hf_folder(folder) in (True, False)  # asked, not raised


def test_zoo_generate_from_a_folder_with_a_deep_config_is_one_line(originals, tmp_path, capsys):  # noqa: F811
    folder = Path(shutil.copytree(originals["hf"], tmp_path / "hf"))
    (folder / "config.json").write_text('{"model_type": "gpt2", "n_embd": ' + DEEP["list"] + "}")
    with pytest.raises(SystemExit) as stop:
        generate([f"ckpt_path={folder}", "prompt=hello"])
    assert stop.value.code == 2
    line = one_line(capsys)
    assert "config.json" in line and "nested too deep" in line


def test_a_recursion_error_in_a_parser_is_one_line_and_elsewhere_a_bug():
    import yaml

    deep_yaml = "a: " + "[" * 5000 + "]" * 5000
    parsers = (lambda: json.loads(DEEP["list"]), lambda: yaml.safe_load(deep_yaml), lambda: OmegaConf.create(deep_yaml))
    for parse in parsers:
        with pytest.raises(RecursionError) as caught:
            parse()
        line, code = one_line_of(caught.value)
        assert code == 2 and "nested too deep to parse" in str(line)

    def bug(n: int) -> int:
        return bug(n + 1)

    with pytest.raises(RecursionError) as caught:
        bug(0)
    assert one_line_of(caught.value) is None  # zoo's own recursion keeps its traceback


def test_a_checkpoints_stored_config_nested_too_deep_is_one_line(tmp_path):
    from tasks.cli.resuming import stored_config

    with pytest.raises(zoo.CheckpointError, match=r"resume=.*last\.ckpt: its stored config .*\(nested too deep"):
        stored_config("a: " + "[" * 5000 + "]" * 5000, tmp_path / "last.ckpt", tmp_path)


# ---- a run directory that cannot be written ------------------------------------------------------
def _read_only(*args, **kwargs):
    path = args[0] if args else kwargs.get("folder")
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))


def test_resume_of_a_run_on_a_read_only_disk_is_one_line(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    torch.save({"global_step": 3}, run / "checkpoints" / "last.ckpt")
    config = OmegaConf.create(
        {"resume": str(run), "hydra": {"run": {"dir": "unused"}, "output_subdir": ".hydra", "overrides": {"hydra": []}}}
    )
    monkeypatch.setattr(hydra_callbacks, "claim_fresh", _read_only)
    with pytest.raises(SystemExit) as stop:
        FreshRunDir(resume_key="ckpt_path", run_key="resume").on_run_start(config)
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"zoo: UserError: resume={run}: cannot write in the run directory")
    assert "Read-only file system" in err and "copy it to a folder you can write" in err
    assert config.hydra.run.dir == "unused"  # nothing of the run was changed


def test_hydras_own_write_into_a_read_only_run_dir_is_one_line(tmp_path, monkeypatch, capsys):
    import hydra.core.utils

    monkeypatch.setattr(hydra.core.utils, "_save_config", lambda cfg, name, folder: _read_only(folder / name))
    monkeypatch.setattr(sys, "argv", ["zoo-attention", "ckpt_path=x", "prompt=y", f"hydra.run.dir={tmp_path / 'run'}"])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as stop:
        verbs.attention()
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"zoo: UserError: cannot write {tmp_path / 'run' / '.hydra' / 'config.yaml'}: Read-only")
