"""The README's set-up (issue 37, item 1): a copy-paster on a CPU machine gets the CPU build of PyTorch
before anything pulls the CUDA one, there is a way when the CPU index cannot be reached, and what the
README says of .ci/run is what .ci/run does."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def _setup() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text[text.index("## Set-up") : text.index("\n## ", text.index("## Set-up") + 1)]


def test_the_first_commands_install_the_cpu_torch_before_the_project():
    block = re.search(r"```bash\n(.*?)```", _setup(), flags=re.DOTALL).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert len(commands) == 2  # one runs the main job, one passes the tests
    for command in commands:
        steps = [step.strip() for step in command.split("&&")]
        assert steps[0] == f"pip install torch {CPU_INDEX}"
        assert any(step.startswith("pip install -e ") for step in steps[1:])
    assert commands[0].endswith("zoo-train") and commands[1].endswith("python -m pytest")


def test_there_is_a_way_without_the_cpu_index_and_ci_agrees():
    setup = _setup()
    assert "cannot be reached" in setup and "pip install torch-*.whl" in setup
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    pinned = re.search(r"torch==([\d.]+)", ci).group(1)
    assert f"torch=={pinned}" in setup and "CPU build" in ci.split(f"torch=={pinned}")[1].splitlines()[0]
    assert ci.index(f"torch=={pinned}") < ci.index('-e ".[dev]"')  # CI, too, installs torch first
