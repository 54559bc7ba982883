"""zoo-generate: what a checkpoint does with a prompt, as its task answers (``ZooTask.respond``):
continue it (generator), translate it (translator), label it (classifier) or fill its <mask>
tokens (mlm). ``ckpt_path=`` may name a pretrained model instead (an HF folder, a GGUF file): its
form's task answers (``tasks.cli.pretrained.source_task``).

``prompt=`` passes through literally (``${...}`` is text, not an interpolation). A mistake (no or a
damaged checkpoint, an empty prompt, a setting out of range) ends in one ``zoo: …`` line, exit 2; a
generation cut short by the model's positions prints one ``zoo: warning: …`` line after the text.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

import zoo
from tasks import TASKS, ZooTask
from tasks.base import DECODING
from tasks.cli.boundary import user_errors
from tasks.cli.console import literal
from tasks.cli.loading import for_inference
from tasks.cli.pretrained import load_model_task
from tasks.cli.values import check_seed
from tasks.errors import UserError, utf8_text
from zoo.generation import GenerationLimitWarning, PromptError


def given(cfg: DictConfig, key: str, example: str) -> None:
    """A UserError unless the user gave ``key`` (it is ``???`` or null in the YAML)."""
    if OmegaConf.is_missing(cfg, key) or literal(cfg, key) is None:
        raise UserError(f"{key}= is required: {example}")


def prompt_of(task: ZooTask, cfg: DictConfig) -> str:
    """``prompt=`` exactly as given; a UserError when it is missing, is not UTF-8 text or gives the
    tokenizer nothing."""
    given(cfg, "prompt", 'the text to answer, e.g. prompt="def fib(n):"')
    prompt = utf8_text("prompt", literal(cfg, "prompt"))  # bytes of the command line that are no UTF-8: one line
    if not task.tokenizer.encode(prompt, add_special_tokens=False).ids:
        raise UserError("prompt= gives no tokens; give some text")
    return prompt


ANSWERING = ("top", "seed", "compile")
"""conf/generate.yaml's settings besides the decoding ones (``DECODING``) that go to ``ZooTask.respond``;
each task reads those it needs."""


def settings_of(task: ZooTask, cfg: DictConfig) -> dict[str, Any]:
    """What ``task`` answers with: each decoding setting the command line gives, the task's own
    (``ZooTask.decoding_settings``) for those it leaves null, and the answering settings."""
    given = {key: cfg[key] for key in DECODING if cfg.get(key) is not None}
    return task.decoding_settings() | given | {key: cfg[key] for key in ANSWERING}


@torch.no_grad()
def respond(task: ZooTask, task_name: str, cfg: DictConfig) -> str:
    """The answer of ``task`` to ``cfg.prompt`` (``ZooTask.respond``); a UserError for a task zoo-generate
    does not know and for a prompt the model cannot read."""
    if task_name not in TASKS:
        raise UserError(
            f"the checkpoint's task {task_name!r} is not one zoo-generate answers ({', '.join(TASKS)});"
            f" pass a checkpoint of one of those"
        )
    prompt = prompt_of(task, cfg)
    try:
        return task.respond(prompt, **settings_of(task, cfg))
    except PromptError as error:
        raise UserError(f"prompt=: {error}") from None


@user_errors
def run(cfg: DictConfig) -> str:
    """zoo-generate on the config Hydra composed (tasks.cli.verbs.generate)."""
    check_seed(cfg.seed)  # torch.manual_seed takes what Lightning does: 0 .. 2**32 - 1
    if not isinstance(cfg.compile, bool):
        raise UserError(f"compile={cfg.compile!r} must be true or false")
    torch.manual_seed(cfg.seed)
    given(
        cfg,
        "ckpt_path",
        "a zoo-train checkpoint, e.g. ckpt_path=outputs/<run>/checkpoints/last.ckpt, or a "
        "pretrained model (an HF folder, a GGUF file)",
    )
    if not isinstance(cfg.chat, bool):
        raise UserError(f"chat={cfg.chat!r} must be true or false")
    task, info = load_model_task(cfg.ckpt_path)
    for_inference(task, cfg)  # quantize= / kv_cache=
    if task.tokenizer_json is None:
        raise zoo.CheckpointError(f"{cfg.ckpt_path} holds no tokenizer; pass a checkpoint that zoo-train wrote")
    if cfg.chat:
        return converse(task, cfg)
    with warnings.catch_warnings(record=True) as caught, zoo.measured() as speed:
        warnings.simplefilter("always", GenerationLimitWarning)
        text = respond(task, info["task"], cfg)
    print(text)
    for warning in caught:
        if issubclass(warning.category, GenerationLimitWarning):
            print(f"zoo: warning: {warning.message}", file=sys.stderr)
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
    if speed.tokens:
        print(speed_line(speed, compiled=cfg.compile), file=sys.stderr)
    return text


def converse(task: ZooTask, cfg: DictConfig) -> str:
    """chat=true: the model's reply to ``prompt=`` as one user turn; without a prompt, a conversation read
    from the terminal turn by turn (each reply sees the ones before), until Ctrl-D, an empty line or /exit."""
    if not task.chats:
        raise UserError(f"chat=true is for generators (a decoder); {cfg.ckpt_path} is a {type(task).__name__}")
    settings = settings_of(task, cfg) | {"origin": str(cfg.ckpt_path)}
    if not (OmegaConf.is_missing(cfg, "prompt") or literal(cfg, "prompt") is None):
        reply = task.chat([{"role": "user", "content": utf8_text("prompt", literal(cfg, "prompt"))}], **settings)
        print(reply)
        return reply
    messages: list[dict[str, str]] = []
    reply = ""
    interactive = sys.stdin.isatty()
    if interactive:
        print("zoo: chat with the model; an empty line, /exit or Ctrl-D ends it", file=sys.stderr)
    while True:
        try:
            line = input("you> " if interactive else "")
        except EOFError:
            break
        if not line.strip() or line.strip() == "/exit":
            break
        messages.append({"role": "user", "content": utf8_text("prompt", line)})
        reply = task.chat(messages, **settings)
        messages.append({"role": "assistant", "content": reply})
        print(reply if not interactive else f"model> {reply}", flush=True)
    return reply


def speed_line(speed: zoo.Measured, *, compiled: bool) -> str:
    """How fast the answer was decoded, for comparing ``quantize=``, ``kv_cache=`` and ``compile=``."""
    line = f"zoo: {speed.tokens} new tokens in {speed.seconds:.2f} s ({speed.tokens_per_s:,.1f} tokens/s)"
    if compiled:
        line += (
            "; compile=true: this includes compiling the decoding step, which pays back only over many "
            "tokens in one process (a benchmark or a server), not in one short call"
        )
    return line
