"""``zoo-export format=hf``: a run as a folder that transformers' Auto classes load with no
``trust_remote_code`` (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, BertForMaskedLM,
BertForSequenceClassification, T5ForConditionalGeneration), with its tokenizer files and, for a
model that generates, the task's decoding settings in generation_config.json (``hf_generation``).
When transformers is installed the folder is checked before it appears: logits on a padded batch
within 1e-4 of zoo's (fp32), and the tokens transformers' ``generate`` decodes with the folder's own
generation_config.json equal to the task's (``ZooModel.generate``), both stopping at EOS.

What transformers cannot repeat: zoo's repetition penalty and n-gram ban read an encoder-decoder's
target after its start token and never a prompt's padding, while transformers' processors read the
whole decoder input (start token, left padding). With either control on, the two differ when the
start or pad token is a candidate; the tasks decode with both off, which is what the folder carries."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import zoo
from tasks import ZooTask
from tasks.data.tokenizers import ROLES
from tasks.errors import UserError
from zoo.decoding import steps_of
from zoo.io import atomic_write_text

TOLERANCE = 1e-4
SAMPLING = ("do_sample", "temperature", "top_k", "top_p")  # generation_config.json keys of sampling alone


def export_hf(task: ZooTask, out: Path, card: str | None = None) -> float | None:
    """Write the folder; return the max abs logit difference of transformers' reload (None when
    transformers is not installed: the folder is written unchecked, and the caller says so)."""
    head = task.hf_classifier()
    files = tokenizer_files(task)
    if card is not None:
        files["README.md"] = card
    decoding = task.decoding_settings() if type(task.model).decoding is not None else None
    found: dict[str, float] = {}

    def finish(folder: Path) -> None:
        """The task's decoding settings beside the token ids to_hf wrote, then the reload check."""
        if decoding is not None:
            path = folder / "generation_config.json"
            atomic_write_text(path, _json({**json.loads(path.read_text()), **hf_generation(decoding)}))
        if importlib.util.find_spec("transformers") is not None:
            found["diff"] = check_reload(task, folder, architecture)

    architecture = zoo.hf.family_class(task.model.config, classifier=head is not None)  # refuses, naming why
    zoo.to_hf(
        task.model,
        out,
        classifier=head[0] if head else None,
        label_names=head[1] if head else None,
        files=files,
        check=finish,
    )
    return found.get("diff")


def hf_generation(given: dict[str, Any]) -> dict[str, Any]:
    """transformers' GenerationConfig fields for a task's decoding settings (``ZooTask.decoding_settings``).
    Each field is written only where the mode reads it, as transformers validates them:
    ``length_penalty`` with beams, temperature, top-k and top-p with sampling (zoo's beam search never
    samples; its stop is transformers' ``early_stopping=False``); top_k None is 0 and top_p None is 1
    there (off), as transformers' own defaults (50, 1.0) would filter otherwise."""
    beams = given["num_beams"]
    sample = bool(given["do_sample"]) and given["temperature"] > 0 and beams == 1
    out: dict[str, Any] = {"max_new_tokens": given["max_new_tokens"], "num_beams": beams, "do_sample": sample}
    if beams > 1:
        out |= {"length_penalty": given["length_penalty"], "early_stopping": False}
    if sample:
        out |= {
            "temperature": given["temperature"],
            "top_k": given["top_k"] or 0,
            "top_p": 1.0 if given["top_p"] is None else given["top_p"],
        }
    if given["repetition_penalty"] != 1.0:
        out["repetition_penalty"] = given["repetition_penalty"]
    if given["no_repeat_ngram_size"]:
        out["no_repeat_ngram_size"] = given["no_repeat_ngram_size"]
    return out


