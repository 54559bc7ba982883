"""Mistakes a user can fix. Every verb ends on one of these (or a zoo.ConfigError /
zoo.CheckpointError) with one line that names the field or file and the fix, not a traceback.

This module is also the contract the Optuna sweeper (hydra_plugins/zoo_optuna_sweeper/) meets tasks
by, imported one way (the sweeper imports it, never the reverse): a run ended on purpose
(:class:`EndedOnPurpose`: a pruned trial) and how a job asks for its errors raised, not reported in
one line (:data:`RAISE_ERRORS_ENV`)."""

from __future__ import annotations

import errno
import io
import json
from typing import ClassVar

RAISE_ERRORS_ENV = "ZOO_RAISE_ERRORS"
"""Set in a sweep job's process (by the sweeper's callbacks): zoo-train lets the job's error reach the
sweeper, which records it as the trial's failure, instead of ending in one line."""


class UserError(ValueError):
    """Something on the command line or in the user's files that cannot work; the message says
    which field or file and what to do."""


class DataError(UserError):
    """Data that cannot be read or used: a missing or empty path, a binary file, a missing column."""


class EndedOnPurpose(Exception):
    """What a callback raises to stop a run on purpose (a diverged loss, a pruned trial): it passes
    the verb as it is, not as a failure, and leaves no crash checkpoint, as there is nothing worth
    resuming. ``exit_quietly``: the verb ends this process without a word (a DDP process Lightning
    started, whose rank 0 reports)."""

    exit_quietly: ClassVar[bool] = False


class DivergedError(EndedOnPurpose, RuntimeError):
    """Training stopped because the loss (or a gradient) stopped being finite: the weights are no
    point to resume from."""


class RunFailed(RuntimeError):
    """An error that ended fitting or testing and is no user mistake (a library's refusal, a CUDA
    error, a bug): one line with its kind and first line, and where its whole traceback was kept.
    ``kind``: the original error's class name, which the verb prints in its place."""

    def __init__(self, error: BaseException, log: str | None) -> None:
        self.kind = type(error).__name__
        where = f"the full traceback is in {log}" if log else "the full traceback could not be written"
        super().__init__(f"{_first_line(error)} ({where})")


# ---- the machine's and the files' errors, as one line ---------------------------------------------
NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}
READ_ONLY = {errno.EROFS}
NOT_PERMITTED = {errno.EACCES, errno.EPERM}
WHERE = "paths.output_dir / hydra.run.dir, or out="
OS_FIXES = {
    errno.ENOTDIR: "a part of that path is a file, not a folder; choose another path",
    errno.ENOENT: "no such file or folder; check the path",
    errno.EISDIR: "it is a folder; give a file",
    errno.EEXIST: "it exists already; choose a new name",
    errno.ENAMETOOLONG: "the name is too long; choose a shorter path",
    errno.ELOOP: "its symbolic links point in a loop; fix them or choose another path",
    errno.EMFILE: "too many open files; raise the limit (ulimit -n) or lower data.num_workers",
    errno.ENFILE: "too many open files on this machine; close some programs or lower data.num_workers",
}


def os_error(error: OSError) -> UserError:
    """The one line for an OSError of the machine (it has an errno): the path, what the system
    said and what to do. A full disk and a folder that cannot be written keep the fix they had."""
    path = error.filename
    what = "a file" if path is None else f"{path} -> {error.filename2}" if error.filename2 is not None else f"{path}"
    reason = error.strerror or str(error)
    if error.errno in NO_SPACE:
        return UserError(f"cannot write {what}: {reason}; free some space or choose another output folder")
    if error.errno in READ_ONLY or (error.errno in NOT_PERMITTED and path is None):
        return UserError(f"cannot write {what}: {reason}; choose a folder you can write ({WHERE})")
    if error.errno in NOT_PERMITTED:
        return UserError(f"{what}: {reason}; fix its permissions, or choose a folder you can write ({WHERE})")
    fix = OS_FIXES.get(error.errno)
    return UserError(f"{what}: {reason}" + (f"; {fix}" if fix else ""))


def utf8_text(key: str, value: str) -> str:
    """``value``, the free text of the setting ``key`` (``prompt=``), when it is UTF-8 text; a UserError
    naming the first byte that is not. Python hands bytes of the command line that are not UTF-8 on
    as lone surrogates (U+DC80..U+DCFF for the bytes 0x80..0xff), which no tokenizer can read."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        char = ord(value[error.start])
        what = f"byte 0x{char - 0xDC00:02x}" if 0xDC80 <= char <= 0xDCFF else f"the lone surrogate U+{char:04X}"
        raise UserError(
            f"{key}=: {what} (at character {error.start}) is not UTF-8 text; give the text in UTF-8 "
            f"(a terminal or file in another encoding: convert it, e.g. iconv -f latin1 -t utf-8)"
        ) from None
    return value


PARSERS = ("json.", "yaml.", "omegaconf.", "hydra.")
"""Modules whose recursion is a file's nesting: a RecursionError raised inside one is the file's doing."""


def parse_error(error: BaseException) -> UserError | None:
    """The one line for a file zoo (or Hydra) could not parse or decode: YAML, JSON, text that is
    not UTF-8, one nested too deep to parse, naming the file (from the error, or the file open where
    it was raised) and the place in it; None for an error of another kind."""
    import yaml  # noqa: PLC0415  (only when an error is being described)

    path = _file_being_read(error)
    if isinstance(error, RecursionError) and _in_a_parser(error):
        return UserError(
            f"{path or 'a file zoo read'}: nested too deep to parse (a real one nests a few levels); "
            f"restore the file, or give another one"
        )
    if isinstance(error, yaml.MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        name = mark.name if mark is not None and not mark.name.startswith("<") else path or "a YAML file"
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = " ".join(str(p) for p in (error.context, error.problem) if p)
        return UserError(f"{name}{line}: not valid YAML ({problem}); fix it")
    if isinstance(error, yaml.YAMLError):
        return UserError(f"{path or 'a YAML file'}: not valid YAML ({_first_line(error)}); fix it")
    if isinstance(error, json.JSONDecodeError):
        return UserError(f"{path or 'a JSON file'} line {error.lineno}: not valid JSON ({error.msg}); fix it")
    if isinstance(error, UnicodeDecodeError):
        byte = error.object[error.start] if error.start < len(error.object) else None
        at = f"byte {error.start}" + (f" (0x{byte:02x})" if byte is not None else "")
        return UserError(
            f"{path or 'a file zoo read'}: {at} is not {error.encoding.upper()} text; save it as UTF-8 "
            f"text (e.g. iconv -f latin1 -t utf-8) or give another file"
        )
    if isinstance(error, UnicodeEncodeError):
        return UserError(
            f"{path or 'the output'}: {error.object[error.start : error.end]!r} cannot be written as "
            f"{error.encoding} ({error.reason}); use a UTF-8 locale or PYTHONIOENCODING=utf-8"
        )
    return None


def _in_a_parser(error: BaseException) -> bool:
    """Whether the innermost frames of ``error`` (where it was raised) are those of a parser (:data:`PARSERS`)."""
    tb, last = error.__traceback__, None
    while tb is not None:
        last = tb.tb_frame.f_globals.get("__name__", "")
        tb = tb.tb_next
    return last is not None and last.startswith(PARSERS)


def _file_being_read(error: BaseException) -> str | None:
    """The name of the innermost open file among the frames ``error`` passed through, if any."""
    frames, tb = [], error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            if isinstance(value, io.IOBase) and isinstance(getattr(value, "name", None), str):
                return value.name
    return None


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else type(error).__name__
