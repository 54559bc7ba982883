"""Metric loggers of zoo's own."""

from __future__ import annotations

import contextlib
import csv
import io
import os
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities import rank_zero_only

from zoo.io import atomic_write_text


class _AppendingWriter(ExperimentWriter):
    """Lightning's writer deletes an existing metrics.csv when it starts; this one continues it
    (a resumed run is the same run: one metrics file, its earlier rows kept). Its ``save`` writes
    every row whole or not at all: a failed write leaves the file as it was and keeps the rows in
    ``metrics``, unwritten (the crash checkpoint carries them, and the resume writes them)."""

    def _check_log_dir_exists(self) -> None:
        path = Path(self.metrics_file_path)
        if path.is_file():
            with path.open(newline="") as f:
                self.metrics_keys = list(csv.DictReader(f).fieldnames or [])

    def save(self) -> None:
        """Append the rows logged since the last save; a new column rewrites the file (atomically)
        under the new header. An OSError leaves metrics.csv as it was and the rows unwritten."""
        if not self.metrics:
            return
        path = Path(self.metrics_file_path)
        keys = sorted(set(self.metrics_keys).union(*self.metrics))
        if keys != sorted(self.metrics_keys) or not path.is_file():
            earlier = _read_rows(path)[1] if path.is_file() else []
            atomic_write_text(path, _csv_text(keys, [*earlier, *self.metrics], header=True))
        else:
            _append(path, _csv_text(keys, self.metrics, header=False))
        self.metrics_keys, self.metrics = keys, []


def _read_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def _csv_text(fields: list[str], rows: list[dict], *, header: bool) -> str:
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fields)
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def _append(path: Path, text: str) -> None:
    """Append ``text`` to ``path``, all of it or none: a failed write is cut back to the file's old end."""
    data = memoryview(text.encode("utf-8"))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        end = os.lseek(fd, 0, os.SEEK_END)
        try:
            while data:
                data = data[os.write(fd, data) :]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, end)
            raise
    finally:
        os.close(fd)


class CSVLogger(LightningCSVLogger):
    """``<save_dir>/<name>/<version>/metrics.csv`` that a resumed run appends to. Call
    ``resume_at(step)`` before training continues from a checkpoint of that step: rows the
    interrupted attempt logged after that step are dropped, as the resumed run logs them again
    (``write_back`` leaves out such rows a crash checkpoint kept unwritten).

    Its ``step`` column counts optimizer steps taken, as the console (``[step N]``), the checkpoint
    names (``step_000600.ckpt``) and the closing table do: the row of the 600th step, and of the
    validation after it, say 600 (``zoo_step``)."""

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Log a row and write it at once (Lightning keeps rows for ``flush_logs_every_n_steps``, which a
        killed run loses): when the write fails, the run stops at that row (its OSError), which stays
        unwritten in ``unwritten_rows`` for the crash checkpoint. ``step``: Lightning's, numbered as
        ``zoo_step`` says."""
        super().log_metrics(metrics, zoo_step(metrics, step))
        self.experiment.save()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Write what is left; a run that failed keeps rows that still cannot be written unwritten (its
        crash checkpoint has them) instead of raising a second error over the first."""
        if status == "success":
            super().finalize(status)
            return
        with contextlib.suppress(OSError):
            super().finalize(status)

    def unwritten_rows(self) -> list[dict[str, Any]]:
        """The rows logged but not (yet) in metrics.csv: those of a write that failed."""
        return [dict(row) for row in self.experiment.metrics] if self._experiment is not None else []

    @rank_zero_only
    def write_back(self, rows: list[dict[str, Any]], step: int | None = None, validation_again: bool = False) -> int:
        """Write the rows a crash checkpoint kept unwritten (``unwritten_rows``), but for any the file
        has already (a later attempt wrote it) and, given the checkpoint's global ``step``, any the run
        resumed from it logs again (``logged_again``: a row of the step the checkpoint was taken back
        before); returns how many were written."""
        if step is not None:
            rows = [row for row in rows if not logged_again(row, step, validation_again)]
        path = Path(self.experiment.metrics_file_path)
        fields, written = _read_rows(path) if path.is_file() else ([], [])
        fields = sorted(set(fields).union(*rows)) if rows else fields
        on_disk = {_row_key(row, fields) for row in written}
        missing = [row for row in rows if _row_key(_as_text(row, fields), fields) not in on_disk]
        self.experiment.metrics[:0] = missing
        self.experiment.save()
        return len(missing)

    def resume_at(self, step: int, validation_again: bool = False) -> int:
        """Drop the rows that a run resumed from a checkpoint of global step ``step`` logs again
        (``logged_again``); returns how many were dropped. ``validation_again``: the resumed run starts
        with the validation after ``step`` (one the interrupt stopped, ``tasks.run.resume.validation_again``)."""
        path = Path(self.experiment.metrics_file_path)
        if not path.is_file():
            return 0
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            fields, rows = list(reader.fieldnames or []), list(reader)
        kept = [r for r in rows if not logged_again(r, step, validation_again)]
        if len(kept) < len(rows):
            text = io.StringIO(newline="")
            writer = csv.DictWriter(text, fieldnames=fields)
            writer.writeheader()
            writer.writerows(kept)
            atomic_write_text(path, text.getvalue())
        return len(rows) - len(kept)


