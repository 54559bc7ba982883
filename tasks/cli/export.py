"""zoo-export: a checkpoint as a portable folder.

- ``format=safetensors``: config.json, config.yaml, model.safetensors, tokenizer.json (and the
  classifier head); ``zoo.load_pretrained(folder)`` reloads the model with identical outputs.
- ``format=onnx``: model.onnx with dynamic batch and sequence axes, checked with onnxruntime
  against PyTorch (the max abs difference is printed), plus tokenizer.json and config.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig
from torch import Tensor, nn

import zoo
from tasks import ClassifierTask, MLMTask, ZooTask
from tasks.cli.common import conf_dir, load_task
from zoo.attention import Attention


class ExportGraph(nn.Module):
    """What the exported graph computes, by form: decoder -> next-token logits; encoder ->
    classifier logits, masked-LM logits or hidden states; encoder_decoder -> decoder logits."""

    def __init__(self, task: ZooTask) -> None:
        super().__init__()
        self.task, self.arch = task, task.model.config.arch

    def forward(self, input_ids: Tensor, attention_mask: Tensor, decoder_input_ids: Tensor | None = None) -> Tensor:
        model = self.task.model
        if self.arch == "decoder":
            return model(input_ids, attention_mask)
        if self.arch == "encoder_decoder":
            return model(input_ids, decoder_input_ids, attention_mask)
        if isinstance(self.task, ClassifierTask):
            return self.task(input_ids, attention_mask)
        hidden = model(input_ids, attention_mask)
        return model.mlm_logits(hidden) if isinstance(self.task, MLMTask) else hidden

    def example_inputs(self, batch: int = 2, length: int = 16) -> dict[str, Tensor]:
        vocab = self.task.model.config.vocab_size
        g = torch.Generator().manual_seed(0)
        inputs = {"input_ids": torch.randint(5, vocab, (batch, length), generator=g),
                  "attention_mask": torch.ones(batch, length, dtype=torch.long)}
        inputs["attention_mask"][0, length // 2 :] = 0  # exercise padding
        if self.arch == "encoder_decoder":
            inputs["decoder_input_ids"] = torch.randint(5, vocab, (batch, length - 3), generator=g)
        return inputs


def export_safetensors(task: ZooTask, info: dict, out: Path) -> float:
    extra = {"task": info["task"]}
    if isinstance(task, ClassifierTask):
        from safetensors.torch import save_model

        extra.update(label_names=task.label_names, pooling=task.pooling)
        save_model(task.head, str(out / "head.safetensors"))
    zoo.save_pretrained(task.model, out, extra=extra)
    (out / "config.yaml").write_text(info["config_yaml"])
    task.tokenizer.save(str(out / "tokenizer.json"))
    reloaded = zoo.load_pretrained(out)
    graph = ExportGraph(task)
    args = _model_args(graph.arch, graph.example_inputs())
    with torch.no_grad():
        return (task.model(*args) - reloaded(*args)).abs().max().item()


def _model_args(arch: str, inputs: dict[str, Tensor]) -> tuple[Tensor, ...]:
    if arch == "encoder_decoder":
        return inputs["input_ids"], inputs["decoder_input_ids"], inputs["attention_mask"]
    return inputs["input_ids"], inputs["attention_mask"]


def export_onnx(task: ZooTask, info: dict, out: Path, opset: int) -> float:
    import numpy as np
    import onnxruntime

    graph = ExportGraph(task).eval()
    for layer in graph.modules():  # explicit matmuls: the exporter's view of the fused kernel's output
        if isinstance(layer, Attention):  # layout differs from what its decomposition produces
            layer.kernel = "math"
    inputs = graph.example_inputs()
    batch, seq, target = torch.export.Dim("batch"), torch.export.Dim("seq"), torch.export.Dim("target")
    shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    if "decoder_input_ids" in inputs:
        shapes["decoder_input_ids"] = {0: batch, 1: target}
    path = out / "model.onnx"
    torch.onnx.export(graph, (), str(path), kwargs=inputs, dynamic_shapes=shapes, input_names=list(inputs),
                      output_names=["output"], opset_version=opset, dynamo=True, verbose=False)
    task.tokenizer.save(str(out / "tokenizer.json"))
    (out / "config.json").write_text(json.dumps({"model": task.model.config.to_dict(), "task": info["task"],
                                                 **_labels(task)}, indent=2))
    # check at other shapes than the traced ones: the axes must really be dynamic
    check = ExportGraph(task).example_inputs(batch=3, length=11)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {k: v.numpy() for k, v in check.items()})[0]
    with torch.no_grad():
        want = graph(**check).numpy()
    return float(np.abs(got - want).max())


def _labels(task: ZooTask) -> dict:
    return {"label_names": task.label_names} if isinstance(task, ClassifierTask) else {}


@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="export")
def main(cfg: DictConfig) -> float:
    if cfg.format not in ("safetensors", "onnx"):
        raise ValueError(f"format={cfg.format!r} must be 'safetensors' or 'onnx'")
    task, info = load_task(cfg.ckpt_path)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.format == "safetensors":
        diff = export_safetensors(task, info, out)
        print(f"exported {out}/model.safetensors; zoo.load_pretrained reload: max abs diff {diff:.3g}")
    else:
        diff = export_onnx(task, info, out, cfg.opset)
        print(f"exported {out}/model.onnx; onnxruntime vs PyTorch: max abs diff {diff:.3g}")
    return diff


if __name__ == "__main__":
    main()
