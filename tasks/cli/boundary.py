"""How a verb ends when it cannot go on: one line ``zoo: <Kind>: <message>`` on stderr that names the
field or the path and the fix, chosen by the exception's kind, not case by case:

- a user's mistake (zoo.ConfigError, zoo.CheckpointError, UserError), Lightning's
  MisconfigurationException, a trainer, callback or logger Hydra could not build from the config: exit 2;
- what the machine refused (any OSError with an errno: a full disk, a read-only folder, a path below
  a file): exit 1; a file that is not YAML, JSON or UTF-8 text: exit 2;
- a diverged run, or an error that ended fitting or testing (tasks.errors.RunFailed: its whole
  traceback kept in the run directory's error.log): exit 1; Ctrl-C: exit 130;
- an error Hydra raised while composing the config (``hydra_errors``): exit 2.

Anything else is a bug in zoo and keeps its traceback. A verb that ends in one line removes the run
directory this process created for it, when it holds only what Hydra wrote there (see
tasks.cli.hydra_callbacks.discard_own_run_dir).
"""

from __future__ import annotations

import functools
import io
import os
import re
import sys
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from hydra.errors import ConfigCompositionException, InstantiationException, OverrideParseException

import zoo
from tasks.cli.composition import composition_error
from tasks.cli.hydra_callbacks import discard_own_run_dir
from tasks.errors import DivergedError, RunFailed, UserError, os_error, parse_error

USER_ERRORS = (zoo.ConfigError, zoo.CheckpointError, UserError)
OWN_PACKAGES = ("zoo", "tasks", "hydra_plugins")  # a module of these missing is a broken install or a bug: traceback
"""Exceptions whose message is the whole story: a verb prints it in one line and exits 2."""

FULL_ERROR_ENV = "HYDRA_FULL_ERROR"
F = TypeVar("F", bound=Callable[..., Any])


def fail(error: BaseException, code: int = 2) -> typing.NoReturn:
    """End the verb with one line on stderr: ``zoo: <kind>: <message>``; the run directory this
    process created and nothing but Hydra wrote into goes with it."""
    kind = error.kind if isinstance(error, RunFailed) else type(error).__name__
    print(f"zoo: {kind}: {error}", file=sys.stderr)
    discard_own_run_dir()
    sys.exit(code)


def one_line(error: BaseException) -> tuple[BaseException, int] | None:
    """The error to print in one line for ``error`` and the exit code; None for a bug in zoo."""
    if isinstance(error, USER_ERRORS):
        return error, 2
    if isinstance(error, DivergedError | RunFailed):
        return error, 1
    if isinstance(error, InstantiationException):
        return _not_built(error)
    if _lightning_refused(error):
        return zoo.ConfigError(_with_gpu_hint(str(error))), 2
    if isinstance(error, ConfigCompositionException | OverrideParseException):  # a config composed in the verb
        described = composition_error(error)
        return (described, 2) if described is not None else None
    if isinstance(error, OSError) and not isinstance(error, io.UnsupportedOperation):
        if error.errno is None:
            return None  # a library's own OSError, not the system's: its traceback says where
        return os_error(error), 1
    described = parse_error(error)
    return (described, 2) if described is not None else None


def _not_built(error: InstantiationException) -> tuple[BaseException, int] | None:
    """A trainer, callback, logger or data module that Hydra could not build from the config: one
    line naming its key when the reason is the config's (a user error inside, Lightning refusing a
    setting, an argument the class does not take, a ``_target_`` that does not exist)."""
    key = re.search(r"full_key: (\S+)", str(error))
    where = key.group(1) if key else "the config"
    cause = error.__cause__
    if cause is not None:
        inner = one_line(cause)
        if inner is not None and not _lightning_refused(cause):
            return inner
    if _lightning_refused(cause):
        return zoo.ConfigError(f"{where}: {_with_gpu_hint(str(cause))}"), 2
    if isinstance(cause, TypeError) and re.search(
        r"unexpected keyword argument|required (positional|keyword)", str(cause)
    ):
        return zoo.ConfigError(f"{where}: {cause}; remove that key or check its name"), 2
    if str(error).startswith("Error locating target"):
        return zoo.ConfigError(f"{where}: {str(error).splitlines()[0]}"), 2
    if isinstance(cause, ImportError) and (cause.name or "").split(".")[0] not in OWN_PACKAGES:
        # a package the component needs is not installed (Lightning's TensorBoardLogger without tensorboard)
        said = str(cause).strip().splitlines()[0] if str(cause).strip() else f"no module named {cause.name}"
        return UserError(f"{where}: {said}; install it, or choose another {where.split('.')[0]}"), 2
    return None


