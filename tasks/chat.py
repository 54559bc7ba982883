"""A chat model's own chat template, rendered in a sandbox: the template comes from a handed file (a GGUF
file's ``tokenizer.chat_template``, an HF folder's chat_template.jinja), so it is text to fill, never
code to run. Jinja's immutable sandbox refuses every attribute that reaches Python's insides
(``__class__``, ``__globals__`` …) and every change to an object; no loader is set, so ``include`` and
``import`` find nothing; the template sees the messages, the special tokens and two helpers
transformers gives templates too (``raise_exception``, ``strftime_now``), nothing else.
"""

from __future__ import annotations

import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from tasks.errors import UserError

END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>", "</s>")
"""Tokens chat templates end a turn with (ChatML, Llama 3, Gemma, Phi, GPT-2's, SentencePiece's eos)."""


class TemplateRaised(UserError):
    """The template itself refused the conversation (``raise_exception`` in it)."""


def _raise(message: str) -> None:
    raise TemplateRaised(f"the chat template refused the conversation: {message}")


def _now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def render_chat(
    template: str, messages: list[dict[str, str]], *, bos: str = "", eos: str = "", origin: str = "the model"
) -> str:
    """The prompt ``template`` makes of ``messages`` ({"role", "content"} each), ending where the
    assistant's answer starts (``add_generation_prompt``); a UserError naming ``origin`` for a template
    that cannot be read, that reaches outside the sandbox, or that refuses the conversation."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.globals.update(raise_exception=_raise, strftime_now=_now)
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos, tools=None
        )
    except SecurityError as error:
        raise UserError(
            f"{origin}: its chat template tried to reach outside the text it fills ({error}); it was "
            f"refused: use a model whose template only formats messages"
        ) from None
    except TemplateRaised:
        raise
    except (TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError) as error:
        raise UserError(f"{origin}: its chat template cannot be rendered ({type(error).__name__}: {error})") from None


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
    text = render_chat(template, messages, bos=bos or "", eos=eos or "", origin=origin)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return ids, end_of_turn(tokenizer.get_vocab(), template, specials.eos)
