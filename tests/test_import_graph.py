"""zoo/'s inner walls: every module sits in one room, and an import (at module level or inside a
function: a lazy import is an arrow too) goes to its own room or to one below, never up, and no
imports run in a circle. A new module must be placed in ROOMS, so its arrows are checked from the start.
"""

from __future__ import annotations

import ast
from pathlib import Path

ZOO = Path(__file__).resolve().parents[1] / "zoo"

ROOMS: list[tuple[str, str]] = [  # bottom first: a room and the modules in it
    ("ground", "registry io folders ranges lazy measuring stack_role rules form losses logits prompts"),
    ("settings", "config rope_scaling kv_cache"),
    ("components", "mask norm sublayer position ffn moe kernels attention"),
    ("generation", "decoding sampling beam_search generation"),
    ("models", "kernel_inputs blocks zoo_model models presets pretrained adapters pipeline"),
    ("tools", "inspect stats quantize"),
    ("converters", "hf gguf"),
    ("doors", "__init__ cli"),
]


def _module(path: Path) -> str:
    parts = path.relative_to(ZOO.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(ZOO.rglob("*.py"))}


def room(module: str) -> int:
    """The index in ROOMS of ``module`` (a converter package's modules live in its room)."""
    name = "__init__" if module == "zoo" else module.split(".")[1]
    return next(i for i, (_, names) in enumerate(ROOMS) if name in names.split())


def arrows(module: str) -> set[str]:
    """The zoo modules ``module`` imports anywhere in its body, past ``if TYPE_CHECKING:`` blocks
    (annotations only): ``from pkg import sub`` is an arrow to the submodule, not to the package."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            subs = {f"{base}.{a.name}" for a in node.names} & MODULES.keys()
            found |= subs if len(subs) == len(node.names) else {base, *subs}
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
        except StopIteration:
            unplaced.append(module)
    assert not unplaced, f"place these in tests/test_import_graph.py's ROOMS: {unplaced}"


def test_no_arrow_runs_up():
    up = [
        f"{m} ({ROOMS[room(m)][0]}) -> {t} ({ROOMS[room(t)][0]})"
        for m in MODULES
        for t in sorted(arrows(m))
        if room(t) > room(m)
    ]
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
