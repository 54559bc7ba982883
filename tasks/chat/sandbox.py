"""A handed chat template rendered in a process of its own, bounded in time, memory and output.

``tasks.chat.templates.render_chat`` runs this file as a script (``python -P tasks/chat/sandbox.py``:
only the standard library and jinja2 are imported, nothing of zoo's) with the template and the conversation as
JSON on stdin; it prints one JSON object: ``{"text": …}`` or ``{"error": …}``. The process limits its
own address space and CPU time, and the parent kills it after a wall-clock budget, so a template that
loops, recurses or multiplies strings ends as a message, never as a hang or a lost parent.

Inside, Jinja's immutable sandbox refuses every attribute that reaches Python's insides (``__class__``,
``__globals__`` …: refused, not rendered as empty text) and every change to an object; ``range`` is the
sandbox's (at most 100,000 items); a string or list product and a power are checked before they are
computed; ``lipsum`` is gone; no loader is set, so ``include`` and ``import`` find nothing.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import operator
import sys
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

MEMORY_BYTES = 1 << 30
"""The rendering process's address space (Linux enforces it; elsewhere the wall-clock budget holds)."""


class Refused(Exception):
    """The template itself refused the conversation (``raise_exception`` in it)."""


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with unsafe attributes refused and products checked before they are made."""

    intercepted_binops = frozenset({"*", "**"})

    def __init__(self, max_chars: int) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, autoescape=False)
        self.max_chars = max_chars
        self.globals.pop("lipsum", None)
        self.globals.update(raise_exception=_raise, strftime_now=_now)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is unsafe")

    def call_binop(self, context: Any, op: str, left: Any, right: Any) -> Any:
        if op == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(times, int) and len(seq) * times > self.max_chars:
                    raise OverflowError(f"a product of {len(seq):,} items × {times:,} is longer than the prompt may be")
            return operator.mul(left, right)
        if isinstance(left, int) and isinstance(right, int) and abs(right) > 1024:
            raise OverflowError(f"a power with the exponent {right:,}")
        return operator.pow(left, right)


def _raise(message: str) -> None:
    raise Refused(message)


def _now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def render(template: str, messages: list[dict[str, str]], bos: str, eos: str, max_chars: int) -> dict[str, str]:
    """``{"text": prompt}``, or ``{"error": what went wrong}`` in words a one-line refusal can carry."""
    env = BoundedSandbox(max_chars)
    try:
        chunks, size = [], 0
        stream = env.from_string(template).generate(
            messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos, tools=None
        )
        for chunk in stream:
            size += len(chunk)
            if size > max_chars:
                return {"error": f"it renders more than {max_chars:,} characters, more than the model's context holds"}
            chunks.append(chunk)
        text = "".join(chunks)
    except Refused as error:
        return {"refused": str(error)}
    except SecurityError as error:
        return {"error": f"it tried to reach outside the text it fills ({error})"}
    except RecursionError:
        return {"error": "it recurses without end (RecursionError)"}
    except MemoryError:
        return {"error": f"it needs more than {MEMORY_BYTES >> 20} MiB to render (MemoryError)"}
    except (TemplateError, ArithmeticError, TypeError, ValueError, AttributeError, KeyError, IndexError) as error:
        return {"error": f"it cannot be rendered ({type(error).__name__}: {error})"}
    if not text.strip():
        return {"error": "it renders no text for this conversation"}
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return {"error": f"it renders text that is not valid Unicode ({error.reason} at character {error.start})"}
    return {"text": text}


def _limit(seconds: float) -> None:
    """This process's memory and CPU time, where the system has such limits (POSIX)."""
    try:
        import resource
    except ImportError:  # Windows: the parent's wall-clock budget alone
        return
    cpu = int(seconds) + 1
    for which, value in ((resource.RLIMIT_AS, MEMORY_BYTES), (resource.RLIMIT_CPU, cpu)):
        with contextlib.suppress(ValueError, OSError):  # a lower hard limit is set, or macOS refuses RLIMIT_AS
            resource.setrlimit(which, (value, value))


def main() -> None:
    request = json.load(sys.stdin)
    _limit(request["seconds"])
    result = render(request["template"], request["messages"], request["bos"], request["eos"], request["max_chars"])
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
