"""The smaller things a careful reader trips on (issue 37, item 8): zoo-generate decodes a checkpoint as
its task does and as the HF export's generation_config.json says; zoo-eval's metrics lie beside the
run they measure and its table never cuts a path; the closing table names the optimizer and the
adapter; init_from tells new adapter matrices from missing weights."""

import json
import shutil
import sys

import pytest
from conftest import tiny_config
from hydra import compose, initialize_config_dir
from real_commands import run

from tasks.base import DECODING
from tasks.cli import verbs
from tasks.cli.export.hf import hf_generation
from tasks.cli.generate import settings_of
from tasks.cli.loading import load_task
from tasks.cli.schemas import conf_dir
from tasks.cli.train.training import setup_rows
from tasks.generator import GeneratorTask
from tasks.run.init_from import loaded_line


def generate_config(*overrides: str):
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose("generate", overrides=["ckpt_path=x", "prompt=p", *overrides])


def test_unset_settings_are_the_tasks_and_those_given_win(gpt_base):
    task, _ = load_task(gpt_base)
    settings = settings_of(task, generate_config())
    assert {k: settings[k] for k in DECODING} == task.decoding_settings()
    assert (settings["max_new_tokens"], settings["do_sample"], settings["temperature"]) == (
        task.sample_tokens,
        True,
        task.sample_temperature,
    )
    given = settings_of(task, generate_config("max_new_tokens=5", "do_sample=false", "top_k=0"))
    assert (given["max_new_tokens"], given["do_sample"], given["top_k"]) == (5, False, 0)
    assert given["temperature"] == task.sample_temperature


@pytest.mark.slow
def test_the_hf_export_writes_what_zoo_generate_decodes_with(gpt_base, tmp_path, monkeypatch):
    out = tmp_path / "hf"
    monkeypatch.setattr(sys, "argv", ["zoo-export", f"ckpt_path={gpt_base}", f"out={out}", "format=hf"])
    verbs.export()
    written = json.loads((out / "generation_config.json").read_text())
    task, _ = load_task(gpt_base)
    expected = hf_generation(settings_of(task, generate_config()))
    assert {k: written[k] for k in expected} == expected
    assert written["do_sample"] is True and written["top_k"] == 0 and written["top_p"] == 1.0


@pytest.mark.slow
def test_zoo_eval_writes_its_metrics_beside_the_run_and_shows_the_whole_path(gpt_base, tmp_path, monkeypatch):
    run_dir = tmp_path / "a_run_with_a_rather_long_name_that_a_narrow_terminal_would_cut"
    shutil.copytree(gpt_base.parent.parent, run_dir)
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    monkeypatch.setenv("COLUMNS", "60")  # a narrow terminal
    done = run("evaluate", f"ckpt_path={ckpt}", "trainer.limit_test_batches=1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    (written,) = (run_dir / "evals").glob("*/metrics.json")
    assert "test/loss" in json.loads(written.read_text()) and not (tmp_path / "outputs").exists()
    assert f"metrics written to {written}" in done.stdout
    assert "".join(line.strip("│ ") for line in done.stdout.splitlines()).count(ckpt.name) >= 1
    assert str(ckpt).replace("/", "") in "".join(line.strip("│ ").replace("/", "") for line in done.stdout.splitlines())


def test_init_from_tells_adapter_matrices_from_missing_weights():
    line = loaded_line(range(40), [], [], ["h.0.attn.qkv.lora_A.q", "h.0.attn.qkv.lora_B.q"])
    assert line == "40 tensors loaded, 2 adapter matrices added (LoRA's B starts at zero: the model starts as loaded)"
    line = loaded_line(range(3), ["pooler.weight"], ["head.weight", "head.bias"], [])
    assert line == "3 tensors loaded, 1 skipped (pooler.weight), 2 freshly initialised (head.weight, head.bias)"


def test_the_closing_table_names_the_optimizer_and_the_adapter():
    model = tiny_config().to_dict()
    plain = GeneratorTask(model=model, optimizer={"name": "muon", "lr": 0.02})
    assert setup_rows(plain) == [("optimizer", "muon, lr 0.02"), ("adapter", "none: every parameter trains")]
    lora = GeneratorTask(
        model=model, optimizer={"lr": 1e-3}, adapter={"name": "lora", "rank": 4, "alpha": 8, "targets": ["q", "v"]}
    )
    assert setup_rows(lora)[1] == ("adapter", "lora, rank 4, alpha 8, targets q v, save full")