def _lightning_refused(error: BaseException | None) -> bool:
    """Whether ``error`` is Lightning's refusal of a setting; Lightning is not imported to ask (a verb
    refuses what Hydra cannot compose before it imports Lightning, which then raised nothing)."""
    exceptions = sys.modules.get("lightning.fabric.utilities.exceptions")
    return exceptions is not None and isinstance(error, exceptions.MisconfigurationException)


def _with_gpu_hint(message: str) -> str:
    """Lightning's message, and on a machine without a usable GPU what to choose instead."""
    if re.search(r"gpu|cuda", message, flags=re.IGNORECASE) and not torch.cuda.is_available():
        return (
            f"{message.rstrip('!. ')}: this machine has no GPU that PyTorch can use (torch.cuda.is_available() "
            f"is False); use trainer=cpu, or run on a machine with a GPU"
        )
    return message


def user_errors(fn: F) -> F:
    """Decorate a verb's function: what ends it that is not a bug ends it in one line (the module's
    docstring lists the kinds and the exit codes); everything else keeps its traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt as interrupt:
            print(f"zoo: interrupted{f'; {interrupt}' if str(interrupt) else ''}", file=sys.stderr)
            sys.exit(130)
        except Exception as error:
            line = one_line(error)
            if line is None:
                raise
            fail(*line)

    return typing.cast(F, wrapper)


def hydra_errors(entry: F) -> F:
    """Decorate a ``@hydra.main`` function (write it above the ``@hydra.main`` line): what Hydra raises
    while composing the config ends the process in one line, exit 2 (tasks.cli.composition).

    Hydra prints such errors itself unless ``HYDRA_FULL_ERROR=1``, which makes it raise them: the
    variable is set for the call, and what was raised before the verb started (no frame of Hydra's
    ``run_job`` in its traceback) is described; an exception of the verb passes through unchanged. A
    user who sets ``HYDRA_FULL_ERROR=1`` gets Hydra's own report. What Hydra itself raises around the
    verb (its writes into the run directory: ``.hydra/``, the log file) is a machine's or a file's
    error like the verb's own: one line (``hydra_job_error``). Called with a config (as tests do),
    the function runs as it is."""

    @functools.wraps(entry)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if args or kwargs or os.environ.get(FULL_ERROR_ENV) == "1":
            return entry(*args, **kwargs)
        os.environ[FULL_ERROR_ENV] = "1"
        try:
            return entry()
        except Exception as error:
            if _in_the_job(error):
                line = hydra_job_error(error)
                if line is None:
                    raise
                fail(*line)
            described = composition_error(error)
            if described is None:
                raise
            fail(described)
        finally:
            os.environ.pop(FULL_ERROR_ENV, None)

    return typing.cast(F, wrapper)


def hydra_job_error(error: BaseException) -> tuple[BaseException, int] | None:
    """The one line for what reached ``hydra_errors`` from Hydra's ``run_job``: the verb's own
    errors were turned into one line by ``user_errors`` already, so what is left is Hydra's (writing
    ``.hydra/config.yaml`` or the log into a read-only run directory, a config it cannot write as
    YAML); an OSError with an errno or a file's error is one line, anything else a bug."""
    if isinstance(error, OSError) and not isinstance(error, io.UnsupportedOperation) and error.errno is not None:
        return os_error(error), 1
    described = parse_error(error)
    return (described, 2) if described is not None else None


def _in_the_job(error: BaseException) -> bool:
    """Whether ``error`` was raised inside the verb (under Hydra's ``run_job``), not while composing."""
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "run_job" and tb.tb_frame.f_globals.get("__name__") == "hydra.core.utils":
            return True
        tb = tb.tb_next
    return False
