"""The inner walls of zoo/ and tasks/: every module sits in one room, and an import (at module level or
inside a function: a lazy import is an arrow too, and so is a name a package loads on first use with
``zoo.lazy.names_from``) goes to its own room or to one below, never up, and no imports run in a
circle. zoo/'s rooms all sit below tasks/' (zoo never imports tasks). A new module must be placed in
ROOMS, so its arrows are checked from the start; an import under ``if TYPE_CHECKING:`` (annotations
only) is no arrow.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# bottom first: a room and the modules in it, named inside their package; ``pkg.*`` is a package and
# every module in it (the folders one adds a module to: a converter, a data source, a file format)
ZOO_ROOMS: list[tuple[str, str]] = [
    ("ground", "registry io folders ranges lazy measuring stack_role rules form losses logits prompts"),
    ("settings", "config rope_scaling kv_cache"),
    ("components", "mask norm sublayer position ffn moe kernels attention"),
    ("generation", "decoding sampling beam_search generation"),
    ("models", "kernel_inputs blocks zoo_model models presets pretrained adapters pipeline"),
    ("tools", "inspect stats quantize"),
    ("converters", "hf.* gguf.*"),
    ("doors", "__init__ cli"),
]
TASKS_ROOMS: list[tuple[str, str]] = [
    ("ground", "errors optim strategy text_metrics"),
    (
        "data",
        "data data.loading data.columns data.token_files data.prepared data.tokenizers data.settings "
        "data.formats.* data.sources.* data.text_module data.modules data.registry",
    ),
    (
        "the run's machinery",
        "run run.checkpoints run.run_dirs run.loggers run.trackers run.precision run.init_from run.resume "
        "run.callbacks chat chat.templates chat.sandbox",
    ),
    ("the tasks", "base generator classifier mlm translator registry __init__"),
    (
        "strategies",
        "parallel parallel.plan parallel.checks parallel.layers parallel.fsdp parallel.base "
        "parallel.tensor parallel.pipeline",
    ),
    (
        "what the verbs share",
        "cli cli.console cli.schemas cli.values cli.composition cli.conf_rules cli.loading cli.pretrained "
        "cli.resuming cli.hydra_callbacks cli.boundary",
    ),
    (
        "the verbs' wings",
        "cli.train cli.train.checks cli.train.plan cli.train.training "
        "cli.export cli.export.checker cli.export.destination cli.export.hf cli.export.gguf cli.export.onnx "
        "cli.export.formats cli.export.card cli.export.exporting "
        "cli.attention cli.attention.heads cli.attention.plots cli.attention.maps cli.evaluate cli.generate",
    ),
    (
        "the doors",
        "cli.verbs cli.train.__main__ cli.export.__main__ cli.attention.__main__ cli.evaluate.__main__ "
        "cli.generate.__main__",
    ),
]
ROOMS: list[tuple[str, str, str]] = [  # (tree, room, modules): zoo's rooms below tasks'
    *(("zoo", name, modules) for name, modules in ZOO_ROOMS),
    *(("tasks", name, modules) for name, modules in TASKS_ROOMS),
]


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for tree in ("zoo", "tasks") for p in sorted((ROOT / tree).rglob("*.py"))}


def room(module: str) -> int:
    """The index in ROOMS of ``module``; LookupError when no room holds it."""
    tree, _, inside = module.partition(".")
    inside = inside or "__init__"
    for i, (where, _, names) in enumerate(ROOMS):
        for name in names.split() if where == tree else ():
            package = name.removesuffix(".*")
            if inside == name or (name.endswith(".*") and (inside == package or inside.startswith(package + "."))):
                return i
    raise LookupError(module)


def label(module: str) -> str:
    tree, name, _ = ROOMS[room(module)]
    return f"{module} ({tree}: {name})"


def arrows(module: str) -> set[str]:
    """The zoo and tasks modules ``module`` imports anywhere in its body, past ``if TYPE_CHECKING:``
    blocks (annotations only): ``from pkg import sub`` is an arrow to the submodule, not to the
    package; a package whose ``__getattr__`` is ``names_from`` points at each module it names."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    nodes = list(_runtime_nodes(ast.parse(path.read_text())))
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            subs = {f"{base}.{a.name}" for a in node.names} & MODULES.keys()
            found |= subs if len(subs) == len(node.names) else {base, *subs}
    if any(isinstance(n, ast.Call) and ast.unparse(n.func).endswith("names_from") for n in nodes):
        found |= {n.value for n in nodes if isinstance(n, ast.Constant) and n.value in MODULES}
    return {m for m in found if m in MODULES and m != module}


def _runtime_nodes(tree: ast.AST):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for branch in node.orelse for n in [branch, *_runtime_nodes(branch)])
            continue
        yield node
        yield from _runtime_nodes(node)


def test_every_module_has_a_room():
    unplaced = []
    for module in MODULES:
        try:
            room(module)
        except LookupError:
            unplaced.append(module)
    assert not unplaced, f"place these in tests/test_import_graph.py's ROOMS: {unplaced}"


def test_no_arrow_runs_up():
    up = [f"{label(m)} -> {label(t)}" for m in MODULES for t in sorted(arrows(m)) if room(t) > room(m)]
    assert not up, up


def test_no_import_cycle():
    graph = {m: arrows(m) for m in MODULES}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return [*path[path.index(t) :], t] if t in path else [m, t]
            if t not in state and (cycle := visit(t, [*path, t])):
                return cycle
        state[m] = 2
        return None

    for m in MODULES:
        if m not in state:
            cycle = visit(m, [m])
            assert cycle is None, " -> ".join(cycle)


def test_the_rooms_cover_both_trees():
    """The walls hold where the code is: every module of tasks/ (its verbs' wings and doors included)
    and of zoo/ is read, and each tree's rooms name only modules that exist."""
    assert {
        "tasks.cli.train.training",
        "tasks.cli.verbs",
        "tasks.cli.train.__main__",
        "zoo.zoo_model",
    } <= MODULES.keys()
    for tree, name, names in ROOMS:
        for listed in names.split():
            inside = listed.removesuffix(".*")
            module = tree if inside == "__init__" else f"{tree}.{inside}"
            assert module in MODULES, f"{tree}'s room {name!r} names {listed}, which is no module"


def test_the_walker_sees_a_lazy_arrow(tmp_path):
    """A check that cannot fail proves nothing: an import inside a function is found, one under
    TYPE_CHECKING is not, and ``from zoo.hf import mapping`` points at the submodule."""
    code = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from zoo.models import ZooModel\n"
        "def f():\n    from zoo.generation import generate\nfrom zoo.hf import mapping\n"
    )
    nodes = list(_runtime_nodes(ast.parse(code)))
    named = {n.module for n in nodes if isinstance(n, ast.ImportFrom)}
    assert named == {"typing", "zoo.generation", "zoo.hf"}
    assert "zoo.generation" in arrows("zoo.zoo_model")  # ZooModel.generate's door, one room down
    assert room("zoo.generation") < room("zoo.zoo_model")
    # the verbs load each wing inside a function; a wing's python -m door imports the verbs
    assert "tasks.cli.train.training" in arrows("tasks.cli.verbs")
    assert "tasks.cli.verbs" in arrows("tasks.cli.train.__main__")
    assert room("tasks.cli.train.training") < room("tasks.cli.verbs")
    # names a package loads on first use are arrows too (tasks/__init__.py names its tasks' homes)
    assert "tasks.registry" in arrows("tasks")
    assert room("zoo.cli") < room("tasks.errors")  # every zoo room sits below every tasks room
