"""The guide stays true: every ``zoo-*`` command in README.md and docs/*.md composes as its verb composes
it (Hydra and zoo's own checks, no training), every refusal the guide quotes is what the command prints
now, and every relative link and anchor resolves.

A command is read as a user would copy it: from a code block (one a line, ``\\`` continuing it, a
``$ `` prompt and ``# comments`` dropped, ``NAME=value`` lines of the block expanded where ``$NAME``
is used) or from an inline code span that starts with the verb and gives it arguments. What the
reader fills in is handled as :data:`PLACEHOLDERS` says; a failure names the page and line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

import zoo
from tasks.cli.attention.maps import check_thresholds
from tasks.cli.composition import config_groups
from tasks.cli.console import quote_free_text
from tasks.cli.export.formats import EXPORT_FORMATS
from tasks.cli.schemas import conf_dir
from tasks.cli.train.checks import check_composition, check_export
from tasks.cli.values import check_values

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
VERBS = ("train", "eval", "generate", "export", "attention", "info", "sweep-report")
VERB = re.compile(r"(?:^|(?<=[\s;|&(]))zoo-(?:" + "|".join(VERBS) + r")(?=\s|$)")

PLACEHOLDER = "placeholder"
PLACEHOLDERS = {
    "<…>": "what the reader fills in (<run dir>, <ckpt>, <date>): replaced by placeholder",
    "$(…)": "a path the shell computes ($(python -c …)): replaced by placeholder",
    "group=<…>": "a config group choice the reader adds (model/position=<name>): the override is left out",
    "free memory": "check_fits asks this machine's free memory, not the command: skipped",
}
"""What the test does with what a command leaves to the reader. Paths are not opened when a config is
composed, so any text stands for them."""

HYDRA_FLAGS = {"-m", "--multirun", "--help", "-h", "--hydra-help", "--resolve", "--version", "--info", "-i"}
HYDRA_OPTIONS = {"--cfg": ("job", "hydra", "all"), "-c": ("job", "hydra", "all"), "--package": None, "-p": None}
"""The Hydra command-line flags the guide may use, and those that take a value (with its choices)."""


@dataclass
class Command:
    page: str  # relative to the repository
    line: int
    verb: str  # "train", "info", …
    args: list[str]
    refusal: str | None = None  # the zoo: … line the guide quotes after it
    quoted: list[str] = field(default_factory=list)  # the command line as the guide shows it

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: zoo-{self.verb} {' '.join(self.args)}"


# ---- reading the pages --------------------------------------------------------------------------------
def blocks_and_prose(text: str) -> tuple[list[tuple[str, int, list[str]]], list[tuple[int, str]]]:
    """The fenced code blocks of a page (info string, first line number, lines) and its other lines."""
    blocks, prose, fence = [], [], None
    for number, line in enumerate(text.splitlines(), 1):
        opening = re.match(r"^\s*(```+|~~~+)\s*(\S*)", line)
        if fence is None and opening:
            fence, info, start, body = opening.group(1), opening.group(2), number + 1, []
        elif fence is not None and line.strip().startswith(fence):
            blocks.append((info, start, body))
            fence = None
        elif fence is not None:
            body.append(line)
        else:
            prose.append((number, line))
    return blocks, prose


def substituted(text: str) -> str:
    """``text`` with what the reader fills in replaced by ``placeholder`` (:data:`PLACEHOLDERS`: ``$(…)``
    and ``<…>``)."""
    while "$(" in text:  # a shell command's output, its parentheses balanced
        start = text.index("$(")
        depth, end = 0, start + 1
        for end in range(start + 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        text = text[:start] + PLACEHOLDER + text[end + 1 :]
    return re.sub(r"<[^<>\n]*>", PLACEHOLDER, text)


def command_at(text: str) -> list[str] | None:
    """The words of the first zoo-* command in a shell line (up to ``&&``, ``|``, ``;`` or a comment)."""
    found = VERB.search(text)
    if found is None:
        return None
    lexer = shlex.shlex(text[found.start() :], posix=True, punctuation_chars="|&;")
    lexer.whitespace_split = True
    words = []
    for word in lexer:
        if set(word) <= set("|&;"):
            break
        words.append(word)
    return words


def page_commands(page: Path) -> list[Command]:
    """Every zoo-* command of one page: in code blocks and in inline code."""
    name = str(page.relative_to(ROOT))
    blocks, prose = blocks_and_prose(page.read_text(encoding="utf-8"))
    commands = []
    for info, start, body in blocks:
        if info in ("python", "pycon", "yaml", "json"):
            continue
        variables: dict[str, str] = {}
        lines = _joined(body, start)
        for i, (number, line) in enumerate(lines):
            shown = line[2:] if line.startswith("$ ") else line
            text = substituted(shown)
            for variable, value in variables.items():
                text = re.sub(rf"\$\{{?{variable}\b\}}?", lambda _: value, text)  # noqa: B023
            assignment = re.match(r"^([A-Z_][A-Z0-9_]*)=(\S.*)$", text)
            if assignment:
                variables[assignment.group(1)] = shlex.split(assignment.group(2), comments=True)[0]
                continue
            words = command_at(text)
            if words is None or text.lstrip().startswith("#"):
                continue
            output = lines[i + 1][1] if line.startswith("$ ") and i + 1 < len(lines) else ""
            refusal = output if output.startswith("zoo: ") else None
            commands.append(Command(name, number, words[0].removeprefix("zoo-"), words[1:], refusal, [shown]))
    for number, line in prose:
        for span in re.findall(r"`([^`]+)`", line):
            if re.match(r"zoo-(?:" + "|".join(VERBS) + r")\s", span):  # the verb's name alone is no command
                words = command_at(substituted(span))
                commands.append(Command(name, number, words[0].removeprefix("zoo-"), words[1:], quoted=[span]))
    return commands


def _joined(body: list[str], start: int) -> list[tuple[int, str]]:
    """The block's lines with ``\\`` continuations joined, each with the number of its first line."""
    lines, pending, first = [], "", None
    for offset, line in enumerate(body):
        first = start + offset if first is None else first
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append((first, pending + line))
        pending, first = "", None
    return lines


