"""zoo-generate and zoo-attention on bad input: free text passes through literally, every mistake
ends in one ``zoo: …`` line, with the verbs run in this process and as the real commands. The
checkpoints are untrained tasks of each kind, saved once for the module. The same limits in the
library: tests/test_generate_limits_library.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import lightning
import pytest
import torch
from conftest import tiny_model
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import zoo
from tasks import ClassifierTask, GeneratorTask, TranslatorTask, ZooTask
from tasks.cli.attention.maps import attention_report
from tasks.cli.console import quote_free_text
from tasks.cli.generate import respond
from tasks.cli.generate import run as generate_main
from tasks.cli.loading import load_task
from tasks.cli.schemas import conf_dir
from tasks.data.tokenizers import EOS, train_tokenizer, with_cls_sep
from tasks.errors import UserError

# ---- checkpoints for the verbs -------------------------------------------------------------------
LINES = [
    "def add(a, b):\n    return a + b",
    "Return the running event loop.",
    "three hundred and twelve",
    "trois cent douze",
    "a ${x} and $HOME {braces}",
] * 4


def _save(task: ZooTask, kind: str, path: Path) -> Path:
    """An untrained task saved as zoo-train saves it (plain data: config, tokenizer JSON, tensors)."""
    torch.save(
        {
            "state_dict": task.state_dict(),
            "hyper_parameters": dict(task.hparams),
            "tokenizer_json": task.tokenizer_json,
            "zoo_run": {"task": kind, "data_module": "LMDataModule", "data": {}, "config_yaml": ""},
            "pytorch-lightning_version": lightning.__version__,
            "global_step": 0,
            "epoch": 0,
        },
        path,
    )
    return path


def _model(arch: str, vocab_size: int, **overrides) -> dict:
    cfg = zoo.ModelConfig(
        arch=arch, vocab_size=vocab_size, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=32, **overrides
    )
    return cfg.to_dict()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("ckpts")
    bpe = train_tokenizer(LINES, "bpe", vocab_size=120)
    wordpiece = with_cls_sep(train_tokenizer(LINES, "wordpiece", vocab_size=120))
    unigram = train_tokenizer(LINES, "unigram", vocab_size=120)
    out = {
        "learned": _save(
            GeneratorTask(
                model=_model("decoder", bpe.get_vocab_size(), position="learned"),
                optimizer={},
                tokenizer_json=bpe.to_str(),
            ),
            "generator",
            folder / "g.ckpt",
        ),
        "rope": _save(
            GeneratorTask(
                model=_model("decoder", bpe.get_vocab_size(), position="rope"),
                optimizer={},
                tokenizer_json=bpe.to_str(),
            ),
            "generator",
            folder / "rope.ckpt",
        ),
        "classifier": _save(
            ClassifierTask(
                model=_model("encoder", wordpiece.get_vocab_size(), position="learned"),
                optimizer={},
                label_names=["x", "y"],
                tokenizer_json=wordpiece.to_str(),
            ),
            "classifier",
            folder / "c.ckpt",
        ),
        "translator": _save(
            TranslatorTask(
                model=_model("encoder_decoder", unigram.get_vocab_size(), position="t5_relative", eos_token_id=EOS),
                optimizer={},
                tokenizer_json=unigram.to_str(),
            ),
            "translator",
            folder / "t.ckpt",
        ),
    }
    (folder / "empty.ckpt").write_bytes(b"")
    (folder / "notes.ckpt").write_text("not a checkpoint\n")
    data = out["learned"].read_bytes()
    (folder / "cut.ckpt").write_bytes(data[: len(data) // 2])
    export = folder / "export"  # a zoo-export folder whose weights file was cut short
    zoo.save_pretrained(tiny_model(vocab_size=bpe.get_vocab_size()), export)
    bpe.save(str(export / "tokenizer.json"))
    weights = (export / "model.safetensors").read_bytes()
    (export / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    out["folder"] = folder
    return out


def generate(overrides: list[str]):
    """zoo-generate in this process: the real config, the command line's quoting, the verb function."""
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("generate", overrides=quote_free_text(overrides))
    return generate_main(cfg)


SPEED = re.compile(r"zoo: \d+ new tokens in [\d.]+ s \([\d,.]+ tokens/s\)(; compile=true: .*)?")
"""zoo-generate's report of how fast it decoded, on stderr after a generation (not an error)."""


def one_line(capsys) -> str:
    """The one stderr line a verb ended with, beside zoo-generate's speed line."""
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if not SPEED.fullmatch(line)]
    err = "\n".join(lines)
    assert err.startswith("zoo: ") and len(lines) == 1 and "Traceback" not in err, err
    return err


