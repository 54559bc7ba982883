"""The application end to end at tiny size: compose the real configs, shrink them, train, resume,
reload, export, generate; plus the data modules' properties."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import zoo
from tasks import TASKS
from tasks.cli.loading import load_task
from tasks.cli.schemas import conf_dir
from tasks.cli.train.training import train

TINY = {  # shrink each experiment to seconds: small data, a few steps
    "gpt_generator": [
        "data.source_args.max_files=40",
        "data.vocab_size=300",
        "data.seq_len=32",
        "model.d_model=32",
        "model.n_heads=2",
    ],
    "bert_classifier": [
        "data.max_records=400",
        "data.vocab_size=300",
        "data.seq_len=48",
        "model.d_model=32",
        "model.n_heads=2",
    ],
    "bert_mlm": [
        "data.max_records=400",
        "data.vocab_size=300",
        "data.seq_len=48",
        "model.d_model=32",
        "model.n_heads=2",
    ],
    "t5_translator": [
        "data.source_args.n=400",
        "data.vocab_size=200",
        "data.seq_len=32",
        "model.d_model=32",
        "model.n_heads=2",
        "model.d_ff=64",
        "task.max_new_tokens=12",
    ],
}
STEPS = [
    "trainer.max_steps=6",
    "trainer.val_check_interval=3",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "trainer.num_sanity_val_steps=0",
    "trainer.log_every_n_steps=1",
    "callbacks.rich_progress_bar=null",
    "callbacks.rich_model_summary=null",
    "callbacks.throughput.window=2",
]


def compose_train(experiment: str, out: Path, *extra: str):
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose(
            "train",
            overrides=[f"experiment={experiment}", *TINY[experiment], *STEPS, f"paths.output_dir={out}", *extra],
        )


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One tiny training run per experiment, shared by the tests below."""
    out = {}
    for experiment in TINY:
        run_dir = tmp_path_factory.mktemp(experiment)
        metric = train(compose_train(experiment, run_dir))
        assert metric is not None and metric == metric  # the monitored metric came back, not NaN
        out[experiment] = run_dir
    return out


@pytest.mark.parametrize(
    "experiment,metrics",
    [
        ("gpt_generator", ["val/loss", "val/ppl", "test/ppl", "perf/tokens_per_s"]),
        ("bert_classifier", ["val/acc", "val/f1", "test/acc", "test/f1"]),
        ("bert_mlm", ["val/loss", "val/masked_acc", "test/masked_acc"]),
        ("t5_translator", ["val/loss", "val/bleu", "val/chrf", "test/chrf"]),
    ],
)
def test_each_experiment_trains_logs_and_checkpoints(runs, experiment, metrics):
    run = runs[experiment]
    logged = (run / "logs" / "metrics.csv").read_text().splitlines()[0].split(",")
    for name in metrics:
        assert name in logged, f"{name} not logged; columns: {logged}"
    assert (run / "tokenizer.json").is_file() and (run / "config.yaml").is_file()
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)  # plain data and tensors only
    assert ckpt["global_step"] == 6
    assert isinstance(ckpt["zoo_run"]["config_yaml"], str) and "_orig_mod." not in "".join(ckpt["state_dict"])
    assert all(not isinstance(v, dict) or "_target_" not in v for v in ckpt["hyper_parameters"].values())


def test_checkpoints_load_without_conf(runs, tmp_path, monkeypatch):
    ckpt = runs["gpt_generator"] / "checkpoints" / "last.ckpt"
    monkeypatch.chdir(tmp_path)  # no conf/ here
    task = TASKS.get("generator").load_from_checkpoint(ckpt, map_location="cpu", weights_only=True).eval()
    again, _ = load_task(ckpt)
    x = torch.randint(0, task.model.config.vocab_size, (2, 9))
    torch.testing.assert_close(task.model(x), again.model(x))
    assert task.tokenizer.get_vocab_size() == task.model.config.vocab_size


