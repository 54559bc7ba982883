"""The runtimes that check what zoo-export wrote, each run in a child process with a time limit, so
that a runtime which crashes (a signal), hangs or cannot be imported ends its check and not zoo.

``Checking.run(RUNTIMES["llama.cpp"], file, shown=..., **inputs)`` starts
``python -m tasks.cli.export.checker <request> <answer> <seconds>``: the child imports the runtime, runs the
file on the plain inputs it was given (token ids, numpy arrays) and sends back what the runtime
computed (logits, tokens); zoo's process compares it with the checkpoint and refuses a disagreement
itself. When the child dies of a signal, outlives ``checker.timeout`` or cannot import the runtime,
:class:`CheckerFailed` says so in words, and ``checker.unchecked`` (conf/export.yaml) chooses: keep
the export, which was written whole, and end with exit status 3 (:class:`Unchecked`), or refuse it.

Which checks run here: those that run native code on the file zoo wrote that zoo's own process does
not otherwise run. llama.cpp (llama-cpp-python compiles it for the machine it is installed on; a build
tuned for a CPU's AVX-512 and AMX crashed on every quantized file with SIGSEGV or SIGILL) and
onnxruntime (a C++ runtime; a graph it mishandles, or a wheel built for other CPU features, can take
the process down with it). transformers' reloads (format=hf, and its reading of a GGUF file) stay in
zoo's process: they run torch, which the export itself runs, and Python readers (gguf-py, safetensors'
loader, which zoo's own writing uses too), so a crash there is zoo's own and should show as one.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.errors import UserError

UNCHECKED = ("keep", "refuse")  # checker.unchecked=


class Runtime(ABC):
    """A third-party runtime that runs a file zoo wrote. ``name`` is what the user reads, ``package``
    the import it needs (not installed: no check), ``fix`` what to do when it crashes. ``load`` and
    ``run`` are called in the child process only."""

    name: str
    package: str
    fix: str

    def installed(self) -> bool:
        return importlib.util.find_spec(self.package) is not None

    def load(self) -> Any:
        """The runtime's module (in the child: an import that fails is the runtime's, not zoo's)."""
        return importlib.import_module(self.package)

    @abstractmethod
    def run(self, library: Any, file: str, **inputs: Any) -> dict[str, Any]:
        """What the runtime computes on ``file`` for ``inputs``, as plain values and numpy arrays."""


class LlamaCpp(Runtime):
    name, package = "llama.cpp", "llama_cpp"
    fix = (
        "rebuild llama-cpp-python for this CPU without -march=native (the guide's GGUF page gives the CMAKE_ARGS), "
        "or uninstall it to skip this check"
    )

    def run(self, library: Any, file: str, *, prompt: list[int], steps: int, threads: int) -> dict[str, Any]:
        """The logits of ``prompt`` (T, V) and ``steps`` greedy tokens after it (llama.cpp's KV cache)."""
        import numpy as np

        llm = library.Llama(file, n_ctx=len(prompt) + steps, logits_all=True, verbose=False, n_threads=threads)
        try:
            llm.eval(prompt)
            logits = np.array(llm.scores[: len(prompt)], dtype=np.float32)  # (T, V)
            tokens: list[int] = []
            for _ in range(steps):
                tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
                llm.eval(tokens[-1:])
        finally:
            llm.close()
        return {"logits": logits, "tokens": tokens}


class OnnxRuntime(Runtime):
    name, package = "onnxruntime", "onnxruntime"
    fix = "reinstall onnxruntime (pip install --force-reinstall onnxruntime) and report it if it persists"

    def run(self, library: Any, file: str, *, inputs: dict[str, Any]) -> dict[str, Any]:
        """The graph's first output for ``inputs`` (numpy arrays by input name), on the CPU."""
        session = library.InferenceSession(file, providers=["CPUExecutionProvider"])
        return {"output": session.run(None, inputs)[0]}


RUNTIMES: dict[str, Runtime] = {runtime.name: runtime for runtime in (LlamaCpp(), OnnxRuntime())}
"""The runtimes the formats check with, by name; a format looks its runtime up here when it checks."""


class CheckerFailed(Exception):
    """A runtime that could not check a file: the message says which, what happened and to what file;
    ``fix`` what the user can do."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


class Unchecked(Exception):
    """An export written whole and kept whose runtime could not check it: the message is the one line
    why, ``said`` the export's own line (what the other checks found), if any."""

    def __init__(self, message: str, said: str | None = None) -> None:
        super().__init__(message)
        self.said = said


