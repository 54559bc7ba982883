"""Stand-in runtimes for zoo-export's checks (tests/test_export_checker_child.py): each is put in
``tasks.cli.export.checker.RUNTIMES`` in place of llama.cpp or onnxruntime and runs in the child process as
the real one would. Not collected as tests (no ``test_`` prefix); the child imports this module
through the parent's ``sys.path``."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np

from tasks.cli.export.checker import Runtime


class StandIn(Runtime):
    """A runtime named as a real one (so its lines read as the user would see them), whose package
    is one that is always there."""

    package = "os"
    fix = "stand-in fix"

    def __init__(self, name: str = "llama.cpp") -> None:
        self.name = name


class Segfaults(StandIn):
    def run(self, library: Any, file: str, **inputs: Any) -> dict[str, Any]:
        os.kill(os.getpid(), signal.SIGSEGV)
        raise AssertionError("unreachable")


class Hangs(StandIn):
    def run(self, library: Any, file: str, **inputs: Any) -> dict[str, Any]:
        time.sleep(3600)
        raise AssertionError("unreachable")


class Unimportable(StandIn):
    """Installed (find_spec finds it) but its import fails, as a llama_cpp whose shared library does not load."""

    package = "checker_stand_in_broken"

    def run(self, library: Any, file: str, **inputs: Any) -> dict[str, Any]:
        raise AssertionError("unreachable: the import fails first")


class MissingDependency(Unimportable):
    """Installed, but a module its import needs is not (llama-cpp-python installed with --no-deps)."""

    package = "checker_stand_in_without_dependency"


class Interrupted(StandIn):
    """The user's Ctrl-C while the check runs: SIGINT to zoo's process, then a check that never ends."""

    def run(self, library: Any, file: str, **inputs: Any) -> dict[str, Any]:
        os.kill(os.getppid(), signal.SIGINT)
        time.sleep(3600)
        raise AssertionError("unreachable")


class Disagrees(StandIn):
    """A healthy llama.cpp whose logits are all zero and whose greedy tokens are all 0."""

    def __init__(self, vocab: int) -> None:
        super().__init__("llama.cpp")
        self.vocab = vocab

    def run(self, library: Any, file: str, *, prompt: list[int], steps: int, threads: int) -> dict[str, Any]:
        return {"logits": np.zeros((len(prompt), self.vocab), dtype=np.float32), "tokens": [0] * steps}