def test_resume_continues_at_the_right_step(runs, tmp_path):
    last = runs["gpt_generator"] / "checkpoints" / "last.ckpt"
    cfg = compose_train("gpt_generator", tmp_path, f"ckpt_path={last}", "trainer.max_steps=9", "test=false")
    train(cfg)
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 9
    with (tmp_path / "logs" / "metrics.csv").open() as f:
        steps = [int(row["step"]) for row in csv.DictReader(f)]
    assert min(steps) >= 6 and max(steps) <= 9  # the resumed run logged only the steps after the checkpoint


def test_classifier_can_start_from_a_masked_lm_run(runs, tmp_path, capsys):
    mlm_ckpt = runs["bert_mlm"] / "checkpoints" / "last.ckpt"
    cfg = compose_train("bert_classifier", tmp_path, f"init_from={mlm_ckpt}", "trainer.max_steps=2", "test=false")
    train(cfg)
    assert "tensors loaded" in capsys.readouterr().out
    mlm, _ = load_task(mlm_ckpt)
    clf, _ = load_task(tmp_path / "checkpoints" / "last.ckpt")
    assert clf.tokenizer.to_str() == mlm.tokenizer.to_str()  # the tokenizer came along with the weights


@pytest.mark.parametrize("experiment", list(TINY))
def test_safetensors_export_reloads_identically(runs, experiment, tmp_path):
    from tasks.cli.export.formats import export_safetensors

    task, info = load_task(runs[experiment] / "checkpoints" / "last.ckpt")
    assert export_safetensors(task, info, tmp_path) == 0.0
    assert {"config.json", "config.yaml", "model.safetensors", "tokenizer.json"} <= {p.name for p in tmp_path.iterdir()}
    reloaded = zoo.load_pretrained(tmp_path)
    assert reloaded.config == task.model.config


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["gpt_generator", "bert_classifier", "t5_translator"])
def test_onnx_export_matches_pytorch(runs, experiment, tmp_path):
    pytest.importorskip("onnxruntime")
    from tasks.cli.export.formats import export_onnx

    task, info = load_task(runs[experiment] / "checkpoints" / "last.ckpt")
    assert export_onnx(task, info, tmp_path, opset=18) < 1e-4


@pytest.mark.parametrize(
    "experiment,prompt,expect",
    [
        ("gpt_generator", "def fib(n):", "def fib(n):"),
        ("t5_translator", "twenty-one", None),
        ("bert_classifier", "Return the event loop.", "\t"),
        ("bert_mlm", "Return the <mask> loop.", "<mask> #1:"),
    ],
)
def test_zoo_generate_answers_by_task(runs, experiment, prompt, expect):
    from omegaconf import OmegaConf

    from tasks.cli.generate import respond

    task, info = load_task(runs[experiment] / "checkpoints" / "last.ckpt")
    cfg = OmegaConf.create(
        dict(
            prompt=prompt,
            max_new_tokens=8,
            do_sample=True,
            temperature=0.8,
            top_k=50,
            top_p=0.95,
            num_beams=2,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            top=3,
            seed=0,
            compile=False,
        )
    )
    text = respond(task, info["task"], cfg)
    assert isinstance(text, str)
    if expect is not None:
        assert expect in text
    if experiment == "bert_classifier":
        labels = [line.split("\t")[0] for line in text.splitlines()]
        assert len(labels) == 3 and set(labels) <= set(task.label_names)


def test_incompatible_choices_fail_at_composition(tmp_path):
    cfg = compose_train("bert_classifier", tmp_path, "model/arch=decoder")
    with pytest.raises(zoo.ConfigError, match="arch='decoder' cannot be trained by ClassifierTask"):
        train(cfg)
    assert not (tmp_path / "tokenizer.json").exists()  # stopped before any data was read
    cfg = compose_train("gpt_generator", tmp_path, "model.n_heads=5")
    with pytest.raises(zoo.ConfigError, match="n_heads=5 does not divide d_model=32"):
        train(cfg)
    cfg = compose_train("gpt_generator", tmp_path, "data.seq_len=512")
    with pytest.raises(zoo.ConfigError, match="data.seq_len=512 is longer than the learned position table"):
        train(cfg)