def tokenizer_files(task: ZooTask) -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json, as transformers writes them
    for a fast tokenizer: the special tokens named by their text, the model's length limit, left
    padding for a decoder (its batched generation needs it) and the chat template, if any."""
    specials = task.special_tokens
    tokenizer = task.export_tokenizer()
    tokens = {
        f"{role}_token": tokenizer.id_to_token(getattr(specials, role))
        for role in ROLES
        if getattr(specials, role) is not None
    }
    cfg = task.model.config
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "model_max_length": cfg.max_seq_len or 1_000_000,
        "padding_side": "left"
        if type(task.model).decoding is not None and not type(task.model).cross_attention
        else "right",
        **tokens,
    }
    if getattr(specials, "chat_template", None):  # a model started from a chat model keeps its template
        config["chat_template"] = specials.chat_template
    return {
        "tokenizer.json": tokenizer.to_str(pretty=True),
        "tokenizer_config.json": _json(config),
        "special_tokens_map.json": _json(tokens),
    }


def check_reload(task: ZooTask, folder: Path, architecture: str) -> float:
    """Load ``folder`` with transformers and compare: logits (at real tokens) on the form's padded
    example batch, then greedy tokens for a model that generates. A UserError above the tolerance."""
    import transformers
    from transformers.utils import logging

    logging.disable_progress_bar()  # a bar over a few dozen tensors says nothing
    hf = getattr(transformers, architecture).from_pretrained(folder).eval()
    model = task.model
    inputs = type(model).example_inputs(model.config)
    with torch.no_grad():
        ours = task.export_head(model(**{n: inputs[n] for n in type(model).input_names}), inputs["attention_mask"])
        out = hf(**{n: inputs[n] for n in type(model).input_names})
        theirs = getattr(out, "logits", None)
        theirs = out.last_hidden_state if theirs is None else theirs
    diff = masked_diff(ours.float(), theirs.float(), inputs["attention_mask"])
    if diff > TOLERANCE:
        raise UserError(
            f"format=hf: transformers' {architecture} computes other logits than the zoo model (max abs "
            f"diff {diff:.3g} > {TOLERANCE}); nothing was written. Please report this composition"
        )
    if type(model).decoding is not None:
        _check_decoding(task, hf, folder, inputs, architecture)
    return diff


def masked_diff(ours: Tensor, theirs: Tensor, mask: Tensor) -> float:
    """Max abs difference; per-token outputs of the (B, T) inputs only where the mask is 1."""
    if ours.dim() == 3 and ours.shape[1] == mask.shape[1]:
        keep = mask.bool()
        return (ours[keep] - theirs[keep]).abs().max().item()
    return (ours - theirs).abs().max().item()


def _check_decoding(task: ZooTask, hf: Any, folder: Path, inputs: dict[str, Tensor], architecture: str) -> None:
    """transformers' ``generate`` with the folder's generation_config.json against the task's settings
    in ``ZooModel.generate``, both stopping at EOS and padding after it; a sampling task is compared
    greedily (the two libraries draw differently). The prompts: the padded example batch for a form
    that pads on the right (a source), its unpadded row for one that pads on the left; as many new
    tokens as the positions leave room for."""
    import transformers

    model = task.model
    steps = steps_of(type(model))
    assert steps is not None  # only a form that generates is checked so
    prompt, mask = (
        (inputs["input_ids"], inputs["attention_mask"])
        if not steps.left_pad
        else (inputs["input_ids"][1:], inputs["attention_mask"][1:])
    )
    settings = {**task.generation_settings(), "do_sample": False}
    if model.max_positions is not None:
        settings["max_new_tokens"] = min(settings["max_new_tokens"], model.max_positions - steps.held(prompt.shape[1]))
    written = json.loads((folder / "generation_config.json").read_text())
    hf.generation_config = transformers.GenerationConfig(
        **{
            **{key: value for key, value in written.items() if key not in SAMPLING},
            "do_sample": False,
            "max_new_tokens": settings["max_new_tokens"],
        }
    )
    ours = model.generate(prompt, attention_mask=mask, **settings)
    with torch.no_grad():
        theirs = hf.generate(prompt, attention_mask=mask)
    if ours.tolist() != theirs.tolist():
        raise UserError(
            f"format=hf: transformers' {architecture} decodes other tokens than the zoo model with the "
            f"task's settings {settings} ({theirs[0].tolist()} vs {ours[0].tolist()}); nothing was "
            f"written. Please report this"
        )


def _json(values: dict[str, Any]) -> str:
    return json.dumps(values, indent=2, sort_keys=True) + "\n"
