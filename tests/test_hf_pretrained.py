"""The one-command path with Hugging Face models: ``zoo-train init_from=<HF folder>`` for each of the
four experiments, then ``zoo-export format=hf`` and transformers' Auto classes on the result.

The folders are built at tiny size (tests/hf_pretrained_folders.py): random transformers models
saved with ``save_pretrained`` beside a tokenizer trained with ``tokenizers`` on the experiment's own
data source and saved with ``PreTrainedTokenizerFast.save_pretrained`` (so the files are exactly
transformers' own)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import zoo
from tasks.cli.loading import load_task
from tasks.data import DATA_MODULES
from tasks.data.tokenizers import read_hf_tokenizer

transformers = pytest.importorskip("transformers")
from hf_pretrained_folders import DATA, STEPS, _bert, _gpt2, _llama, _seeded, _t5, run  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # minutes: python -m pytest -m heavy (CI runs them)


# ---- folders -------------------------------------------------------------------------------------
FOLDERS = {"gpt2": _gpt2, "llama": _llama, "qwen2": lambda p: _llama(p, qwen2=True), "bert": _bert, "t5": _t5}
CASES = [
    ("gpt_generator", "gpt2"),
    ("gpt_generator", "llama"),
    ("gpt_generator", "qwen2"),
    ("bert_mlm", "bert"),
    ("bert_classifier", "bert"),
    ("t5_translator", "t5"),
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {name: make(root / name) for name, make in FOLDERS.items()}


# ---- the real commands -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(folders, tmp_path_factory) -> dict[tuple[str, str], Path]:
    """Each case trained for 2 steps with an lr so small that the weights stay the folder's."""
    runs = {}
    for experiment, family in CASES:
        run_dir = tmp_path_factory.mktemp(f"{experiment}-{family}")
        done = run(
            "train",
            f"experiment={experiment}",
            f"init_from={folders[family]}",
            *DATA[experiment],
            *STEPS,
            "trainer.max_steps=2",
            "optimizer.lr=1e-12",
            f"hydra.run.dir={run_dir}",
            cwd=run_dir,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"init_from {folders[family]}: the model is the folder's" in done.stdout
        runs[experiment, family] = run_dir
    return runs


@pytest.mark.parametrize(("experiment", "family"), CASES)
def test_a_run_started_from_a_folder_holds_its_weights_and_tokenizer(trained, folders, experiment, family):
    task, _ = load_task(trained[experiment, family] / "checkpoints" / "last.ckpt")
    folder = folders[family]
    model = task.model
    inputs = type(model).example_inputs(model.config)
    given = {n: inputs[n] for n in type(model).input_names}
    with torch.no_grad():
        ours = model(**given)  # an encoder's hidden states, else logits
        if experiment.startswith("bert"):
            theirs = transformers.BertModel.from_pretrained(folder).eval()(**given).last_hidden_state
        else:
            theirs = _auto(folder).eval()(**given).logits
    keep = inputs["attention_mask"].bool() if ours.shape[1] == inputs["attention_mask"].shape[1] else ...
    torch.testing.assert_close(ours[keep], theirs[keep], atol=1e-4, rtol=1e-4)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    text = "def add(a, b): return a + b" if experiment == "gpt_generator" else "forty-two"
    assert task.tokenizer.encode(text).ids == hf_tokenizer(text)["input_ids"]


def _auto(folder: Path):
    architecture = transformers.AutoConfig.from_pretrained(folder).architectures[0]
    return getattr(transformers, architecture).from_pretrained(folder)


def test_the_first_loss_is_the_one_transformers_computes(trained, folders):
    """The weights really arrived: the loss logged at the first step equals transformers' loss on
    that batch (the data module rebuilt from the checkpoint, its first training batch)."""
    run_dir = trained["gpt_generator", "gpt2"]
    with (run_dir / "logs" / "metrics.csv").open() as f:
        first = next(float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss"))
    task, info = load_task(run_dir / "checkpoints" / "last.ckpt")
    data = DATA_MODULES.get(info["data_module"])(**info["data"])
    data.use_tokenizer(*read_hf_tokenizer(folders["gpt2"]))
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    hf = transformers.GPT2LMHeadModel.from_pretrained(folders["gpt2"]).eval()
    with torch.no_grad():
        logits = hf(batch["input_ids"]).logits
    loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
    assert abs(loss.item() - first) < 1e-4, (loss.item(), first)


@pytest.mark.parametrize(("experiment", "family"), CASES)
def test_export_hf_loads_in_transformers_with_the_same_logits(trained, experiment, family, tmp_path):
    run_dir = trained[experiment, family]
    out = tmp_path / "exported"
    done = run("export", f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}", "format=hf", f"out={out}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "same greedy tokens" in done.stdout or experiment.startswith("bert")
    task, _ = load_task(run_dir / "checkpoints" / "last.ckpt")
    hf = _auto(out).eval()
    model = task.model
    inputs = type(model).example_inputs(model.config)
    with torch.no_grad():
        ours = task.export_head(model(**{n: inputs[n] for n in type(model).input_names}), inputs["attention_mask"])
        theirs = hf(**{n: inputs[n] for n in type(model).input_names}).logits
    keep = inputs["attention_mask"].bool() if ours.dim() == 3 and ours.shape[1] == inputs["input_ids"].shape[1] else ...
    torch.testing.assert_close(ours[keep], theirs[keep], atol=1e-4, rtol=1e-4)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = "def add(a, b): return a + b" if experiment == "gpt_generator" else "forty-two"
    assert tokenizer(text)["input_ids"] == task.export_tokenizer().encode(text).ids
    if experiment == "bert_classifier":
        assert [hf.config.id2label[i] for i in range(len(task.label_names))] == task.label_names
    assert (out / "README.md").is_file()


def test_a_conflicting_model_override_is_refused_in_one_line(folders, tmp_path):
    done = run(
        "train",
        "experiment=gpt_generator",
        f"init_from={folders['gpt2']}",
        "model.d_model=64",
        *DATA["gpt_generator"],
        *STEPS,
        "trainer.max_steps=1",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("zoo: ")]
    assert len(errors) == 1 and "model.d_model=64" in errors[0] and "d_model=32" in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_a_harmless_override_applies(folders, tmp_path):
    run_dir = tmp_path / "run"
    done = run(
        "train",
        "experiment=gpt_generator",
        f"init_from={folders['gpt2']}",
        "model.attn_dropout=0.25",
        *DATA["gpt_generator"],
        *STEPS,
        "trainer.max_steps=1",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    task, _ = load_task(run_dir / "checkpoints" / "last.ckpt")
    assert task.model.config.attn_dropout == 0.25 and task.model.config.d_model == 32


@pytest.mark.parametrize(("override", "needle"), [("model.position=alibi", "position=alibi")])
def test_export_check_hf_stops_before_training(override, needle, tmp_path):
    done = run(
        "train",
        "experiment=gpt_generator",
        override,
        "export_check=hf",
        *DATA["gpt_generator"],
        *STEPS,
        "trainer.max_steps=1",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("zoo: ")]
    assert len(errors) == 1 and needle in errors[0] and "format=onnx" in errors[0], done.stderr[-2000:]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_export_hf_of_an_alibi_run_is_refused_and_writes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    done = run(
        "train",
        "experiment=gpt_generator",
        "model.position=alibi",
        *DATA["gpt_generator"],
        *STEPS,
        "data.vocab_size=300",
        "model.d_model=32",
        "model.n_heads=2",
        "trainer.max_steps=1",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "exported"
    done = run("export", f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}", "format=hf", f"out={out}", cwd=tmp_path)
    assert done.returncode == 2 and "position=alibi" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_run_started_from_a_folder_resumes_as_the_same_run(trained, tmp_path):
    """resume= of such a run needs no folder: its config holds the folder's model, its checkpoint the
    tokenizer and its special ids (T5's eos is 1, not zoo's 3)."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained["t5_translator", "t5"], run_dir)
    done = run("train", f"resume={run_dir}", "trainer.max_steps=4", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 4
    assert checkpoint["tokenizer_specials"]["eos"] == 1 and checkpoint["hyper_parameters"]["model"]["eos_token_id"] == 1


def test_a_sentence_transformers_folder_reads_as_its_bert(tmp_path):
    """sentence-transformers keeps the BertModel at the folder's root beside its own files."""
    config = transformers.BertConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    bert = _seeded(transformers.BertModel, config)
    bert.save_pretrained(tmp_path)
    (tmp_path / "modules.json").write_text(
        '[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]'
    )
    (tmp_path / "1_Pooling").mkdir()
    pooling = '{"word_embedding_dimension": 32, "pooling_mode_mean_tokens": true}'
    (tmp_path / "1_Pooling" / "config.json").write_text(pooling)
    model = zoo.from_hf(tmp_path)
    ids = torch.randint(0, 99, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), bert(ids).last_hidden_state, atol=1e-4, rtol=1e-4)