def test_typed_model_overrides_fail_at_composition(tmp_path):
    from hydra.errors import ConfigCompositionException
    from omegaconf.errors import ValidationError

    with pytest.raises(ConfigCompositionException, match="model.n_layers=four") as error:
        compose_train("gpt_generator", tmp_path, "model.n_layers=four")
    assert isinstance(error.value.__cause__, ValidationError)  # the typed schema refused it, not a later step


def _run(args: list[str], cwd: Path, timeout: int = 300, warnings: str = "ignore") -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": warnings}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_real_commands_multirun_eval_generate_export(tmp_path):
    """The console verbs as a user runs them: a 2-job sweep, then eval / generate / export on it."""
    sweep = _run(
        [
            "tasks.cli.train",
            "-m",
            "experiment=gpt_generator",
            "model/position=rope,alibi",
            *TINY["gpt_generator"],
            *STEPS,
            "hydra.sweep.dir=" + str(tmp_path / "sweep"),
        ],
        tmp_path,
    )
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    jobs = sorted((tmp_path / "sweep").glob("[0-9]"))
    assert [j.name for j in jobs] == ["0", "1"]
    configs = [(j / "config.yaml").read_text() for j in jobs]
    assert "position: rope" in configs[0] and "position: alibi" in configs[1]
    ckpt = jobs[1] / "checkpoints" / "last.ckpt"

    evaluated = _run(
        [
            "tasks.cli.evaluate",
            f"ckpt_path={ckpt}",
            f"hydra.run.dir={tmp_path / 'eval'}",
            "trainer.limit_test_batches=2",
        ],
        tmp_path,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    fp32 = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert "test/ppl" in fp32
    int8 = _run(
        [
            "tasks.cli.evaluate",
            f"ckpt_path={ckpt}",
            f"hydra.run.dir={tmp_path / 'eval8'}",
            "trainer.limit_test_batches=2",
            "quantize=int8",
            "kv_cache=int8",
        ],
        tmp_path,
    )
    assert int8.returncode == 0, int8.stderr[-3000:]
    int8_ppl = json.loads((tmp_path / "eval8" / "metrics.json").read_text())["test/ppl"]
    assert int8_ppl != fp32["test/ppl"] and int8_ppl == pytest.approx(fp32["test/ppl"], rel=0.05)

    generated = _run(["tasks.cli.generate", f"ckpt_path={ckpt}", "prompt=def fib(n):", "max_new_tokens=5"], tmp_path)
    assert generated.returncode == 0, generated.stderr[-3000:]
    assert generated.stdout.startswith("def fib(n):")

    exported = _run(["tasks.cli.export", f"ckpt_path={ckpt}", "format=safetensors", f"out={tmp_path / 'st'}"], tmp_path)
    assert exported.returncode == 0 and "max abs diff 0" in exported.stdout, exported.stderr[-3000:]
    if importlib.util.find_spec("onnxruntime"):  # with the library's warnings shown: none reaches the user
        onnx = _run(
            ["tasks.cli.export", f"ckpt_path={ckpt}", "format=onnx", f"out={tmp_path / 'onnx'}"],
            tmp_path,
            warnings="default",
        )
        assert onnx.returncode == 0 and "onnxruntime vs PyTorch" in onnx.stdout, onnx.stderr[-3000:]
        assert onnx.stderr == "", onnx.stderr[-3000:]  # no torchvision lines, no axis-name notes

    bad = _run(["tasks.cli.train", "experiment=t5_translator", "model/arch=decoder"], tmp_path)
    assert bad.returncode == 2 and "zoo: ConfigError" in bad.stderr and "TranslatorTask" in bad.stderr