# ---- zoo-generate --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "prompt",
    [
        "${oc.env:HOME}",
        "${name} costs $5",
        "it's ${a.b} 'quoted'",
        "${",
        "a ${x",
        "print('a\\n')",
        "C:\\dir\\",
        "\\${x}",
    ],
)
def test_zoo_generate_takes_the_prompt_literally(prompt, ckpts, capsys):
    text = generate([f"ckpt_path={ckpts['rope']}", f"prompt={prompt}", "max_new_tokens=2", "do_sample=false"])
    assert text.startswith(prompt)
    assert capsys.readouterr().out.startswith(prompt)


def test_zoo_generate_says_in_one_line_where_the_positions_end(ckpts, capsys):
    text = generate([f"ckpt_path={ckpts['learned']}", "prompt=def add", "max_new_tokens=100"])
    assert text.startswith("def add")
    err = one_line(capsys)
    assert err.startswith("zoo: warning: generation stopped after") and "max_seq_len" in err


@pytest.mark.parametrize(
    "ckpt,overrides,message",
    [
        ("rope", ["prompt="], "UserError: prompt= gives no tokens; give some text"),
        ("rope", [], "prompt= is required"),
        (None, ["prompt=x"], "ckpt_path= is required"),
        ("empty.ckpt", ["prompt=x"], "CheckpointError: "),
        ("notes.ckpt", ["prompt=x"], "is not a checkpoint written by torch.save"),
        ("cut.ckpt", ["prompt=x"], "damaged or truncated"),
        ("folder", ["prompt=x"], "is a directory"),
        ("rope", ["prompt=def", "max_new_tokens=1000000000000"], "max_new_tokens=1000000000000 cannot fit"),
        ("rope", ["prompt=def", "top_p=0"], "ConfigError: top_p=0 must be in (0, 1]"),
        ("rope", ["prompt=def", "top_k=-1"], "top_k=-1"),
        ("rope", ["prompt=def", "temperature=-1"], "temperature=-1"),
        ("learned", ["prompt=" + "def add " * 20], "prompt=: the prompt is"),
        ("translator", ["prompt=three hundred", "num_beams=0"], "num_beams=0 must be a whole number >= 1"),
        ("translator", ["prompt=three hundred", "num_beams=100000"], "num_beams=100000"),
        ("rope", ["prompt=def", f"seed={2**70}"], f"seed={2**70} must be a whole number in [0, 4294967295]"),
        ("rope", ["prompt=def", "seed=-1"], "seed=-1 must be a whole number in [0, 4294967295]"),
        ("classifier", ["prompt=   "], "prompt= gives no tokens"),
        ("classifier", ["prompt=Return the loop", "top=0"], "top=0 must be a whole number >= 1"),
        ("classifier", ["prompt=" + "Return the loop " * 20], "this model numbers at most 32 positions"),
    ],
)
def test_zoo_generate_mistakes_end_in_one_line(ckpt, overrides, message, ckpts, capsys):
    path = [] if ckpt is None else [f"ckpt_path={ckpts[ckpt] if ckpt in ckpts else ckpts['folder'] / ckpt}"]
    with pytest.raises(SystemExit) as stop:
        generate(path + overrides)
    assert stop.value.code == 2
    assert message in one_line(capsys)


@pytest.mark.parametrize("ckpt,prompt", [("rope", "prompt=def add"), ("translator", "prompt=three hundred")])
def test_zoo_generate_compiled_says_what_it_says_eagerly(ckpt, prompt, ckpts, monkeypatch):
    """compile=true: a static cache and the compiled step (run eagerly here: tests/test_static_cache.py
    compiles for real), the same text."""
    monkeypatch.setattr(zoo.decoding, "compiled", lambda step: step)
    settings = [f"ckpt_path={ckpts[ckpt]}", prompt, "max_new_tokens=6", "do_sample=false"]
    assert generate(settings + ["compile=true"]) == generate(settings)


@pytest.mark.parametrize("ckpt,prompt", [("rope", "prompt=def add"), ("translator", "prompt=three hundred")])
def test_zoo_generate_with_int8_weights_and_kv_cache(ckpt, prompt, ckpts):
    text = generate([f"ckpt_path={ckpts[ckpt]}", prompt, "max_new_tokens=6", "quantize=int8", "kv_cache=int8"])
    assert isinstance(text, str) and (ckpt != "rope" or text.startswith("def add"))


@pytest.mark.parametrize(
    "setting,message",
    [
        ("quantize=int4", "quantize=int4: weights='int4' needs a CUDA device"),
        ("quantize=int3", "quantize=int3: weights='int3' is not a registered weight precision"),
        ("kv_cache=int4", "kv_cache=int4 is not a KV-cache format; choose int8"),
    ],
)
def test_zoo_generate_refuses_a_precision_in_one_line(setting, message, ckpts, capsys):
    with pytest.raises(SystemExit) as stop:
        generate([f"ckpt_path={ckpts['rope']}", "prompt=def", setting])
    assert stop.value.code == 2 and message in one_line(capsys)


