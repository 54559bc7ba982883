"""zoo-attention: where a model looks on one text — heatmaps, rollout and a per-head table.

    zoo-attention ckpt_path=<run>/checkpoints/last.ckpt prompt="def fib(n):"
    zoo-attention ckpt_path=<file.gguf or HF model folder> prompt="The capital of France is"
    zoo-attention model_dir=export/t5 prompt="three hundred" target="trois cents"

Runs one text through the model on the reference attention kernel (``zoo.capture_attention``) and
writes into the run directory (printed at the end; ``outputs/attention/runs/<date>`` by default):

- ``<kind>_layer<i>.png`` per attention layer, one panel per head, tokens on both axes (queries
  down, keys across): ``encoder_self``, ``decoder_self``, and ``cross`` (target tokens down,
  source tokens across) for an encoder-decoder.
- ``rollout_<stack>.png``: attention rollout (Abnar & Zuidema 2020) of each stack's
  self-attention — the encoder's, and the decoder's self-attention alone. Cross-attention is not
  rolled out: it reads another sequence, so it has no square map to multiply; see its per-layer
  heatmaps.
- ``heads.md``: per head, the mean row entropy (nats, and normalised by log of the keys each row
  may see), the mass on the first token, on the own and on the previous position, and the flags
  "flat", "sink", "diagonal", "previous" (thresholds in ``conf/attention.yaml``); the same table
  is printed. ``summary.json``: tokens, notes and flag counts. ``plots=false`` writes only these
  two, e.g. for a quick look at a large model.

By form: an encoder (classifier, masked LM) and a decoder (generator) read ``prompt`` (or ``text``); an
encoder-decoder reads it as the source and ``target`` as the decoder's text, or, without
``target``, its own greedy translation (decoder inputs: the start token, then the target tokens).

This module reads the model and the text and runs the verb; ``plots.py`` draws the
figures, ``heads.py`` makes the per-head table.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from tokenizers import Tokenizer
from torch import Tensor

import zoo
from tasks.cli.attention.heads import flag_counts, head_rows, markdown, print_table, thresholds_line
from tasks.cli.attention.plots import write_figures
from tasks.cli.boundary import user_errors
from tasks.cli.console import literal
from tasks.cli.pretrained import load_model_task
from tasks.data.tokenizers import read_folder_tokenizer
from tasks.errors import UserError, utf8_text
from zoo.inspect import capture_attention

VISIBLE_WHITESPACE = str.maketrans({" ": "␣", "\n": "↵", "\t": "⇥", "$": r"\$"})  # "$" would start mathtext


@dataclass
class Inputs:
    """Token ids the model is run on (batch of one) and their axis labels."""

    ids: list[int]  # the text (encoder, decoder) or the source (encoder_decoder)
    target: list[int] | None = None  # encoder_decoder: decoder inputs, start token first
    notes: list[str] = field(default_factory=list)  # what was cut or generated, for titles and the table


def load(cfg: DictConfig) -> tuple[zoo.ZooModel, Tokenizer, str]:
    """The model (eval mode), its tokenizer and a name for where it came from."""
    if bool(cfg.ckpt_path) == bool(cfg.model_dir):
        raise UserError(
            "give ckpt_path=<zoo-train checkpoint, HF model folder or GGUF file> or model_dir=<zoo-export "
            "safetensors folder> (exactly one)"
        )
    if cfg.ckpt_path:
        if not Path(cfg.ckpt_path).expanduser().exists():
            raise UserError(f"ckpt_path={cfg.ckpt_path} is not a file (nothing is there); check the path")
        task, _ = load_model_task(cfg.ckpt_path)  # an HF folder, a GGUF file; a damaged file: CheckpointError
        if cfg.tokenizer_path:
            return task.model.eval(), read_tokenizer(Path(cfg.tokenizer_path), "tokenizer_path"), str(cfg.ckpt_path)
        if task.tokenizer_json is None:
            raise zoo.CheckpointError(f"{cfg.ckpt_path} holds no tokenizer; pass tokenizer_path=<tokenizer.json>")
        return task.model.eval(), task.tokenizer, str(cfg.ckpt_path)
    folder = Path(cfg.model_dir).expanduser()
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        raise UserError(
            f"model_dir={folder} has no config.json and model.safetensors "
            "(write one with zoo-export format=safetensors)"
        )
    if cfg.tokenizer_path:
        tokenizer = read_tokenizer(Path(cfg.tokenizer_path), "tokenizer_path")
    else:  # the folder's own tokenizer.json (no link out of it, a regular file: zoo.io.read_handed)
        tokenizer = read_folder_tokenizer(folder, "model_dir", "pass the tokenizer.json the model was trained with")
        if tokenizer is None:
            raise UserError(
                f"model_dir: {folder / 'tokenizer.json'} not found; the model folder needs its tokenizer "
                f"(zoo-export writes it) or pass tokenizer_path=<tokenizer.json>"
            )
    return zoo.load_pretrained(folder), tokenizer, str(folder)  # a damaged folder: CheckpointError


def read_tokenizer(path: Path, field: str) -> Tokenizer:
    """A tokenizer.json; a UserError naming ``field`` when it is missing or not a tokenizer."""
    if not path.is_file() and field == "model_dir":
        raise UserError(
            f"model_dir: {path} not found; the model folder needs its tokenizer (zoo-export writes it) "
            f"or pass tokenizer_path=<tokenizer.json>"
        )
    if not path.is_file():
        raise UserError(f"tokenizer_path={path}: no such file; check the path")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # the tokenizers library raises a bare Exception for a file it cannot parse
        raise UserError(
            f"{field}: {path} is not a tokenizer.json ({_first_line(error)}); pass the tokenizer.json "
            f"the model was trained with"
        ) from None


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:160] if lines else type(error).__name__


def whole(cfg: DictConfig, key: str, least: int) -> int:
    """``cfg[key]`` as a whole number >= ``least``; a UserError naming it otherwise."""
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UserError(f"{key}={value!r} must be a whole number >= {least}")
    return value


def check_thresholds(cfg: DictConfig) -> None:
    """The flag thresholds are numbers; a UserError naming the first that is not."""
    for key in ("flat_threshold", "sink_threshold", "diagonal_threshold"):
        value = cfg[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UserError(f"{key}={value!r} must be a number (see conf/attention.yaml)")


def the_text(cfg: DictConfig) -> str:
    """``prompt=`` (as zoo-generate names it) or ``text=`` (its older name here); a UserError for
    neither, for both saying different things, or for bytes that are not UTF-8 text."""
    prompt, text = literal(cfg, "prompt"), literal(cfg, "text")
    if prompt is not None and text is not None and prompt != text:
        raise UserError("prompt= and text= name the same text here; give one of them")
    given = prompt if prompt is not None else text
    if given is None or not given.strip():
        raise UserError('prompt="…" is required: the text to look at (the source sentence for a translator)')
    return utf8_text("prompt" if prompt is not None else "text", given)


def encode(model: zoo.ZooModel, tokenizer: Tokenizer, cfg: DictConfig) -> Inputs:
    """Tokenize ``text`` (and ``target``) as the tasks do in training, cut to ``max_tokens``."""
    config = model.config
    text, target_text = the_text(cfg), literal(cfg, "target")
    if target_text is not None:
        utf8_text("target", target_text)
    reads_a_source = config.form.cross_attention  # a translator: a source, and a target it reads or writes
    if target_text is not None and not reads_a_source:
        raise UserError(f"target= is for encoder-decoder models; this model is arch={config.arch!r}")
    limit = whole(cfg, "max_tokens", 2)
    if model.max_positions is not None:
        limit = min(limit, model.max_positions)  # the position table ends there
    ids = tokenizer.encode(text).ids
    if not ids:
        raise UserError(f"text={text!r} gives no tokens; give some text")
    inputs = Inputs(ids=ids[:limit])
    if reads_a_source and config.eos_token_id is not None:
        # the source ends with </s>, also when cut, as in TranslationDataModule
        inputs.ids = ids[: limit - 1] + [config.eos_token_id]
        ids = ids + [config.eos_token_id]
    if len(ids) > limit:
        inputs.notes.append(f"text cut to its first {limit} of {len(ids)} tokens (max_tokens)")
    if not reads_a_source:
        return inputs
    start = config.decoder_start_token_id
    if target_text is not None:
        target = [start] + tokenizer.encode(target_text).ids
        inputs.notes.append("decoder reads the given target")
    else:
        new = min(whole(cfg, "max_new_tokens", 0), limit - 1)
        with torch.no_grad():
            out = model.generate(torch.tensor([inputs.ids]), new, do_sample=False)
        target = out[0].tolist()
        if config.eos_token_id in target[1:]:
            target = target[: target.index(config.eos_token_id, 1)]  # the step that chose </s> is kept as a query
        generated = tokenizer.decode(target[1:], skip_special_tokens=True)
        inputs.notes.append(f"decoder reads the model's greedy translation {generated!r}")
    inputs.target = target[:limit]
    if len(target) > limit:
        inputs.notes.append(f"target cut to its first {limit} of {len(target)} tokens (max_tokens)")
    return inputs


def token_labels(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """Each id decoded on its own, whitespace made visible (␣ space, ␣×4 four, ↵ newline, ⇥ tab). A Metaspace
    (Unigram) decoder drops a lone token's word-start marker "▁", so it is put back as ␣."""
    labels = []
    for i in ids:
        text = tokenizer.decode([i], skip_special_tokens=False)
        raw = tokenizer.id_to_token(i) or ""
        if raw.startswith("▁") and not text.startswith(" "):
            text = " " + text
        text = re.sub(r" {3,}", lambda run: f"␣×{len(run.group())}", text)  # indentation: "↵␣×8", not 8 marks
        labels.append(text.translate(VISIBLE_WHITESPACE) or raw or f"#{i}")
    return labels


