"""``zoo-export format=hf``: a run as a folder that transformers' Auto classes load with no
``trust_remote_code`` (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, BertForMaskedLM,
BertForSequenceClassification, T5ForConditionalGeneration), with its tokenizer files and, when
transformers is installed, checked before the folder appears: logits on a padded batch within
1e-4 of zoo's (fp32) and the same greedy tokens."""

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

TOLERANCE = 1e-4
NEW_TOKENS = 8


def export_hf(task: ZooTask, out: Path, card: str | None = None) -> float | None:
    """Write the folder; return the max abs logit difference of transformers' reload (None when
    transformers is not installed: the folder is written unchecked, and the caller says so)."""
    head = task.hf_classifier()
    files = tokenizer_files(task)
    if card is not None:
        files["README.md"] = card
    found: dict[str, float] = {}

    def check(folder: Path) -> None:
        if importlib.util.find_spec("transformers") is not None:
            found["diff"] = check_reload(task, folder, architecture)

    architecture = zoo.hf.family_class(task.model.config, classifier=head is not None)  # refuses, naming why
    zoo.to_hf(task.model, out, classifier=head[0] if head else None, label_names=head[1] if head else None,
              files=files, check=check)
    return found.get("diff")


def tokenizer_files(task: ZooTask) -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json, as transformers writes them
    for a fast tokenizer: the special tokens named by their text, the model's length limit, and
    left padding for a decoder (its batched generation needs it)."""
    specials = task.special_tokens
    tokenizer = task.export_tokenizer()
    tokens = {f"{role}_token": tokenizer.id_to_token(getattr(specials, role)) for role in ROLES
              if getattr(specials, role) is not None}
    cfg = task.model.config
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "model_max_length": cfg.max_seq_len or 1_000_000,
              "padding_side": "left" if type(task.model).decoding is not None and not type(task.model).cross_attention
              else "right", **tokens}
    return {"tokenizer.json": tokenizer.to_str(pretty=True), "tokenizer_config.json": _json(config),
            "special_tokens_map.json": _json(tokens)}


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
    diff = _masked_diff(ours.float(), theirs.float(), inputs["attention_mask"])
    if diff > TOLERANCE:
        raise UserError(f"format=hf: transformers' {architecture} computes other logits than the zoo model (max abs "
                        f"diff {diff:.3g} > {TOLERANCE}); nothing was written. Please report this composition")
    if type(model).decoding is not None:
        _check_greedy(model, hf, inputs["input_ids"][1:], architecture)
    return diff


def _masked_diff(ours: Tensor, theirs: Tensor, mask: Tensor) -> float:
    """Max abs difference; per-token outputs of the (B, T) inputs only where the mask is 1."""
    if ours.dim() == 3 and ours.shape[1] == mask.shape[1]:
        keep = mask.bool()
        return (ours[keep] - theirs[keep]).abs().max().item()
    return (ours - theirs).abs().max().item()


def _check_greedy(model: zoo.ZooModel, hf: Any, prompt: Tensor, architecture: str) -> None:
    ours = model.generate(prompt, max_new_tokens=NEW_TOKENS, eos_token_id=None)
    with torch.no_grad():
        theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, num_beams=1,
                             max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             pad_token_id=model.config.pad_token_id)
    if ours.tolist() != theirs.tolist():
        raise UserError(f"format=hf: transformers' {architecture} generates other greedy tokens than the zoo model "
                        f"({theirs[0].tolist()} vs {ours[0].tolist()}); nothing was written. Please report this")


def _json(values: dict[str, Any]) -> str:
    return json.dumps(values, indent=2, sort_keys=True) + "\n"
