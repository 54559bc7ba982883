"""The model card of an export: its figures are the checkpoint's (a missing one is left out), its
command is verbatim, its loading code fits the format; one tiny real training run."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys

import pytest
import torch
import yaml
from test_tasks import STEPS, TINY

import zoo
from tasks import ClassifierTask, TranslatorTask, ZooTask
from tasks.cli.export.card import describe_model, model_card, monitored
from tasks.cli.loading import load_task, read_checkpoint

COMMAND = "zoo-export ckpt_path='runs/a b/last.ckpt' out=exports/gpt format=safetensors"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[ZooTask, dict]:
    """A tiny generator trained by the real zoo-train command, and its checkpoint."""
    tmp = tmp_path_factory.mktemp("card")
    env = {**os.environ, "HYDRA_FULL_ERROR": "1", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tasks.cli.train",
            "experiment=gpt_generator",
            *TINY["gpt_generator"],
            *STEPS,
            "test=false",
            f"hydra.run.dir={tmp / 'run'}",
        ],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    path = tmp / "run" / "checkpoints" / "last.ckpt"
    task, _ = load_task(path)
    return task, read_checkpoint(path)


def card_of(task: ZooTask, checkpoint: dict, fmt: str = "safetensors", **kwargs) -> str:
    return model_card(task, checkpoint, fmt=fmt, command=kwargs.pop("command", COMMAND), **kwargs)


def code_block(card: str, lang: str = "python") -> str:
    return re.search(rf"```{lang}\n(.*?)\n```", card, re.S).group(1)


def test_card_holds_the_checkpoints_figures(trained):
    task, checkpoint = trained
    card = card_of(task, checkpoint)
    params = zoo.count_parameters(task.model)
    assert f"parameters: {params:,}" in card
    assert describe_model(task.model.config, params) in card  # the composition, in zoo-train's words
    assert f"steps: {checkpoint['global_step']:,}" in card and checkpoint["global_step"] == 6
    assert f"{task.tokenizer.get_vocab_size():,} tokens" in card
    assert "`LMDataModule`, source `stdlib_code` (max_files=40)" in card
    assert f"```bash\n{COMMAND}\n```" in card  # verbatim


def test_best_score_of_the_monitor(trained):
    task, checkpoint = trained
    found = monitored(checkpoint)
    assert [name for name, *_ in found] == ["val/loss"]  # the monitored metric; last.ckpt's callback has none
    state = next(s for s in checkpoint["callbacks"].values() if isinstance(s, dict) and s.get("monitor"))
    assert f"best `val/loss`: {float(state['best_model_score']):.4f} (lower is better)" in card_of(task, checkpoint)


def test_missing_figures_are_left_out(trained):
    task, checkpoint = trained
    bare = {k: v for k, v in checkpoint.items() if k not in ("callbacks", "epoch")}
    card = card_of(task, bare)
    assert "best `" not in card and "epoch" not in card
    broken = copy.deepcopy(checkpoint)  # a score that is not a number is no figure either
    for state in broken["callbacks"].values():
        if isinstance(state, dict) and "best_model_score" in state:
            state["best_model_score"] = torch.tensor(float("nan"))
    for text in (card, card_of(task, broken), card_of(task, {k: v for k, v in bare.items() if k != "zoo_run"})):
        assert not re.search(r"\b(None|nan|inf|null)\b", text), text
    assert "best `" not in card_of(task, broken)


def test_front_matter_is_yaml_for_the_hub(trained):
    task, checkpoint = trained
    for fmt, library in (("safetensors", "zoo"), ("onnx", "zoo"), ("hf", "transformers")):
        card = card_of(task, checkpoint, fmt, hf_class="GPT2LMHeadModel")
        meta = yaml.safe_load(card.split("---\n")[1])
        assert meta["library_name"] == library and meta["tags"] == ["zoo", "generator"]
        assert card.index("# GPT-style language model (decoder)") > card.index("---\n", 1)
    assert yaml.safe_load(card.split("---\n")[1])["pipeline_tag"] == "text-generation"


WRITTEN = {  # the 14 transformers classes format=hf writes, and the Auto class of each (transformers' docs)
    **dict.fromkeys(
        ("GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"),
        "AutoModelForCausalLM",
    ),
    **dict.fromkeys(("Gemma2ForCausalLM", "MixtralForCausalLM", "Olmo2ForCausalLM"), "AutoModelForCausalLM"),
    "T5ForConditionalGeneration": "AutoModelForSeq2SeqLM",
    "BertForMaskedLM": "AutoModelForMaskedLM",
    "BertForSequenceClassification": "AutoModelForSequenceClassification",
    "BertModel": "AutoModel",
    "ModernBertForMaskedLM": "AutoModelForMaskedLM",
    "ModernBertModel": "AutoModel",
}


def test_every_class_zoo_writes_has_its_auto_class_and_pipeline_tag():
    families = [zoo.hf.FAMILIES.get(name) for name in zoo.hf.FAMILIES.names()]
    assert {name: auto for f in families for name, auto in f.auto_classes.items()} == WRITTEN
    assert all(zoo.hf.auto_class(name) == auto and zoo.hf.pipeline_tag(name) for name, auto in WRITTEN.items())
    assert zoo.hf.pipeline_tag("Gemma2ForCausalLM") == "text-generation"
    assert zoo.hf.pipeline_tag("ModernBertForMaskedLM") == "fill-mask"
    assert zoo.hf.auto_class("GPTNeoXForCausalLM") is None


def test_how_to_load_fits_the_format(trained):
    task, checkpoint = trained
    safetensors = code_block(card_of(task, checkpoint, "safetensors"))
    assert "zoo.load_pretrained(folder)" in safetensors and "Tokenizer.from_file" in safetensors
    onnx = code_block(card_of(task, checkpoint, "onnx"))
    assert "onnxruntime.InferenceSession" in onnx and "zoo." not in onnx
    assert re.findall(r'"(\w+)": ', onnx) == list(type(task.model).input_names)
    for hf_class, auto in WRITTEN.items():
        hf = code_block(card_of(task, checkpoint, "hf", hf_class=hf_class))
        assert f"from transformers import {auto}, AutoTokenizer" in hf
        assert f"model = {auto}.from_pretrained(folder)" in hf and "AutoTokenizer.from_pretrained(folder)" in hf
    other = code_block(card_of(task, checkpoint, "hf", hf_class="GPTNeoXForCausalLM"))  # no Auto class known
    assert "model = GPTNeoXForCausalLM.from_pretrained(folder)" in other


def test_bad_arguments_are_refused(trained):
    task, checkpoint = trained
    with pytest.raises(ValueError, match="fmt='tflite'"):
        card_of(task, checkpoint, "tflite")
    with pytest.raises(ValueError, match="hf_class"):
        card_of(task, checkpoint, "hf")


def test_classifier_card_names_labels_and_head(trained):
    _, checkpoint = trained
    cfg = zoo.get_config("bert-tiny", vocab_size=300, d_model=32, n_heads=2, pooler=True)
    task = ClassifierTask(
        model=cfg.to_dict(),
        optimizer={"lr": 1e-3, "weight_decay": 0.0},
        label_names=["neg", "pos"],
        tokenizer_json=checkpoint["tokenizer_json"],
    )
    card = card_of(task, checkpoint, "hf", hf_class="BertForSequenceClassification")
    assert "## Labels\n\n- 0: `neg`\n- 1: `pos`" in card
    assert "AutoModelForSequenceClassification" in card and "(encoder)" in card
    assert "head.safetensors" in code_block(card_of(task, checkpoint))
    assert f"{sum(p.numel() for p in task.head.parameters()):,} in the task's own modules" in card


def test_encoder_decoder_names_both_stacks_and_its_inputs(trained):
    _, checkpoint = trained
    cfg = zoo.get_config("t5-tiny", vocab_size=300, d_model=32, n_heads=2, n_decoder_layers=1)
    task = TranslatorTask(model=cfg.to_dict(), optimizer={"lr": 1e-3}, tokenizer_json=checkpoint["tokenizer_json"])
    card = card_of(task, checkpoint, "onnx")
    assert f"{cfg.resolved_n_encoder_layers} encoder + 1 decoder layers" in card
    assert '"decoder_input_ids": np.full((1, 1), ' in code_block(card)


def test_card_without_run_record_still_reads(trained):
    task, checkpoint = trained
    card = card_of(task, {"global_step": 3}, "onnx", command="zoo-export a=b")
    assert "steps: 3" in card and "zoo-export a=b" in card and "## Data" in card  # the tokenizer is the task's
    assert "tags:\n- zoo\n- generator" in card  # the task's registered name


def test_tokenizer_of_a_hugging_face_folder_says_so(trained):
    task, checkpoint = trained
    assert "trained by zoo on the training data" in card_of(task, checkpoint)
    record = {"pad": None, "eos": 0, "others": [], "origin": "init_from=/models/gpt2"}
    card = card_of(task, {**checkpoint, "tokenizer_specials": record})
    assert "from a Hugging Face model folder (`init_from=/models/gpt2`), with its own special tokens" in card
    assert "None" not in card
