"""torch.compile sees each model's training forward as one graph: no graph break in a block, in the whole
model of every form (decoder, encoder, encoder-decoder; RoPE, GQA and SwiGLU in llama-tiny), with padding,
with activation checkpointing and dropout, nor in the losses a task computes inside the compiled region
(the whole logits' cross-entropy, and zoo.chunked_cross_entropy with its checkpointed chunks).

A graph break splits the compiled step: the code between graphs runs eagerly and every graph's inputs
and outputs are materialised, which is what a fused training step must avoid. ``torch._dynamo.explain``
traces without compiling (no inductor), so these run in seconds on the CPU.
"""

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

import zoo
from zoo.attention import AttentionInputs


def _explain(fn: Callable[[], torch.Tensor]) -> Any:
    torch._dynamo.reset()
    try:
        return torch._dynamo.explain(fn)()
    finally:
        torch._dynamo.reset()


def _one_graph(fn: Callable[[], torch.Tensor]) -> None:
    explained = _explain(fn)
    reasons = [str(reason.reason).splitlines()[0] for reason in explained.break_reasons]
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), reasons


def _train_forward(model: zoo.ZooModel, inputs: dict[str, torch.Tensor]) -> Callable[[], torch.Tensor]:
    """The model's training forward on its example inputs (padding included), as a scalar loss."""
    ids = inputs["input_ids"]
    if type(model).cross_attention:
        target = inputs["decoder_input_ids"]
        return lambda: F.cross_entropy(
            model(ids, target, inputs["attention_mask"]).flatten(0, 1).float(), target.flatten()
        )
    if model.config.mlm_head:
        return lambda: F.cross_entropy(
            model.mlm_logits(model(ids, inputs["attention_mask"])).flatten(0, 1), ids.flatten()
        )
    return lambda: F.cross_entropy(model(ids, inputs["attention_mask"]).flatten(0, 1).float(), ids.flatten())


@pytest.mark.parametrize("preset", ["gpt-tiny", "bert-tiny", "t5-tiny", "llama-tiny"])
def test_the_training_forward_is_one_graph(preset):
    overrides = {"mlm_head": True} if preset == "bert-tiny" else {}  # the mlm task's encoder
    model = zoo.create_model(preset, seed=0, **overrides).train()
    inputs = type(model).example_inputs(model.config, batch=2, length=16)
    _one_graph(_train_forward(model, inputs))
    unpadded = {**inputs, "attention_mask": torch.ones_like(inputs["attention_mask"])}
    _one_graph(_train_forward(model, unpadded))  # the is_causal / no-mask fast path


@pytest.mark.parametrize("preset", ["gpt-tiny", "llama-tiny"])
def test_a_block_is_one_graph(preset):
    """What per-block (regional) compilation compiles: one block's forward, as the stack calls it."""
    model = zoo.create_model(preset, seed=0).train()
    x = torch.randn(2, 16, model.config.d_model)
    stack = model.decoder
    inputs = stack.prepare(x)
    assert inputs.local.is_causal and inputs.local.mask is None  # SDPA's causal fast path, no mask tensor
    _one_graph(lambda: stack.blocks[0](x, inputs.local))
    _one_graph(lambda: stack.blocks[1](x, AttentionInputs(is_causal=True, rotary=inputs.local.rotary)))


def test_checkpointing_and_dropout_stay_in_the_graph():
    model = zoo.create_model("gpt-tiny", seed=0, activation_checkpointing="all", dropout=0.1).train()
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    _one_graph(lambda: F.cross_entropy(model(ids).flatten(0, 1).float(), ids.flatten()))


def test_the_chunked_loss_is_one_graph():
    """task.loss_chunk's loss (each chunk checkpointed), compiled with the forward that feeds it."""
    model = zoo.create_model("gpt-tiny", seed=0).train()
    ids = torch.randint(0, model.config.vocab_size, (2, 17))
    x, y = ids[:, :-1], ids[:, 1:]
    _one_graph(lambda: zoo.chunked_cross_entropy(model.features(x), model.logits, y, chunk=8))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the logits come in bf16, the loss in fp32
        _one_graph(lambda: F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten()))


def _task_batch(kind: str, loss_chunk: int | None):
    """A generator or translator task at tiny size and one training batch of it."""
    from tasks import GeneratorTask, TranslatorTask

    optimizer = {"lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.95]}
    ids = torch.randint(3, 97, (2, 12))
    if kind == "generator":
        cfg = zoo.get_config("gpt-tiny", vocab_size=97, d_model=32, n_heads=2, n_layers=1)
        task = GeneratorTask(model=cfg.to_dict(), optimizer=optimizer, loss_chunk=loss_chunk)
        return task, {"input_ids": ids, "labels": ids.roll(-1, 1)}
    cfg = zoo.get_config("t5-tiny", vocab_size=97, d_model=32, n_heads=2, n_layers=1, d_ff=64)
    task = TranslatorTask(model=cfg.to_dict(), optimizer=optimizer, loss_chunk=loss_chunk)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    return task, {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": ids, "labels": ids.roll(-1, 1)}


@pytest.mark.parametrize("loss_chunk", [None, 8])
@pytest.mark.parametrize("kind", ["generator", "translator"])
def test_compile_true_compiles_the_training_loss_whole(kind, loss_chunk, monkeypatch):
    """zoo-train compile=true (ZooTask.compile_steps) compiles a task's train_loss, the model's forward and the
    loss over the vocabulary, as one graph; its value is the eager loss's."""
    task, batch = _task_batch(kind, loss_chunk)
    task.train()
    _one_graph(lambda: task.train_loss(batch))
    compiled = []
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(fn) or real(fn, backend="eager", **kw))
    eager = task.training_loss(batch)
    task.compile_steps()
    assert compiled[-1] == task.train_loss and len(compiled) == 2  # the model's forward, then the loss
    torch.testing.assert_close(task.training_loss(batch), eager)
    assert task.model_step(batch, 0, "train") is not None  # the training step goes through it
    torch._dynamo.reset()


def test_a_task_whose_training_updates_metrics_compiles_its_model_only(monkeypatch):
    from tasks import ClassifierTask

    cfg = zoo.get_config("bert-tiny", vocab_size=97, d_model=32, n_heads=2, n_layers=1)
    task = ClassifierTask(model=cfg.to_dict(), optimizer={"lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.95]},
                          label_names=["a", "b"])  # fmt: skip
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(fn) or fn)
    task.compile_steps()
    assert task.compiled_loss is None and compiled == [task.model._call_impl]
