"""The model card (README.md) of a zoo-export folder: what the model is, what it was trained on and
how far, and how to load it in the folder's format. Every figure comes from the task or its
checkpoint; a figure the checkpoint does not hold is left out, never guessed."""

from __future__ import annotations

import inspect
import math
import re
from typing import Any

import yaml

import zoo
from tasks import TASKS, ZooTask
from tasks.cli.export.formats import EXPORT_FORMATS, ExportFormat
from tasks.optim import OPTIMIZERS, optimizer_name


def model_card(
    task: ZooTask, checkpoint: dict[str, Any], *, fmt: str, command: str, hf_class: str | None = None
) -> str:
    """The README.md of an export of ``task`` (rebuilt from ``checkpoint``, a zoo-train checkpoint) in
    format ``fmt``, written by ``command``; ``hf_class`` is the transformers class of an ``hf`` export."""
    form = EXPORT_FORMATS.get(fmt, field="fmt")()  # a ConfigError (a ValueError) naming the formats
    if form.card_needs_class and not hf_class:
        raise ValueError(f"fmt={fmt!r} needs hf_class, the transformers class the folder holds (e.g. GPT2LMHeadModel)")
    run = checkpoint.get("zoo_run") or {}
    config = yaml.safe_load(run.get("config_yaml") or "") or {}
    name = next((n for n in TASKS.names() if TASKS.get(n) is type(task)), type(task).__name__)
    sections = [
        front_matter(name, form, hf_class),
        f"# {title(task)}",
        f"A zoo `{name}` model trained with `zoo-train`, exported as {form.title} by `zoo-export`.",
        section("Model", model_lines(task, config)),
        section("Data", data_lines(task, checkpoint, config)),
        section("Training", training_lines(task, checkpoint, config)),
    ]
    labels = task.label_names
    if labels:
        sections.append(section("Labels", [f"{i}: `{label}`" for i, label in enumerate(labels)]))
    sections += [
        "## Command\n\nThis folder was written by:\n\n" + fenced(command, "bash"),
        "## How to load\n\n" + fenced("\n".join(form.load_code(task, hf_class)), "python"),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def describe_model(cfg: zoo.ModelConfig, params: int) -> str:
    """The composition in one line, in the words of zoo-train's final summary, e.g. "decoder: 2 layers,
    d_model 128, 4 heads (4 KV), 1,234 parameters, learned positions, pre-layernorm, gelu FFN"; a form
    with cross-attention names its encoder and decoder layers."""
    layers = (
        f"{cfg.resolved_n_encoder_layers} encoder + {cfg.resolved_n_decoder_layers} decoder layers"
        if cfg.form.cross_attention
        else f"{cfg.n_layers} layers"
    )
    return (
        f"{cfg.arch}: {layers}, d_model {cfg.d_model}, {cfg.n_heads} heads ({cfg.resolved_n_kv_heads} KV), "
        f"{params:,} parameters, {cfg.position} positions, {cfg.norm_placement}-{cfg.norm}, {cfg.ffn} FFN"
    )


def front_matter(task_name: str, form: ExportFormat, hf_class: str | None) -> str:
    """The YAML block the Hugging Face Hub reads: library, pipeline (where the format has one) and tags."""
    meta: dict[str, Any] = {"library_name": form.library}
    pipeline = form.pipeline(hf_class)
    if pipeline:
        meta["pipeline_tag"] = pipeline
    meta["tags"] = ["zoo", task_name]
    return f"---\n{yaml.safe_dump(meta, sort_keys=False)}---"


def title(task: ZooTask) -> str:
    """What the task's module says it is (its docstring's first phrase) and the model's form."""
    doc = inspect.getdoc(inspect.getmodule(type(task))) or type(task).__name__
    phrase = re.split(r"[:.\n]", doc, maxsplit=1)[0].strip()
    return f"{phrase} ({task.model.config.arch})"


def model_lines(task: ZooTask, config: dict[str, Any]) -> list[str]:
    cfg = task.model.config
    params = zoo.count_parameters(task.model)
    lines = [describe_model(cfg, params), f"parameters: {params:,}"]
    extra = sum(p.numel() for module in task.export_modules().values() for p in module.parameters())
    if extra:
        lines[-1] += f" in the model, {extra:,} in the task's own modules ({', '.join(task.export_modules())})"
    limit = zoo.position_limit(cfg)
    if limit is not None:
        lines.append(f"longest input: {limit:,} tokens ({cfg.position} positions)")
    preset = (config.get("model") or {}).get("preset")
    if preset:
        lines.append(f"preset: `{preset}`" + preset_changes(cfg, preset))
    return lines


def preset_changes(cfg: zoo.ModelConfig, preset: str) -> str:
    """``, changed: d_model=32, …``: the fields where ``cfg`` differs from the preset it was made from."""
    try:
        base = zoo.get_config(preset).to_dict()
    except zoo.ConfigError:  # a preset this version of zoo does not have
        return ""
    changed = [f"{k}={v}" for k, v in cfg.to_dict().items() if base.get(k) != v]
    return f", changed: {', '.join(changed)}" if changed else ""


def data_lines(task: ZooTask, checkpoint: dict[str, Any], config: dict[str, Any]) -> list[str]:
    run = checkpoint.get("zoo_run") or {}
    data = run.get("data") or {}
    lines = []
    if run.get("data_module"):
        source = f", source `{data['source']}`" if data.get("source") else ""
        args = ", ".join(f"{k}={v}" for k, v in (data.get("source_args") or {}).items() if v is not None)
        lines.append(f"data module: `{run['data_module']}`{source}" + (f" ({args})" if args else ""))
    sizes = [
        f"{label} {data[key]}"
        for key, label in (("seq_len", "sequence length"), ("batch_size", "batch size"))
        if data.get(key) is not None
    ]
    if sizes:
        lines.append(", ".join(sizes))
    kind = type(task.tokenizer.model).__name__
    specials = checkpoint.get("tokenizer_specials")  # recorded only for a tokenizer that is not zoo's own
    if specials:
        origin = specials.get("origin") if isinstance(specials, dict) else None
        source = (
            "a GGUF file"
            if isinstance(origin, str) and origin.lower().endswith(".gguf")
            else "a Hugging Face model folder"
        )
        where = (
            f"from {source}" + (f" (`{origin}`)" if isinstance(origin, str) else "") + ", with its own special tokens"
        )
    elif data.get("tokenizer_path"):
        where = f"read from `{data['tokenizer_path']}`"
    elif config.get("init_from"):
        where = f"that of the checkpoint `{config['init_from']}`"
    else:
        where = "trained by zoo on the training data"
    lines.append(f"tokenizer: {kind}, {task.tokenizer.get_vocab_size():,} tokens, {where}")
    return lines


def training_lines(task: ZooTask, checkpoint: dict[str, Any], config: dict[str, Any]) -> list[str]:
    lines = []
    step, epoch = checkpoint.get("global_step"), checkpoint.get("epoch")
    if isinstance(step, int):
        lines.append(f"steps: {step:,}" + (f" (epoch {epoch}, counted from 0)" if isinstance(epoch, int) else ""))
    for monitor, best, latest, mode in monitored(checkpoint):
        better = {"min": " (lower is better)", "max": " (higher is better)"}.get(mode or "", "")
        last = f"; at the last check {latest:.4f}" if latest is not None and latest != best else ""
        lines.append(f"best `{monitor}`: {best:.4f}{better}{last}")
    opt, sched = task.optimizer_settings, task.scheduler_settings
    if "lr" in opt:
        line = f"optimizer: {OPTIMIZERS.get(optimizer_name(opt)).title}, lr {opt['lr']:g}" + (
            f", weight decay {opt['weight_decay']:g}" if "weight_decay" in opt else ""
        )
        if {"warmup_steps", "min_lr_ratio"} <= set(sched):
            line += f"; {sched['warmup_steps']:,} warmup steps, then cosine decay to {sched['min_lr_ratio']:g} × lr"
        lines.append(line)
    if config.get("init_from"):
        lines.append(f"initialised from: `{config['init_from']}`")
    return lines


def monitored(checkpoint: dict[str, Any]) -> list[tuple[str, float, float | None, str | None]]:
    """(metric, best value, value at the last check, "min"/"max" or None) for each checkpoint callback
    (Lightning's ModelCheckpoint state) that monitored a metric and holds a finite best score."""
    found = []
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if not isinstance(state, dict) or not isinstance(state.get("monitor"), str):
            continue
        best, latest = _number(state.get("best_model_score")), _number(state.get("current_score"))
        mode = re.search(r"'mode': '(min|max)'", str(key))  # Lightning's state key repeats its settings
        if best is not None and state["monitor"] not in [f[0] for f in found]:
            found.append((state["monitor"], best, latest, mode.group(1) if mode else None))
    return found


def _number(value: Any) -> float | None:
    """A finite float from a number or a one-element tensor; None for anything else (None, NaN, inf)."""
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return number if math.isfinite(number) else None


def section(heading: str, lines: list[str]) -> str:
    """A Markdown section of bullet lines; empty when there are none."""
    return f"## {heading}\n\n" + "\n".join(f"- {line}" for line in lines) if lines else ""


def fenced(text: str, lang: str) -> str:
    """``text`` as a fenced code block whose fence is longer than any run of backticks inside it."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return f"{fence}{lang}\n{text}\n{fence}"


__all__ = ["describe_model", "model_card", "monitored"]