COMMANDS = [command for page in PAGES for command in page_commands(page)]


# ---- composing a command ----------------------------------------------------------------------------
def hydra_overrides(command: Command) -> list[str]:
    """The overrides a Hydra verb composes: flags checked and dropped, a ``-m`` sweep's first value of each
    swept list (a range's start, an interval's low end), a placeholder group choice left out."""
    multirun = any(a in ("-m", "--multirun") for a in command.args)
    given, args = [], iter(FREE_TEXT.get(command.verb, list)(command.args))
    for arg in args:
        if arg in HYDRA_OPTIONS:
            value = next(args, None)
            choices = HYDRA_OPTIONS[arg]
            assert value is not None and (choices is None or value in choices), f"{command}: {arg} {value}"
        elif arg.startswith("-"):
            assert arg in HYDRA_FLAGS, f"{command}: {arg} is not a flag of Hydra's command line"
        else:
            given.append(arg)
    groups = set(config_groups())
    overrides = []
    for override in OverridesParser.create().parse_overrides(given):
        key = override.get_key_element()
        value = override.value()
        if override.is_sweep_override():
            assert multirun, f"{command}: {key} sweeps, which needs -m"
            first = {
                ChoiceSweep: lambda v: v.list[0],
                RangeSweep: lambda v: v.start,
                IntervalSweep: lambda v: v.start,
            }[type(value)](value)
            overrides.append(f"{key}={override._get_value_element_as_str(first)}")
        elif key.lstrip("+~") in groups and PLACEHOLDER in str(value):
            continue  # the reader's own new choice of a config group
        else:
            overrides.append(f"{key}={override.get_value_element_as_str()}")
    return overrides


HYDRA_VERBS = ("train", "eval", "generate", "export", "attention")  # each composes conf/<verb>.yaml


def composed(command: Command):
    """Compose the command's config as its verb does, and run the verb's checks that need no file."""
    overrides = hydra_overrides(command)
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose(command.verb, overrides=overrides)
    if command.verb == "train":
        check_values(cfg)
        check_export(cfg, check_composition(cfg))
    elif command.verb == "eval":
        assert cfg.split in ("test", "val")
        check_values(cfg)
    elif command.verb == "export":
        EXPORT_FORMATS.get(cfg.format, field="format").from_config(cfg)
    elif command.verb == "attention":
        check_thresholds(cfg)
    return cfg


FREE_TEXT = {
    "generate": quote_free_text,
    "attention": lambda args: quote_free_text(args, keys=("prompt", "text", "target")),
}
"""The verbs whose free text passes through Hydra's grammar quoted (tasks.cli.verbs does it to argv)."""


class Parsed(Exception):
    """Raised in place of running a verb once argparse has read its command line."""


