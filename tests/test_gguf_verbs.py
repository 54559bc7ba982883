"""GGUF through the verbs, by the real commands on a tiny Llama-shaped generator trained by zoo-train:
``zoo-export format=gguf`` writes model.gguf (with config.json's record and the card) that transformers'
GGUF loading reads with the checkpoint's logits and tokenizer; a quantized export reports its greedy
agreement; a composition llama.cpp does not compute (ALiBi) is one line and leaves nothing; and
``zoo-train init_from=<file.gguf>`` trains from the file's model and tokenizer: its first loss is the
GGUF model's own loss on that batch."""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import OmegaConf
from test_export_safety import export_in_process
from test_reliability import one_line_error, run
from test_tasks import STEPS, TINY

import zoo
from tasks.cli.common import load_task
from tasks.cli.pretrained import GGUFFile

pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers' GGUF loading needs it

SHORT = [s for s in STEPS if not s.startswith("trainer.max_steps")]


@pytest.fixture(scope="module")
def llama_ckpt(tmp_path_factory) -> Path:
    """last.ckpt of a tiny Llama-shaped generator (RoPE, RMSNorm, SwiGLU) trained 4 steps by zoo-train."""
    tmp = tmp_path_factory.mktemp("llama")
    done = run("train", "experiment=gpt_generator", "model=llama-tiny", *TINY["gpt_generator"], *SHORT,
               "trainer.max_steps=4", "test=false", f"hydra.run.dir={tmp / 'run'}", cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp / "run" / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def exported(llama_ckpt, tmp_path_factory) -> tuple[Path, str]:
    """``zoo-export format=gguf`` of the tiny run (the real command): its folder and what it printed."""
    out = tmp_path_factory.mktemp("export") / "gguf"
    done = run("export", f"ckpt_path={llama_ckpt}", f"out={out}", "format=gguf", cwd=out.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done.stdout


def _hf(folder: Path) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file="model.gguf",
                                                                 dtype=torch.float32).eval()


@pytest.mark.slow
def test_export_gguf_reads_in_transformers_as_the_checkpoint(llama_ckpt, exported):
    out, said = exported
    assert f"exported {out}/model.gguf (llama.cpp llama, f32)" in said and "same greedy tokens" in said
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.gguf"]
    record = json.loads((out / "config.json").read_text())["zoo_export"]
    assert record["format"] == "gguf" and record["files"] == ["README.md", "config.json", "model.gguf"]
    assert "library_name: gguf" in (out / "README.md").read_text()
    task, _ = load_task(llama_ckpt)
    inputs = type(task.model).example_inputs(task.model.config)
    keep = inputs["attention_mask"].bool()
    with torch.no_grad():
        ours, theirs = task.model(**inputs), _hf(out)(**inputs).logits
    assert (ours[keep] - theirs[keep]).abs().max().item() < 1e-4
    text = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)"
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out, gguf_file="model.gguf")
    assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == task.tokenizer.encode(text).ids
    got = zoo.read_gguf(out / "model.gguf")
    assert got.tokenizer.encode(text).ids == task.tokenizer.encode(text).ids
    specials = task.special_tokens
    assert {role: got.specials[role] for role in ("bos", "eos", "pad")} == {
        "bos": specials.bos, "eos": specials.eos, "pad": specials.pad}


@pytest.mark.slow
def test_a_quantized_export_reports_its_greedy_agreement(llama_ckpt, exported, tmp_path, monkeypatch, capsys):
    out = tmp_path / "q8"
    export_in_process(monkeypatch, f"ckpt_path={llama_ckpt}", f"out={out}", "format=gguf", "gguf.dtype=q8_0")
    said = capsys.readouterr().out  # (in this process: transformers is imported once)
    assert "(llama.cpp llama, q8_0)" in said and ("same greedy tokens" in said or "greedy tokens: the first" in said)
    assert (out / "model.gguf").stat().st_size < (exported[0] / "model.gguf").stat().st_size


@pytest.mark.slow
def test_a_composition_llama_cpp_lacks_is_one_line_and_writes_nothing(llama_ckpt, tmp_path):
    checkpoint = zoo.load_weights_file(llama_ckpt)
    checkpoint["hyper_parameters"]["model"]["position"] = "alibi"  # no weights of its own: the same tensors
    alibi = tmp_path / "alibi.ckpt"
    torch.save(checkpoint, alibi)
    out = tmp_path / "out"
    done = run("export", f"ckpt_path={alibi}", f"out={out}", "format=gguf", cwd=tmp_path)
    one_line_error(done, "model.position", "format=safetensors")
    bad = run("export", f"ckpt_path={llama_ckpt}", f"out={out}", "format=gguf", "gguf.dtype=q2_k", cwd=tmp_path)
    one_line_error(bad, "gguf.dtype='q2_k'", "q8_0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alibi.ckpt"]  # no folder, no staged sibling


def _first_train_loss(run_dir: Path) -> float:
    with open(run_dir / "logs" / "metrics.csv", newline="") as f:
        return next(float(row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss"))


@pytest.mark.slow
def test_init_from_gguf_starts_from_the_files_model(exported, tmp_path):
    gguf = exported[0] / "model.gguf"
    run_dir = tmp_path / "run"
    data = [s for s in TINY["gpt_generator"] if not s.startswith(("model.", "data.vocab_size"))]
    done = run("train", "experiment=gpt_generator", f"init_from={gguf}", *data, *SHORT, "trainer.max_steps=2",
               "test=false", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"init_from {gguf}: the model is the file's decoder" in done.stdout
    source = GGUFFile(gguf, str(gguf))
    cfg = OmegaConf.load(run_dir / "config.yaml")  # the run's data, rebuilt: its first batch is seeded
    datamodule = instantiate(cfg.data, _convert_="all", _recursive_=False)
    datamodule.use_tokenizer(*source.tokenizer())
    datamodule.setup("fit")
    batch = next(iter(datamodule.train_dataloader()))
    with torch.no_grad():
        logits = source.model()(batch["input_ids"])
    direct = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100).item()
    assert abs(_first_train_loss(run_dir) - direct) < 1e-4 * direct
