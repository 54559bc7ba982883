"""Mistakes a user can fix. Every verb ends on one of these (or a zoo.ConfigError /
zoo.CheckpointError) with one line that names the field or file and the fix, not a traceback."""

from __future__ import annotations


class UserError(ValueError):
    """Something on the command line or in the user's files that cannot work; the message says
    which field or file and what to do."""


class DataError(UserError):
    """Data that cannot be read or used: a missing or empty path, a binary file, a missing column."""


class DivergedError(RuntimeError):
    """Training stopped because the loss (or a gradient) stopped being finite. ``resumable``:
    the weights are no point to resume from (no crash checkpoint is saved)."""

    resumable = False