def parsed(entry, args: list[str], monkeypatch) -> argparse.Namespace:
    """What ``entry``'s argparse parser makes of ``args``; the verb itself does not run."""
    original = argparse.ArgumentParser.parse_args

    def parse_only(self, args=None, namespace=None):
        raise Parsed(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    with pytest.raises(Parsed) as done:
        entry(args)
    return done.value.args[0]


@pytest.fixture
def machine_free(monkeypatch):
    """check_fits asks the free memory of this machine: not the command's question (PLACEHOLDERS)."""
    monkeypatch.setattr("tasks.cli.train.checks.free_bytes", lambda device: None)


def test_the_guide_names_commands_of_every_verb():
    assert {c.verb for c in COMMANDS} == set(VERBS)
    assert len(COMMANDS) > 80 and {c.page for c in COMMANDS} >= {"README.md", "docs/overrides-and-sweeps.md"}


def same_commands(verbs: tuple[str, ...]) -> list[list[Command]]:
    """The guide's commands of ``verbs`` (refusals left out: the test below runs them), the places
    that show one command grouped together, so each is composed once."""
    groups: dict[tuple[str, ...], list[Command]] = {}
    for command in COMMANDS:
        if command.verb in verbs and command.refusal is None:
            groups.setdefault((command.verb, *command.args), []).append(command)
    return list(groups.values())


@pytest.mark.parametrize("places", same_commands(HYDRA_VERBS), ids=lambda p: f"{p[0].page}:{p[0].line}")
def test_every_command_of_the_guide_composes(places, machine_free, capsys):
    try:
        composed(places[0])
    except Exception as error:  # noqa: BLE001  (the pages and lines name what no longer composes)
        shown = "\n".join(map(str, places))
        pytest.fail(f"{shown}\n  no longer composes: {type(error).__name__}: {error}")


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.verb == "info"], ids=lambda c: f"{c.page}:{c.line}")
def test_every_zoo_info_command_parses_and_names_presets(command, monkeypatch):
    from zoo.cli import info_main

    args = parsed(info_main, command.args, monkeypatch)
    for pattern in args.models:
        if "/" not in pattern and PLACEHOLDER not in pattern:  # a path is the reader's file
            assert zoo.list_models(pattern), f"{command}: {pattern!r} matches no preset"


@pytest.mark.parametrize(
    "command", [c for c in COMMANDS if c.verb == "sweep-report"], ids=lambda c: f"{c.page}:{c.line}"
)
def test_every_zoo_sweep_report_command_parses(command, monkeypatch):
    from hydra_plugins.zoo_optuna_sweeper.report import main

    assert parsed(main, command.args, monkeypatch).sweep_dir


def test_a_command_that_no_longer_composes_is_seen(machine_free):
    typo = Command("docs/example.md", 7, "train", ["model/position=rop"])
    with pytest.raises(Exception, match="model/position"):
        composed(typo)
    with pytest.raises(AssertionError, match="needs -m"):
        hydra_overrides(Command("docs/example.md", 8, "train", ["model/position=rope,alibi"]))
    sweep = Command("x.md", 1, "train", ["-m", "optimizer.lr=tag(log, interval(1e-4, 1e-2))", "model.n_layers=2,4"])
    assert hydra_overrides(sweep) == ["optimizer.lr=0.0001", "model.n_layers=2"]


def test_commands_are_read_as_a_user_copies_them(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        textwrap.dedent("""\
        Run `zoo-eval ckpt_path=<run dir>/last.ckpt` or:

        ```bash
        G=$(python -c "print(1)")/model.gguf
        pip install -e . && zoo-train -m model=llama-tiny \\
          trainer=ddp   # a comment
        zoo-generate ckpt_path=$G prompt="def f(x):"
        ```

        ```
        $ zoo-train model.n_heads=5
        zoo: ConfigError: n_heads=5 …
        ```
        """)
    )
    original = ROOT
    try:
        globals()["ROOT"] = tmp_path
        found = page_commands(page)
    finally:
        globals()["ROOT"] = original
    assert [(c.line, c.verb, c.args, c.refusal) for c in found] == [
        (5, "train", ["-m", "model=llama-tiny", "trainer=ddp"], None),
        (7, "generate", ["ckpt_path=placeholder/model.gguf", "prompt=def f(x):"], None),
        (11, "train", ["model.n_heads=5"], "zoo: ConfigError: n_heads=5 …"),
        (1, "eval", ["ckpt_path=placeholder/last.ckpt"], None),
    ]


