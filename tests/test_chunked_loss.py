"""zoo.chunked_cross_entropy: the output-layer loss a chunk of rows at a time equals the loss over the
whole logits (value and gradients), keeps no (N, V) tensor for backward, and is what task.loss_chunk
turns on in the generator's and the translator's training step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

import zoo
from tasks import GeneratorTask, TranslatorTask
from tasks.cli.schemas import conf_dir
from tasks.cli.train.checks import check_composition

B, T = 3, 7  # N = 21 rows: chunk sizes 4 and 5 leave a short last chunk


def tiny_decoder(**overrides) -> zoo.ZooModel:
    cfg = zoo.get_config("gpt-tiny", n_layers=1, d_model=32, n_heads=2, vocab_size=97, **overrides)
    return zoo.build_model(cfg, seed=0)


def batch(vocab: int, *, ignored: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) ids and labels; with ``ignored``, a third of the labels are -100 (padding, document ends)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (B, T), generator=generator)
    labels = torch.randint(0, vocab, (B, T), generator=generator)
    if ignored:
        labels.view(-1)[::3] = -100
    return ids, labels


def loss_and_grads(model: zoo.ZooModel, loss_fn) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = loss_fn()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def plain_loss(model, ids, labels, label_smoothing=0.0):
    return F.cross_entropy(
        model(ids).flatten(0, 1).float(), labels.flatten(), ignore_index=-100, label_smoothing=label_smoothing
    )


def chunked_loss(model, ids, labels, chunk, label_smoothing=0.0):
    return zoo.chunked_cross_entropy(
        model.features(ids), model.logits, labels, chunk=chunk, label_smoothing=label_smoothing
    )


def assert_same(a: tuple, b: tuple) -> None:
    torch.testing.assert_close(a[0], b[0], rtol=1e-5, atol=1e-6)
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("chunk", [1, 4, 5, 21, 64])
@pytest.mark.parametrize(
    "overrides", [{}, {"tie_embeddings": False, "logit_scale": 0.5}], ids=["tied", "untied-scaled"]
)
def test_equals_the_whole_logits_loss_in_value_and_gradients(chunk, overrides):
    model = tiny_decoder(**overrides)
    ids, labels = batch(97)
    assert_same(
        loss_and_grads(model, lambda: plain_loss(model, ids, labels)),
        loss_and_grads(model, lambda: chunked_loss(model, ids, labels, chunk)),
    )


def test_label_smoothing_and_ignored_rows_as_in_cross_entropy():
    """The translator's loss: the smoothing term, like the target's, counts only rows that are not ignored."""
    model = tiny_decoder()
    ids, labels = batch(97)
    assert_same(
        loss_and_grads(model, lambda: plain_loss(model, ids, labels, 0.1)),
        loss_and_grads(model, lambda: chunked_loss(model, ids, labels, 4, 0.1)),
    )


def test_without_gradients_the_same_value():
    model = tiny_decoder()
    ids, labels = batch(97)
    with torch.no_grad():
        torch.testing.assert_close(chunked_loss(model, ids, labels, 5), plain_loss(model, ids, labels))


def test_every_label_ignored_is_nan_as_in_cross_entropy():
    model = tiny_decoder()
    ids, _ = batch(97)
    labels = torch.full((B, T), -100)
    with torch.no_grad():
        assert chunked_loss(model, ids, labels, 5).isnan() and plain_loss(model, ids, labels).isnan()


def test_a_chunk_below_one_row_is_refused():
    with pytest.raises(ValueError, match="chunk=0 must be >= 1"):
        zoo.chunked_cross_entropy(torch.zeros(4, 2), lambda h: h, torch.zeros(4, dtype=torch.long), chunk=0)


def saved_shapes(loss_fn) -> list[torch.Size]:
    """The shapes of the tensors autograd keeps for backward while ``loss_fn`` runs (outside the
    checkpointed regions, whose own hooks keep nothing but their inputs)."""
    shapes = []

    def pack(tensor):
        shapes.append(tensor.shape)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss_fn().backward()
    return shapes


def test_no_logits_sized_tensor_is_kept_for_backward():
    """The property that saves the memory: nothing with a vocabulary-wide row is kept for backward,
    where the whole-logits loss keeps (N, V) tensors (its log-softmax)."""
    head = torch.nn.Linear(16, 500, bias=False)  # V = 500, wider than anything else here
    hidden = torch.randn(B, T, 16, requires_grad=True)
    _, labels = batch(500)
    whole = saved_shapes(lambda: F.cross_entropy(head(hidden).flatten(0, 1), labels.flatten()))
    assert (B * T, 500) in whole  # the hook sees them when they exist
    chunked = saved_shapes(lambda: zoo.chunked_cross_entropy(hidden, head, labels, chunk=4))
    assert (4, 16) in chunked and all(500 not in s for s in chunked), chunked  # a chunk's hidden states only


# ---- the tasks: task.loss_chunk ------------------------------------------------------------------------
def twin_tasks(task_cls, model_cfg: zoo.ModelConfig, **settings):
    """The task without and with loss_chunk=5, same weights."""
    plain = task_cls(model=model_cfg.to_dict(), optimizer={"lr": 1e-3}, **settings)
    chunked = task_cls(model=model_cfg.to_dict(), optimizer={"lr": 1e-3}, loss_chunk=5, **settings)
    chunked.load_state_dict(plain.state_dict())
    return plain, chunked


def step_loss_and_grads(task, batch_):
    task.zero_grad(set_to_none=True)
    loss = task.model_step(batch_, 0, "train")
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in task.named_parameters() if p.grad is not None}


def test_generator_training_step_equal_with_and_without_chunks():
    cfg = zoo.get_config("gpt-tiny", n_layers=1, d_model=32, n_heads=2, vocab_size=97)
    plain, chunked = twin_tasks(GeneratorTask, cfg)
    ids, labels = batch(97)
    assert chunked.loss_chunk == 5
    assert_same(
        step_loss_and_grads(plain, {"input_ids": ids, "labels": labels}),
        step_loss_and_grads(chunked, {"input_ids": ids, "labels": labels}),
    )


def test_translator_training_step_equal_with_and_without_chunks():
    cfg = zoo.get_config("t5-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=97)
    plain, chunked = twin_tasks(TranslatorTask, cfg, label_smoothing=0.1)
    source, labels = batch(97)
    mask = torch.ones_like(source)
    mask[0, -2:] = 0  # a padded source
    train_batch = {
        "input_ids": source,
        "attention_mask": mask,
        "labels": labels,
        "decoder_input_ids": torch.roll(source, 1, dims=1),
    }
    assert_same(step_loss_and_grads(plain, train_batch), step_loss_and_grads(chunked, train_batch))


@pytest.mark.parametrize("experiment", ["gpt_generator", "t5_translator"])
def test_loss_chunk_is_a_task_setting_checked_at_composition(experiment, tmp_path):
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose(
            "train", overrides=[f"experiment={experiment}", "task.loss_chunk=-1", f"paths.output_dir={tmp_path}"]
        )
        assert compose("train", overrides=[f"experiment={experiment}"]).task.loss_chunk is None  # off by default
    with pytest.raises(zoo.ConfigError, match="task.loss_chunk=-1 must be >= 1"):
        check_composition(cfg)
    cfg.task.loss_chunk = 64
    model = check_composition(cfg)
    task = instantiate(
        cfg.task, model=model.to_dict(), optimizer=OmegaConf.to_container(cfg.optimizer), _convert_="all"
    )
    assert task.loss_chunk == 64 and task.hparams.loss_chunk == 64  # kept in checkpoints
