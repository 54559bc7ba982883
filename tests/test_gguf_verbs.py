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
from test_export_safety import assert_one_line_error, export_in_process
from test_reliability import one_line_error, run
from test_tasks import STEPS, TINY
from tokenizers import Tokenizer, models

import zoo
from tasks.cli.loading import load_task
from tasks.cli.pretrained import GGUFFile
from tasks.data.tokenizers import Specials, read_hf_tokenizer

pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers' GGUF loading needs it

SHORT = [s for s in STEPS if not s.startswith("trainer.max_steps")]


@pytest.fixture(scope="module")
def llama_ckpt(tmp_path_factory) -> Path:
    """last.ckpt of a tiny Llama-shaped generator (RoPE, RMSNorm, SwiGLU) trained 4 steps by zoo-train."""
    tmp = tmp_path_factory.mktemp("llama")
    done = run(
        "train",
        "experiment=gpt_generator",
        "model=llama-tiny",
        *TINY["gpt_generator"],
        *SHORT,
        "trainer.max_steps=4",
        "test=false",
        f"hydra.run.dir={tmp / 'run'}",
        cwd=tmp,
    )
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
        return transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file="model.gguf", dtype=torch.float32
        ).eval()


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
        "bos": specials.bos,
        "eos": specials.eos,
        "pad": specials.pad,
    }


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
    done = run(
        "train",
        "experiment=gpt_generator",
        f"init_from={gguf}",
        *data,
        *SHORT,
        "trainer.max_steps=2",
        "test=false",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
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


# ---- a GGUF file (or HF folder) where the verbs take a checkpoint; its chat template; adapter.save=only ----
TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>"


@pytest.fixture(scope="module")
def templated(exported, tmp_path_factory) -> Path:
    """The tiny export rewritten with a chat template (as a pretrained instruct model's file has one)."""
    got = zoo.read_gguf(exported[0] / "model.gguf")
    path = tmp_path_factory.mktemp("templated") / "chat.gguf"
    zoo.to_gguf(
        got.model, path, tokenizer=got.tokenizer, specials=got.specials, add_bos=got.add_bos, chat_template=TEMPLATE
    )
    return path


@pytest.fixture(scope="module")
def adapter_only(templated, tmp_path_factory) -> Path:
    """last.ckpt of ``zoo-train init_from=<chat.gguf> adapter=lora adapter.save=only`` (2 steps)."""
    tmp = tmp_path_factory.mktemp("adapter_only")
    data = [s for s in TINY["gpt_generator"] if not s.startswith(("model.", "data.vocab_size"))]
    done = run(
        "train",
        "experiment=gpt_generator",
        f"init_from={templated}",
        "adapter=lora",
        "adapter.save=only",
        *data,
        *SHORT,
        "trainer.max_steps=2",
        "test=false",
        f"hydra.run.dir={tmp / 'run'}",
        cwd=tmp,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp / "run" / "checkpoints" / "last.ckpt"


@pytest.mark.slow
def test_an_adapter_only_checkpoint_names_its_gguf_base_and_reads_it_back(adapter_only, templated, tmp_path):
    stored = zoo.load_weights_file(adapter_only)
    ref = stored["zoo_base"]
    assert ref["format"] == "gguf" and ref["source"] == str(templated.resolve())
    assert ref["keys"] and not set(ref["keys"]) & set(stored["state_dict"])  # the base stays in the file
    task, _ = load_task(adapter_only)  # put back from the GGUF file, checked against its sha256
    base = zoo.from_gguf(templated).state_dict()
    held = {k: base[k.removeprefix("model.")] for k in ref["keys"]}  # the vocabulary's rows padded as the preset's
    assert all(torch.equal(task.state_dict()[k][: len(v)], v) for k, v in held.items())
    table = task.model.embed.weight
    assert table.shape[0] % 128 == 0 and table[len(base["embed.weight"]) :].eq(0).all()
    moved = tmp_path / "elsewhere.gguf"
    templated.rename(moved)
    try:
        done = run("generate", f"ckpt_path={adapter_only}", "prompt=def", "max_new_tokens=2", cwd=tmp_path)
        one_line_error(done, "adapter.save=only", str(templated.resolve()))
    finally:
        moved.rename(templated)


@pytest.mark.slow
def test_the_chat_template_survives_training_into_the_exports(adapter_only, tmp_path):
    stored = zoo.load_weights_file(adapter_only)
    assert stored["tokenizer_specials"]["chat_template"] == TEMPLATE
    out = tmp_path / "gguf"
    done = run("export", f"ckpt_path={adapter_only}", f"out={out}", "format=gguf", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert zoo.read_gguf(out / "model.gguf").chat_template == TEMPLATE
    hf = tmp_path / "hf"
    done = run("export", f"ckpt_path={adapter_only}", f"out={hf}", "format=hf", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert transformers.AutoTokenizer.from_pretrained(hf).chat_template == TEMPLATE


@pytest.mark.slow
def test_generate_eval_and_attention_take_a_gguf_file(templated, tmp_path):
    got = zoo.read_gguf(templated)
    prompt = "def fib(n):"
    ids = got.tokenizer.encode(prompt).ids
    with torch.no_grad():
        greedy = got.model.generate(torch.tensor([ids]), 6, do_sample=False)[0].tolist()
    done = run(
        "generate", f"ckpt_path={templated}", f"prompt={prompt}", "max_new_tokens=6", "do_sample=false", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == got.tokenizer.decode(greedy, skip_special_tokens=True).strip()
    refused = run("evaluate", f"ckpt_path={templated}", f"hydra.run.dir={tmp_path / 'refused'}", cwd=tmp_path)
    one_line_error(refused, f"ckpt_path={templated}", "+data=")
    data = [
        "+data=stdlib_code",
        "data.source_args.max_files=40",
        "data.seq_len=32",
        "data.batch_size=2",
        "trainer.limit_test_batches=2",
    ]
    evaluated = run("evaluate", f"ckpt_path={templated}", *data, f"hydra.run.dir={tmp_path / 'eval'}", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert 1 < metrics["test/ppl"] < 10 * got.model.config.vocab_size
    drawn = run(
        "attention",
        f"ckpt_path={templated}",
        f"prompt={prompt}",
        "plots=false",
        f"hydra.run.dir={tmp_path / 'attention'}",
        cwd=tmp_path,
    )
    assert drawn.returncode == 0, drawn.stderr[-3000:]
    heads = (tmp_path / "attention" / "heads.md").read_text()
    assert f"text: {prompt!r}" in heads  # the text given as prompt= (not text=, its older name)
    assert heads.count("\n") > got.model.config.n_layers * got.model.config.n_heads


def test_specials_keep_a_chat_template_and_read_old_records(tmp_path):
    record = Specials(eos=3, chat_template=TEMPLATE).record()
    assert Specials.from_record(record).chat_template == TEMPLATE
    old = {k: v for k, v in record.items() if k != "chat_template"}  # a checkpoint from before the field
    assert Specials.from_record(old) == Specials(eos=3)
    tokenizer = Tokenizer(models.WordLevel({"a": 0, "</s>": 1}, unk_token="a"))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 1}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    assert read_hf_tokenizer(tmp_path)[1].chat_template == TEMPLATE
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")  # transformers 5 writes it there
    assert read_hf_tokenizer(tmp_path)[1].chat_template == "{{ messages }}"


@pytest.mark.slow
def test_llama_cpp_runs_the_export_as_the_checkpoint(llama_ckpt, exported):
    """Where llama-cpp-python is built, zoo-export's check runs llama.cpp itself on the staged file."""
    llama_cpp = pytest.importorskip("llama_cpp")
    out, said = exported
    assert "llama.cpp runs it: max abs diff" in said and said.count("same greedy tokens") == 2
    task, _ = load_task(llama_ckpt)
    prompt = type(task.model).example_inputs(task.model.config)["input_ids"][1]
    llm = llama_cpp.Llama(str(out / "model.gguf"), n_ctx=64, logits_all=True, verbose=False)
    llm.eval(prompt.tolist())
    theirs = torch.tensor(llm.scores[: len(prompt)])
    llm.close()
    with torch.no_grad():
        ours = task.model(prompt[None])[0]
    assert (ours - theirs).abs().max().item() < 0.02 * ours.abs().max().item()  # llama.cpp's f16 KV cache
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


@pytest.mark.slow
def test_an_export_llama_cpp_disagrees_with_is_one_line_and_writes_nothing(llama_ckpt, tmp_path, monkeypatch, capsys):
    pytest.importorskip("llama_cpp")
    monkeypatch.setattr("tasks.cli.export.gguf.LLAMA_CPP_TOLERANCE", {"f32": 0.0})  # no rounding allowed
    out = tmp_path / "strict"
    with pytest.raises(SystemExit) as stop:
        export_in_process(monkeypatch, f"ckpt_path={llama_ckpt}", f"out={out}", "format=gguf")
    assert stop.value.code == 2 and not out.exists() and not list(tmp_path.iterdir())  # no staged folder left
    err = capsys.readouterr().err
    assert_one_line_error(err)
    assert "llama.cpp's run of the f32 file gives logits" in err
