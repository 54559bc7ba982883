"""The wheel a user installs holds the whole tree: every module of zoo/, tasks/ and hydra_plugins/ and
every conf/ YAML (as tasks/conf/), and nothing else. A subpackage that packaging leaves out fails here
by name. (scripts/wheel_check.sh, run by .ci/run, installs the wheel outside the tree and runs the verbs.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]


def _tree() -> set[str]:
    """What the wheel must hold, as paths inside it."""
    modules = {
        p.relative_to(ROOT).as_posix()
        for top in ("zoo", "tasks", "hydra_plugins")
        for p in (ROOT / top).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    configs = {"tasks/conf/" + p.relative_to(ROOT / "conf").as_posix() for p in (ROOT / "conf").rglob("*.yaml")}
    return modules | configs


def _packages(paths: set[str]) -> set[str]:
    return {str(PurePosixPath(p).parent).replace("/", ".") for p in paths}


def test_the_wheel_holds_every_module_and_config(tmp_path):
    # from a copy: setuptools' build/ folder in a checkout keeps what an earlier build shipped
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):  # what the build reads, and the packages' folders
        shutil.copy2(ROOT / name, source / name)
    for folder in ("zoo", "tasks", "hydra_plugins", "conf"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = tmp_path.glob("zoo-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n}
    tree = _tree()
    missing, extra = tree - shipped, shipped - tree
    assert not missing, f"left out of the wheel: packages {sorted(_packages(missing))}; files {sorted(missing)[:20]}"
    assert not extra, f"in the wheel but not in the tree: {sorted(extra)[:20]}"
    assert "tasks/conf/train.yaml" in shipped and "tasks/parallel/tensor.py" in shipped