def test_zoo_generate_refuses_a_compile_that_is_no_boolean(ckpts, capsys):
    with pytest.raises(SystemExit):
        generate([f"ckpt_path={ckpts['rope']}", "prompt=def", "compile=maybe"])
    assert "compile='maybe' must be true or false" in one_line(capsys)


def test_an_unknown_task_is_a_user_error(ckpts):
    task, _ = load_task(ckpts["rope"])
    with pytest.raises(UserError, match="task 'poet' is not one zoo-generate answers"):
        respond(task, "poet", OmegaConf.create({"prompt": "x"}))


# ---- zoo-attention -------------------------------------------------------------------------------
def attention(out: Path, *overrides: str) -> dict:
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("attention", overrides=quote_free_text(list(overrides), keys=("text", "target")))
    return attention_report(cfg, out)


def test_zoo_attention_takes_the_text_literally(ckpts, tmp_path):
    text = "a ${x} and ${oc.env:HOME}"
    summary = attention(tmp_path, f"ckpt_path={ckpts['rope']}", f"text={text}", "plots=false")
    assert "".join(summary["tokens"]).replace("␣", " ").replace("\\$", "$") == text  # labels escape $ for matplotlib
    assert f"text: {text!r}" in (tmp_path / "heads.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["model_dir=FOLDER", "text=x"], "has no config.json"),
        (["model_dir=FOLDER/export", "text=x"], "model.safetensors"),
        (["ckpt_path=FOLDER/empty.ckpt", "text=x"], "CheckpointError: "),
        (["ckpt_path=FOLDER/cut.ckpt", "text=x"], "damaged or truncated"),
        (["ckpt_path=FOLDER", "text=x"], "is a directory"),
        (["ckpt_path=FOLDER/g.ckpt", "text=x", "tokenizer_path=FOLDER/notes.ckpt"], "is not a tokenizer.json"),
        (["ckpt_path=FOLDER/g.ckpt", "text=x", "max_tokens=many"], "max_tokens='many' must be a whole number"),
        (["ckpt_path=FOLDER/g.ckpt", "text=x", "sink_threshold=high"], "sink_threshold='high' must be a number"),
    ],
)
def test_zoo_attention_mistakes_end_in_one_line(overrides, message, ckpts, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        attention(tmp_path / "out", *[o.replace("FOLDER", str(ckpts["folder"])) for o in overrides])
    assert stop.value.code == 2
    assert message in one_line(capsys)


# ---- the real commands ---------------------------------------------------------------------------
def _run(verb: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", f"tasks.cli.{verb}", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_real_zoo_generate_prints_a_literal_prompt_and_one_warning_line(ckpts, tmp_path):
    prompt = "${oc.env:HOME} ${name}"
    run = _run("generate", f"ckpt_path={ckpts['learned']}", f"prompt={prompt}", "max_new_tokens=100", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith(prompt)
    warning, speed = run.stderr.splitlines()  # one warning line, then how fast it decoded
    assert warning.startswith("zoo: warning: generation stopped after")
    assert SPEED.fullmatch(speed), speed


@pytest.mark.slow
@pytest.mark.parametrize(
    "verb,args,message",
    [
        ("generate", ["ckpt_path=CKPT", "prompt="], "zoo: UserError: prompt= gives no tokens; give some text"),
        ("generate", ["ckpt_path=FOLDER/cut.ckpt", "prompt=x"], "zoo: CheckpointError: "),
        ("attention", ["model_dir=FOLDER/export", "text=x"], "zoo: CheckpointError: "),
    ],
)
def test_real_commands_end_a_mistake_in_one_line(verb, args, message, ckpts, tmp_path):
    args = [a.replace("CKPT", str(ckpts["rope"])).replace("FOLDER", str(ckpts["folder"])) for a in args]
    run = _run(verb, *args, f"hydra.run.dir={tmp_path / 'out'}", cwd=tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.stderr.startswith(message) and run.stderr.count("\n") == 1


@pytest.mark.parametrize("ckpt", ["rope", "translator"])
@pytest.mark.parametrize("do_sample", ["true", "false"])
def test_zoo_generate_passes_the_repetition_controls_to_generate(ckpt, do_sample, ckpts, monkeypatch, capsys):
    seen: dict = {}
    real = zoo.ZooModel.generate

    def spy(self, *args, **kwargs):
        seen.update(kwargs)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(zoo.ZooModel, "generate", spy)
    generate(
        [
            f"ckpt_path={ckpts[ckpt]}",
            "prompt=def add",
            "max_new_tokens=4",
            f"do_sample={do_sample}",
            "repetition_penalty=1.5",
            "no_repeat_ngram_size=2",
        ]
    )
    assert seen["repetition_penalty"] == 1.5 and seen["no_repeat_ngram_size"] == 2
    with pytest.raises(SystemExit):
        generate([f"ckpt_path={ckpts[ckpt]}", "prompt=def add", "no_repeat_ngram_size=-1"])
    assert "no_repeat_ngram_size=-1" in one_line(capsys)
