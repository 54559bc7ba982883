"""Metric loggers of zoo's own."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from zoo.io import atomic_write_text


class _AppendingWriter(ExperimentWriter):
    """Lightning's writer deletes an existing metrics.csv when it starts; this one continues it
    (a resumed run is the same run: one metrics file, its earlier rows kept)."""

    def _check_log_dir_exists(self) -> None:
        path = Path(self.metrics_file_path)
        if path.is_file():
            with path.open(newline="") as f:
                self.metrics_keys = list(csv.DictReader(f).fieldnames or [])


class CSVLogger(LightningCSVLogger):
    """``<save_dir>/<name>/<version>/metrics.csv`` that a resumed run appends to. Call
    ``resume_at(step)`` before training continues from a checkpoint of that step: rows the
    interrupted attempt logged from that step on are dropped, as the resumed run logs them again."""

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment

    def resume_at(self, step: int) -> int:
        """Drop the rows of ``step`` and later; returns how many were dropped. A checkpoint of
        global step k holds k optimizer steps: the batch after it logs its learning rate and loss
        as step k (a validation after k steps logs as k - 1), so rows of step k came after it."""
        path = Path(self.experiment.metrics_file_path)
        if not path.is_file():
            return 0
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            fields, rows = list(reader.fieldnames or []), list(reader)
        kept = [r for r in rows if not r.get("step") or int(float(r["step"])) < step]
        if len(kept) < len(rows):
            text = io.StringIO(newline="")
            writer = csv.DictWriter(text, fieldnames=fields)
            writer.writeheader()
            writer.writerows(kept)
            atomic_write_text(path, text.getvalue())
        return len(rows) - len(kept)


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