def logged_again(row: dict[str, Any], step: int, validation_again: bool) -> bool:
    """Whether a run resumed from a checkpoint of global step ``step`` logs ``row`` (as written, or as logged
    and left unwritten) again. A checkpoint of global step k holds k optimizer steps: the rows of steps 1 to
    k came before it, the validation after step k included unless the resumed run runs that validation
    again (``validation_again``). The test of a run that finished is kept, whatever its step: the resumed
    run tests again only at its own end."""
    if row.get("step") in (None, "") or _a_test(row):
        return False
    at = int(float(row["step"]))
    return at > step or (at == step and validation_again and _of_stage(row, "val/"))


def zoo_step(metrics: dict[str, Any], step: int | None) -> int | None:
    """The ``step`` of a metrics row: the optimizer steps taken once the step it belongs to is done.

    Lightning numbers a row logged while fitting by the steps taken before its own (its
    ``_batches_that_stepped``): the loss and learning rate of the 600th step, and the validation after
    it, would say 599 while the console says ``[step 600]`` and the checkpoint is ``step_000600.ckpt``.
    A test pass, after fitting, it numbers by the steps taken (600), which is zoo's count already."""
    return step if step is None or _a_test(metrics) else step + 1


def _a_test(row: dict[str, Any]) -> bool:
    """Whether ``row`` holds test metrics only (every zoo task logs them as ``test/<metric>``)."""
    return _of_stage(row, "test/")


def _of_stage(row: dict[str, Any], prefix: str) -> bool:
    """Whether ``row`` holds metrics of one stage only (every zoo task logs them as ``val/<metric>``,
    ``test/<metric>``)."""
    given = [k for k, v in row.items() if v not in (None, "") and k not in ("step", "epoch")]
    return bool(given) and all(k.startswith(prefix) for k in given)


def _as_text(row: dict[str, Any], fields: list[str]) -> dict[str, str]:
    """``row`` as csv writes and reads it back (every field a string, a missing one empty)."""
    return next(csv.DictReader(io.StringIO(_csv_text(fields, [row], header=True), newline="")))


def _row_key(row: dict[str, str], fields: list[str]) -> tuple[str, ...]:
    return tuple(row.get(field) or "" for field in fields)


UNPRINTABLE = {
    **{c: 0x2400 + c for c in range(0x20) if chr(c) not in "\n\t"},
    0x7F: 0x2421,
    0x85: 0x2424,
    0x2028: 0x2424,
    0x2029: 0x2424,
}
"""Characters that would move the cursor, ring or break a line where the text has none, shown as
their Unicode control pictures (``\\r`` as ␍, ``\\x1b`` as ␛)."""


def sample_block(header: str, texts: dict[str, str]) -> str:
    """A validation sample as it reads on the console and in samples.txt: ``header``, then each
    text (a continuation; a source, hypothesis and reference) with its own line breaks and
    indentation, every line behind its label and a bar, so that where a text starts and ends,
    and its leading spaces, stay plain. Control characters show as control pictures."""
    width = max((len(label) for label in texts), default=0)
    lines = [header]
    for label, text in texts.items():
        for i, line in enumerate(text.translate(UNPRINTABLE).split("\n")):
            lines.append(f"  {label if i == 0 else '':<{width}} │ {line}")
    return "\n".join(lines)