@dataclass(frozen=True)
class Checking:
    """How zoo-export runs a runtime's check (conf/export.yaml ``checker``): the seconds it may take,
    and whether a file it could not check is kept (the default) or refused."""

    timeout: float = 600.0
    keep: bool = True
    # keep: the file is zoo's own, written whole and, for GGUF, read by transformers too; a runtime
    # that crashes on it is the runtime's build (llama.cpp's crashed on SmolLM2's own Q4_1 file as on
    # zoo's). Refusing would make the format unusable wherever such a build is installed; exit
    # status 3 keeps a script from taking the file for a checked one.

    @classmethod
    def from_config(cls, cfg: Any) -> Checking:
        """``checker.timeout`` (seconds, > 0) and ``checker.unchecked`` (keep or refuse); one line naming
        the field for anything else."""
        timeout, unchecked = cfg.timeout, cfg.unchecked
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < math.inf:
            raise UserError(f"checker.timeout={timeout!r} must be a number of seconds above 0")
        if unchecked not in UNCHECKED:
            raise UserError(
                f"checker.unchecked={unchecked!r}: choose keep (an export its runtime could not check is kept, "
                f"exit status 3) or refuse (nothing is written)"
            )
        return cls(timeout=float(timeout), keep=unchecked == "keep")

    def run(self, runtime: Runtime, file: Path, *, shown: Path, **inputs: Any) -> dict[str, Any]:
        """What ``runtime`` computes on ``file`` for ``inputs``, run in a child process; a CheckerFailed
        naming ``shown`` (the path the file will have) when it crashes, hangs or cannot be imported. The
        child never outlives the call: a time-out, a Ctrl-C or any error kills it."""
        with tempfile.TemporaryDirectory(prefix="zoo-check-") as scratch:
            request, answer, log = (Path(scratch) / name for name in ("request.pkl", "answer.pkl", "output.log"))
            with request.open("wb") as f:
                pickle.dump((runtime, str(file), inputs), f)
            # the child imports what this process imports (a checker a test names, too)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            argv = [sys.executable, "-m", __name__, str(request), str(answer), str(self.timeout)]
            with log.open("wb") as output:  # what the runtime prints (llama.cpp's load log) is not the user's
                child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=output, env=env)
            try:
                code: int | None = child.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
            return self._answer(runtime, shown, code, answer)

    def _answer(self, runtime: Runtime, shown: Path, code: int | None, answer: Path) -> dict[str, Any]:
        """The child's result, or the CheckerFailed that says how it ended."""
        if code is None:
            raise CheckerFailed(
                f"{runtime.name} did not finish checking {shown} in {self.timeout:g} s",
                f"raise checker.timeout (seconds) for a model this large, or {runtime.fix}",
            )
        if code < 0:
            raise CheckerFailed(f"{runtime.name} {_died_of(-code)} while checking {shown}", runtime.fix)
        if not answer.is_file():
            raise CheckerFailed(f"{runtime.name} ended with exit status {code} while checking {shown}", runtime.fix)
        with answer.open("rb") as f:
            kind, value = pickle.load(f)  # written by our own child, in our own temporary folder
        if kind == "missing":
            raise CheckerFailed(
                f"{runtime.name} could not be imported to check {shown}: "
                f"the module {value} it imports is not installed",
                f"install it (pip install {value}), or uninstall {runtime.package} to skip this check",
            )
        if kind == "import":
            raise CheckerFailed(f"{runtime.name} could not be imported to check {shown} ({value})", runtime.fix)
        if kind == "error":
            raise CheckerFailed(f"{runtime.name} failed while checking {shown} ({value})", runtime.fix)
        return value

    def unchecked(self, failed: CheckerFailed) -> str:
        """The line for a file its runtime could not check, when it is kept; a UserError (nothing is
        written) when ``checker.unchecked=refuse``."""
        if not self.keep:
            raise UserError(
                f"{failed}; nothing was written (checker.unchecked=refuse): {failed.fix}, or set "
                f"checker.unchecked=keep to keep a file that could not be checked"
            )
        return f"{failed}; the file was written and is unchecked: {failed.fix}"


def _died_of(number: int) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return f"was killed ({name}, perhaps out of memory)" if number == signal.SIGKILL else f"crashed ({name})"


def _said(error: BaseException) -> str:
    first = str(error).strip().splitlines()
    return f"{type(error).__name__}: {first[0]}" if first else type(error).__name__


def child(request: Path, answer: Path, timeout: float) -> None:
    """The child process: load the runtime, run it, write ``(kind, value)`` to ``answer``: ``("ok",
    result)``, ``("missing", module)``, ``("import", why)`` or ``("error", why)``. Its own alarm ends it
    should zoo be gone."""
    signal.alarm(math.ceil(timeout) + 10)  # SIGALRM's default action ends even a native hang

    def say(kind: str, value: Any) -> None:
        with answer.open("wb") as f:
            pickle.dump((kind, value), f)

    try:
        with request.open("rb") as f:
            runtime, file, inputs = pickle.load(f)
        library = runtime.load()
    except ModuleNotFoundError as error:  # a module the runtime imports is not installed: which one
        say("missing", error.name or _said(error))
        return
    except Exception as error:  # ImportError, or a shared library that does not load (OSError, RuntimeError)
        say("import", _said(error))
        return
    try:
        result = runtime.run(library, file, **inputs)
    except Exception as error:
        say("error", _said(error))
        return
    say("ok", result)


if __name__ == "__main__":
    child(Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]))
