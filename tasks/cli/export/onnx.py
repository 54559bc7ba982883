"""``zoo-export format=onnx``: the task's graph traced by torch's ONNX exporter with dynamic batch and
sequence axes, and checked with onnxruntime against PyTorch at other shapes than the traced ones;
onnxruntime runs in a child process (tasks/cli/export/checker.py), so that a crash of it is one line."""

from __future__ import annotations

import importlib.util
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from tasks import ZooTask
from tasks.cli.export.checker import RUNTIMES, Checking
from tasks.errors import UserError

ONNX_PACKAGES = ("onnx", "onnxscript", "onnxruntime")


class ExportGraph(nn.Module):
    """What the exported graph computes: the model's outputs by form (decoder -> next-token logits;
    encoder -> hidden states; encoder_decoder -> decoder logits), through the task's export head
    (``ZooTask.export_head``: classifier logits, masked-LM logits, or the outputs unchanged)."""

    def __init__(self, task: ZooTask) -> None:
        super().__init__()
        self.task, self.form = task, type(task.model)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, decoder_input_ids: Tensor | None = None) -> Tensor:
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "decoder_input_ids": decoder_input_ids}
        outputs = self.task.model(**{name: given[name] for name in self.form.input_names})
        return self.task.export_head(outputs, attention_mask)

    def example_inputs(self, batch: int = 2, length: int = 16) -> dict[str, Tensor]:
        """The form's example inputs (``ZooModel.example_inputs``: padding in the first row)."""
        return self.form.example_inputs(self.task.model.config, batch=batch, length=length)


def require_onnx() -> None:
    """format=onnx needs the ``export`` extra; a UserError names it when a package is missing."""
    for package in ONNX_PACKAGES:
        if importlib.util.find_spec(package) is None:
            raise UserError(
                f"format=onnx needs the package {package}, which is not installed; install the export "
                f'extra: pip install -e ".[export]"'
            )


@contextmanager
def exporter_quiet() -> Iterator[None]:
    """Silence what torch's ONNX exporter says that a user cannot act on: a line per torchvision
    operator it skips (torchvision is not a dependency) and a note that inputs sharing a dynamic
    axis (batch, seq) share its name."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*The axis name: .* will not be used")
            yield
    finally:
        registration.setLevel(level)


def onnx_program(task: ZooTask, opset: int) -> tuple[Any, ExportGraph]:
    """The task's graph traced by torch's ONNX exporter, with dynamic batch and sequence axes."""
    graph = ExportGraph(task).eval()
    # explicit matmuls: the exporter's view of the fused kernel's output layout differs from what its
    # decomposition produces
    task.model.set_attention_kernel("math")
    inputs = graph.example_inputs()
    batch, seq, target = torch.export.Dim("batch"), torch.export.Dim("seq"), torch.export.Dim("target")
    shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    if "decoder_input_ids" in inputs:
        shapes["decoder_input_ids"] = {0: batch, 1: target}
    with exporter_quiet():
        program = torch.onnx.export(
            graph,
            (),
            kwargs=inputs,
            dynamic_shapes=shapes,
            input_names=list(inputs),
            output_names=["output"],
            opset_version=opset,
            dynamo=True,
            verbose=False,
        )
    return program, graph


def onnx_difference(graph: ExportGraph, path: Path, checking: Checking, *, shown: Path) -> float:
    """Max abs difference of onnxruntime's outputs and PyTorch's, at other shapes than the traced
    ones (the axes must really be dynamic). onnxruntime runs in a child process (``checking``): a
    CheckerFailed naming ``shown`` when it crashes, hangs or cannot be imported."""
    check = graph.example_inputs(batch=3, length=11)
    ran = checking.run(RUNTIMES["onnxruntime"], path, shown=shown, inputs={k: v.numpy() for k, v in check.items()})
    with torch.no_grad():
        want = graph(**check)
    return (torch.as_tensor(ran["output"]) - want).abs().max().item()
