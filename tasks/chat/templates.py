"""A chat model's own chat template, rendered in a sandbox: the template comes from a handed file (a GGUF
file's ``tokenizer.chat_template``, an HF folder's chat_template.jinja), so it is text to fill, never
code to run. It is rendered in a process of its own (``tasks/chat/sandbox.py``), bounded in time,
memory and length: Jinja's immutable sandbox refuses every attribute that reaches Python's insides
(``__class__``, ``__globals__`` …) and every change to an object; no loader is set, so ``include`` and
``import`` find nothing; the template sees the messages, the special tokens and two helpers
transformers gives templates too (``raise_exception``, ``strftime_now``), nothing else. Whatever goes
wrong — a loop without end, a string of gigabytes, a recursion, a division by zero, no text, text that
is not Unicode — is one line naming the file the template came from.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tasks.errors import UserError

END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>", "</s>")
"""Tokens chat templates end a turn with (ChatML, Llama 3, Gemma, Phi, GPT-2's, SentencePiece's eos)."""

SANDBOX = Path(__file__).with_name("sandbox.py")
RENDER_SECONDS = 10.0
"""The wall-clock budget of one rendering (a real template takes milliseconds; the process starts in ~0.1 s)."""
CHARS_PER_POSITION = 16
"""A rendered prompt may hold this many characters per position of the model's context (about four times
what a token of text averages), and 16 × 32,768 when the model states no context: measured before the
text reaches the tokenizer."""


class TemplateRaised(UserError):
    """The template itself refused the conversation (``raise_exception`` in it)."""


def render_chat(
    template: str,
    messages: list[dict[str, str]],
    *,
    bos: str = "",
    eos: str = "",
    origin: str = "the model",
    context: int | None = None,
    seconds: float = RENDER_SECONDS,
) -> str:
    """The prompt ``template`` makes of ``messages`` ({"role", "content"} each), ending where the
    assistant's answer starts (``add_generation_prompt``), at most ``CHARS_PER_POSITION × context``
    characters; a UserError naming ``origin`` for a template that cannot be read, that reaches outside
    the sandbox, that runs past ``seconds`` or its memory, or that refuses the conversation."""
    max_chars = CHARS_PER_POSITION * (context or 32_768)
    request = dict(template=template, messages=messages, bos=bos, eos=eos, max_chars=max_chars, seconds=seconds)
    try:
        done = subprocess.run(
            [sys.executable, "-P", str(SANDBOX)],  # -P: only the standard library and jinja2, none of zoo
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=seconds,
        )
    except subprocess.TimeoutExpired:
        raise UserError(
            f"{origin}: its chat template did not finish in {seconds:g} s and was stopped; use a model "
            f"whose template only formats messages"
        ) from None
    try:
        result = json.loads(done.stdout)
    except ValueError:
        ended = (
            f"signal {signal.Signals(-done.returncode).name}" if done.returncode < 0 else f"status {done.returncode}"
        )
        raise UserError(
            f"{origin}: rendering its chat template ended with {ended} (over its {seconds:g} s of CPU or 1 GiB "
            f"of memory); use a model whose template only formats messages"
        ) from None
    if "refused" in result:
        raise TemplateRaised(f"the chat template refused the conversation: {result['refused']}")
    if "error" in result:
        raise UserError(f"{origin}: its chat template was refused: {result['error']}")
    return result["text"]


def end_of_turn(vocab: dict[str, int], template: str, eos: int | None) -> int | None:
    """The token a reply ends with: the first of :data:`END_OF_TURN` the template writes and the vocabulary
    has, else ``eos``."""
    for token in END_OF_TURN:
        if token in template and token in vocab:
            return vocab[token]
    return eos


def chat_prompt(task: Any, messages: list[dict[str, str]], origin: str) -> tuple[list[int], int | None]:
    """The ids of the conversation rendered by ``task``'s chat template (as the template writes them: no
    special tokens added), and the id a reply ends with; a UserError when the model has no template."""
    specials = task.special_tokens
    template = specials.chat_template
    if not template:
        raise UserError(
            f"chat=true: {origin} has no chat template (a base model, or one zoo-train trained); chat needs an "
            f"instruct model's (a GGUF file or HF folder of one, or a checkpoint started from one); drop chat=true"
        )
    tokenizer = task.tokenizer
    token = tokenizer.id_to_token
    bos = token(specials.bos) if specials.bos is not None else ""
    eos = token(specials.eos) if specials.eos is not None else ""
    text = render_chat(
        template, messages, bos=bos or "", eos=eos or "", origin=origin, context=task.model.max_positions
    )
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return ids, end_of_turn(tokenizer.get_vocab(), template, specials.eos)