# ---- the refusals the guide quotes ----------------------------------------------------------------------
REFUSING = textwrap.dedent("""\
    import contextlib, io, json, sys
    import tasks.cli.train.training
    from tasks.cli import verbs

    def composed_and_checked(*args, **kwargs):  # the run was not refused: stop before any data is read
        print("zoo: (not refused: the run would start here)", file=sys.stderr)
        sys.exit(0)

    tasks.cli.train.training.build = composed_and_checked
    entries = {"train": verbs.train, "eval": verbs.evaluate, "generate": verbs.generate,
               "export": verbs.export, "attention": verbs.attention}
    said = []
    for verb, args in json.loads(sys.argv[1]):
        sys.argv, err, code = [f"zoo-{verb}", *args], io.StringIO(), 0
        with contextlib.redirect_stderr(err):
            try:
                entries[verb]()
            except SystemExit as stop:
                code = stop.code
        said.append([code, err.getvalue()])
    print(json.dumps(said))
""")


def test_every_refusal_the_guide_quotes_is_what_the_command_prints(tmp_path):
    """Each ``$ zoo-…`` line the guide follows with a ``zoo: …`` line, run by the real verb (all in one
    process, in an empty folder): it ends with exit status 2 and prints that line."""
    quoted = [c for c in COMMANDS if c.refusal is not None]
    assert len(quoted) >= 3
    done = subprocess.run(
        [sys.executable, "-c", REFUSING, json.dumps([[c.verb, c.args] for c in quoted])],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    wrong = []
    for command, (code, err) in zip(quoted, json.loads(done.stdout.splitlines()[-1]), strict=True):
        lines = [line for line in err.splitlines() if line.startswith("zoo: ") and "warning" not in line]
        if code != 2 or lines != [command.refusal]:
            wrong.append(f"{command}\n  the guide quotes: {command.refusal}\n  zoo prints now:   {' | '.join(lines)}")
    assert not wrong, "\n".join(wrong)


def library_refusals() -> list[tuple[str, int, str, str]]:
    """``>>> expression`` lines of the guide's pycon blocks followed by the ``zoo.ConfigError: …`` they raise."""
    found = []
    for page in PAGES:
        for info, start, body in blocks_and_prose(page.read_text(encoding="utf-8"))[0]:
            for i, line in enumerate(body[:-1]):
                if info == "pycon" and line.startswith(">>> ") and body[i + 1].startswith("zoo."):
                    found.append((str(page.relative_to(ROOT)), start + i, line[4:], body[i + 1]))
    return found


@pytest.mark.parametrize(("page", "line", "expression", "error"), library_refusals())
def test_every_library_error_the_guide_quotes_is_what_zoo_raises(page, line, expression, error):
    with pytest.raises(zoo.ConfigError) as raised:
        eval(expression, {"zoo": zoo})
    assert f"zoo.{type(raised.value).__name__}: {raised.value}" == error, f"{page}:{line}"


def test_the_ctrl_c_line_the_guide_quotes_is_what_a_training_run_prints(tmp_path, capsys):
    from types import SimpleNamespace

    from tasks.cli.boundary import user_errors
    from tasks.cli.train.training import interrupts_said

    page = (ROOT / "docs" / "when-things-go-wrong.md").read_text(encoding="utf-8")
    (quoted,) = re.findall(r"`(zoo: interrupted; [^`]*)`", page)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"")
    trainer = SimpleNamespace(interrupted=True, callbacks=[])

    @user_errors
    def fitting():
        with interrupts_said(trainer, run_dir):
            sys.exit(1)  # what Lightning does after its graceful shutdown on Ctrl-C

    with pytest.raises(SystemExit) as stop:
        fitting()
    assert stop.value.code == 130
    assert capsys.readouterr().err.strip() == quoted.replace("<run dir>", str(run_dir))


# ---- links ----------------------------------------------------------------------------------------------
def github_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page: each heading's slug (-1, -2 … for repeats) and explicit ids."""
    anchors, seen = set(), {}
    for _, line in blocks_and_prose(text)[1]:
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading is None:
            continue
        words = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1)).replace("`", "").replace("*", "")
        slug = re.sub(r"[^\w\- ]", "", words.lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors | set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))


def links(page: Path) -> list[tuple[int, str]]:
    """The relative links and images of a page's prose (code spans and blocks left out)."""
    found = []
    for number, line in blocks_and_prose(page.read_text(encoding="utf-8"))[1]:
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", re.sub(r"`[^`]*`", "", line)):
            if not re.match(r"^[a-z]+:", target):
                found.append((number, target))
    return found


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in PAGES:
        for number, target in links(page):
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            if not file.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in github_anchors(file.read_text(encoding="utf-8")):
                broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)
    assert sum(len(links(page)) for page in PAGES) > 40  # the links were found


def test_github_anchors_follow_githubs_rules():
    text = "# The map\n## One GPU: `trainer=gpu`\n## A — B\n## The map\n```\n# not a heading\n```\n"
    assert github_anchors(text) == {"the-map", "one-gpu-trainergpu", "a--b", "the-map-1"}