@torch.no_grad()
def capture(model: zoo.ZooModel, inputs: Inputs) -> dict[str, Tensor]:
    """Module name -> probabilities (H, Tq, Tk) of the one sequence."""
    ids = torch.tensor([inputs.ids])  # (1, T)
    with capture_attention(model) as probs:
        if inputs.target is None:
            model(ids)
        else:
            model(ids, torch.tensor([inputs.target]))
    return {name: p[0] for name, p in probs.items()}


@user_errors
def attention_report(cfg: DictConfig, out: Path) -> dict[str, object]:
    """Everything zoo-attention does, into ``out``; returns a summary (files written, flag counts).
    Bad input (no checkpoint, no text, …) exits with a one-line ``zoo: …`` message."""
    model, tokenizer, source = load(cfg)
    inputs = encode(model, tokenizer, cfg)
    check_thresholds(cfg)
    maps = capture(model, inputs)
    src_labels = token_labels(tokenizer, inputs.ids)
    tgt_labels = token_labels(tokenizer, inputs.target) if inputs.target is not None else None
    rows = head_rows(maps, cfg)

    out.mkdir(parents=True, exist_ok=True)
    written = write_figures(out, maps, rows, src_labels, tgt_labels, inputs.notes) if cfg.plots else []
    thresholds = thresholds_line(cfg)
    text = the_text(cfg)  # prompt= or text=
    header = [
        f"# Attention heads of {source}",
        "",
        f"text: {text!r}",
        *[f"note: {n}" for n in inputs.notes],
        "",
        f"Rows that see a single key (the first under a causal mask) are left out of the means. {thresholds}.",
    ]
    (out / "heads.md").write_text(markdown(rows, header), encoding="utf-8")
    written.append(out / "heads.md")
    limit = None if cfg.get("table_rows") is None else whole(cfg, "table_rows", 1)
    print_table(rows, thresholds, inputs.notes, limit=limit)

    written.append(out / "summary.json")
    summary = {
        "files": [p.name for p in written],
        "heads": len(rows),
        "flags": flag_counts(rows),
        "tokens": src_labels,
        "target_tokens": tgt_labels,
        "notes": inputs.notes,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False), encoding="utf-8")
    print(f"wrote {len(written)} files to {out}")
    return summary


def run(cfg: DictConfig) -> dict[str, object]:
    """zoo-attention on the config Hydra composed (tasks.cli.verbs.attention), into its run directory."""
    return attention_report(cfg, Path(HydraConfig.get().runtime.output_dir))
