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
    ``resume_at(step)`` before training continues from a checkpoint of that step: rows logged
    after it by the interrupted attempt are dropped, as the resumed run logs those steps again."""

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment

    def resume_at(self, step: int) -> int:
        """Drop rows of steps after ``step``; returns how many were dropped."""
        path = Path(self.experiment.metrics_file_path)
        if not path.is_file():
            return 0
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            fields, rows = list(reader.fieldnames or []), list(reader)
        kept = [r for r in rows if not r.get("step") or int(float(r["step"])) <= step]
        if len(kept) < len(rows):
            text = io.StringIO(newline="")
            writer = csv.DictWriter(text, fieldnames=fields)
            writer.writeheader()
            writer.writerows(kept)
            atomic_write_text(path, text.getvalue())
        return len(rows) - len(kept)
