"""Chat with a model's own template (issue 37, item 2): the template is rendered in Jinja's immutable
sandbox (it comes from a handed file: nothing in it may reach Python objects, files or the environment),
the reply ends at the end-of-turn token, and zoo-generate chat=true answers one prompt or holds a
conversation read from the terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

import zoo
from tasks.chat.templates import end_of_turn, render_chat
from tasks.cli.loading import load_task
from tasks.data.tokenizers import Specials
from tasks.errors import UserError

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SIMPLE = "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def test_a_chatml_template_renders_the_conversation_and_the_assistants_turn():
    text = render_chat(CHATML, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>assistant\n"
    assert render_chat(SIMPLE, [{"role": "user", "content": "x"}], bos="<s>") == "<s>user: x\nassistant:"


HOSTILE = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.environ }}",
    "{{ lipsum.__globals__['os'].environ }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ raise_exception.__globals__ }}",
    "{{ self._TemplateReference__context }}",
    "{% set x = messages.append({'role': 'user', 'content': 'injected'}) %}{{ messages }}",
    "{% include '/etc/passwd' %}",
    "{% import 'os' as os %}{{ os }}",
    "{{ messages[0].update({'content': 'x'}) }}",
]


@pytest.mark.parametrize("template", HOSTILE)
def test_a_template_reaching_outside_the_text_it_fills_is_refused(template, monkeypatch):
    monkeypatch.setenv("ZOO_SECRET_PROBE", "s3cr3t-value")
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(UserError) as refused:
        render_chat(template, messages, origin="model.gguf")
    assert str(refused.value).startswith("model.gguf: its chat template") and "s3cr3t" not in str(refused.value)
    assert "\n" not in str(refused.value)
    assert messages == [{"role": "user", "content": "hi"}]  # nothing changed the conversation


UNBOUNDED = {  # a template that would hang, exhaust memory or raise: each ends as one line, in seconds
    "{{ ''.__class__ }}": "tried to reach outside the text it fills",
    "{{ lipsum(n=100000000) }}": "cannot be rendered (UndefinedError",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x": "did not finish in 2 s",
    "{{ 'x' * 10**10 }}": "cannot be rendered (OverflowError: a product of 1 items",
    "{{ range(10**9) | list }}": "cannot be rendered (OverflowError",
    "{{ 2 ** 1000000000 }}": "cannot be rendered (OverflowError: a power",
    "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}": "recurses without end",
    "{{ 1/0 }}": "cannot be rendered (ZeroDivisionError",
    "{{ '\\ud800' }}": "not valid Unicode",
    "{# nothing #}  ": "renders no text",
    "{% for i in range(100000) %}{{ 'x' * 300 }}{% endfor %}": "renders more than 32,768 characters",
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}": (
        "needs more than 1024 MiB"
    ),
    "{% if %}": "cannot be rendered (TemplateSyntaxError",
    "{{ undefined_name.x }}": "cannot be rendered (UndefinedError",
}


@pytest.mark.parametrize("template", UNBOUNDED)
def test_a_template_that_would_not_end_ends_in_one_line(template):
    seconds = 2 if "did not finish" in UNBOUNDED[template] else 20  # the others end long before their budget
    with pytest.raises(UserError) as refused:
        render_chat(
            template, [{"role": "user", "content": "hi"}], origin="chat_template.jinja", context=2048, seconds=seconds
        )
    message = str(refused.value)
    assert message.startswith("chat_template.jinja: ") and "\n" not in message
    assert UNBOUNDED[template] in message, message


def test_a_template_that_refuses_the_conversation_says_so_in_one_line():
    template = (
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system message comes first') }}{% endif %}"
    )
    with pytest.raises(UserError, match="the chat template refused the conversation: a system message comes first"):
        render_chat(template, [{"role": "user", "content": "hi"}])


def test_the_reply_ends_at_the_templates_end_of_turn_token():
    vocab = {"<|im_end|>": 7, "</s>": 3, "a": 9}
    assert end_of_turn(vocab, CHATML, eos=3) == 7
    assert end_of_turn(vocab, SIMPLE, eos=3) == 3  # the template names none: eos
    assert end_of_turn({"a": 1}, CHATML, eos=None) is None


@pytest.fixture(scope="module")
def chat_ckpt(gpt_base, tmp_path_factory):
    """The tiny generator's checkpoint, given a chat template (as one started from an instruct model has)."""
    ckpt = zoo.load_weights_file(gpt_base)
    ckpt["tokenizer_specials"] = replace(Specials.zoo(), chat_template=SIMPLE, origin="test").record()
    path = tmp_path_factory.mktemp("chat") / "chat.ckpt"
    torch.save(ckpt, path)
    return path


def test_the_task_answers_the_rendered_conversation(chat_ckpt, monkeypatch):
    task, _ = load_task(chat_ckpt)
    seen = {}
    generate = task.model.generate

    def spy(ids, *args, **kwargs):
        seen["ids"], seen["eos"] = ids[0].tolist(), kwargs.get("eos_token_id")
        return generate(ids, *args, **kwargs)

    monkeypatch.setattr(task.model, "generate", spy)
    settings = dict(max_new_tokens=4, do_sample=False, temperature=1.0, top_k=None, top_p=None, seed=0)
    reply = task.chat([{"role": "user", "content": "def f"}], origin="chat.ckpt", **settings)
    rendered = task.tokenizer.id_to_token(Specials.zoo().bos) + "user: def f\nassistant:"
    assert seen["ids"] == task.tokenizer.encode(rendered, add_special_tokens=False).ids
    assert seen["eos"] == Specials.zoo().eos and isinstance(reply, str)


def _generate(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, "-m", "tasks.cli.generate", *args]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_zoo_generate_chats_once_and_as_a_conversation(chat_ckpt, gpt_base):
    once = _generate(f"ckpt_path={chat_ckpt}", "chat=true", "prompt=def f", "max_new_tokens=4", "do_sample=false")
    assert once.returncode == 0, once.stderr[-2000:]
    assert "assistant:" not in once.stdout  # the reply alone, not the rendered prompt
    talk = _generate(f"ckpt_path={chat_ckpt}", "chat=true", "max_new_tokens=3", stdin="def f\nclass A\n")
    assert talk.returncode == 0, talk.stderr[-2000:]
    assert len(talk.stdout.splitlines()) >= 1
    plain = _generate(f"ckpt_path={gpt_base}", "chat=true", "prompt=hi")
    assert plain.returncode == 2 and "has no chat template" in plain.stderr and "Traceback" not in plain.stderr


@pytest.mark.slow
def test_zoo_generate_ends_a_hostile_handed_template_in_one_line(gpt_base, tmp_path):
    ckpt = zoo.load_weights_file(gpt_base)
    hostile = "{{ 'x' * 10**10 }}{{ ''.__class__ }}"
    ckpt["tokenizer_specials"] = replace(Specials.zoo(), chat_template=hostile, origin="test").record()
    path = tmp_path / "hostile.ckpt"
    torch.save(ckpt, path)
    done = _generate(f"ckpt_path={path}", "chat=true", "prompt=hi", "max_new_tokens=2")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    (line,) = [line for line in done.stderr.splitlines() if line.strip()]
    assert "its chat template was refused" in line and "OverflowError" in line
