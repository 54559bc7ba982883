"""Pipeline parallelism (zoo/pipeline.py, tasks/parallel/pipeline.py, ``trainer=pp``): stages chained in one
process compute the whole model; the refusals; and zoo-train on 2 processes (gloo) against 1: the same
losses step for step, a checkpoint that is the one-process checkpoint (weights and optimizer state), and
resumes from one process into pipeline stages and back."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from parallel_runs import losses, resume_both_ways, train

import zoo
from tasks.cli.schemas import conf_dir
from tasks.parallel.pipeline import PipelineParallelStrategy, _whole_order
from zoo.pipeline import Stage, check_pipeline, stage_layers, tied_embedding

# ---- the stages, chained in one process ------------------------------------------------------------------


def test_blocks_are_cut_into_contiguous_even_runs():
    assert stage_layers(5, 2) == [range(0, 3), range(3, 5)]
    assert stage_layers(4, 4) == [range(i, i + 1) for i in range(4)]
    assert [len(r) for r in stage_layers(10, 3)] == [4, 3, 3]
    with pytest.raises(zoo.ConfigError, match=r"^model.n_layers=2 cannot be cut into 3 pipeline stages"):
        stage_layers(2, 3)


CHAINS = {  # learned positions and a tied head; RoPE, GQA and an untied head; a window pattern; documents
    "gpt-tiny": {},
    "llama-tiny": {"tie_embeddings": False},
    "llama-tiny window": {"mask": "sliding_window", "window": 4, "window_pattern": "LG"},
    "gpt-tiny documents": {"mask": "document"},
}


@pytest.mark.parametrize("name", CHAINS)
def test_stages_chained_compute_the_whole_model(name):
    """Logits through 3 stages equal the whole model's, with padding (or packed documents), and each
    stage holds only its blocks, under the whole model's names."""
    whole = zoo.create_model(name.split()[0], n_layers=5, dropout=0.0, seed=0, **CHAINS[name]).eval()
    ids = torch.randint(5, whole.config.vocab_size, (2, 12))
    documents = torch.tensor([[0] * 5 + [1] * 7, [0] * 12]) if "documents" in name else None
    mask = None if documents is not None else torch.ones_like(ids).index_fill_(1, torch.tensor([0, 1]), 0)
    stages = [Stage(copy.deepcopy(whole), i, 3) for i in range(3)]
    x = ids
    with torch.no_grad():
        for stage in stages:
            x = stage(x, mask, documents)
        expected = whole(ids, mask, document_ids=documents)
    torch.testing.assert_close(stages[-1].model.logits(x), expected)
    names = dict(whole.named_parameters())
    for stage, layers in zip(stages, ([0, 1], [2, 3], [4]), strict=True):
        held = {n for n, _ in stage.model.named_parameters()}
        assert held <= set(names)
        blocks = {int(n.split(".")[2]) for n in held if n.startswith("decoder.blocks.")}
        assert blocks == set(layers)
    tied = [tied_embedding(stage) is not None for stage in stages]
    assert tied == ([True, False, True] if whole.lm_head is None else [False, False, False])


ENCODERS = {  # BERT: segments, learned positions, a pooler and the tied MLM head; RoPE, no pooler or segments
    "bert-tiny": {"type_vocab_size": 2, "pooler": True, "mlm_head": True},
    "bert-tiny rope": {"position": "rope", "type_vocab_size": 0, "pooler": False, "mlm_head": True},
}


@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_stages_chained_compute_the_whole_encoder(name):
    """An encoder's hidden states through 3 stages equal the whole encoder's, with padding and segment ids;
    the first stage alone holds the embeddings, the last the pooler and MLM head, and the last's copy
    of the embedding (the MLM head reads it) is the tied one."""
    whole = zoo.create_model(name.split()[0], n_layers=4, dropout=0.0, seed=0, **ENCODERS[name]).eval()
    ids = torch.randint(5, whole.config.vocab_size, (2, 10))
    mask = torch.ones_like(ids).index_fill_(1, torch.tensor([8, 9]), 0)
    segments = torch.tensor([[0] * 4 + [1] * 6, [0] * 10]) if whole.segment is not None else None
    stages = [Stage(copy.deepcopy(whole), i, 3) for i in range(3)]
    x = ids
    with torch.no_grad():
        for stage in stages:
            x = stage(x, mask, token_type_ids=segments)
        expected = whole(ids, mask, segments)
        torch.testing.assert_close(x, expected)
        torch.testing.assert_close(stages[-1].model.mlm_logits(x), whole.mlm_logits(expected))
        if whole.pooler is not None:
            torch.testing.assert_close(stages[-1].model.pool(x), whole.pool(expected))
    first, middle, last = (stage.model for stage in stages)
    assert first.embed is not None and middle.embed is None and last.embed is not None
    assert (first.segment is not None) == (whole.segment is not None) and middle.segment is last.segment is None
    assert first.mlm_head is None and middle.mlm_head is None and last.mlm_head is not None
    assert [tied_embedding(stage) is not None for stage in stages] == [True, False, True]


def test_an_encoder_without_a_vocabulary_head_keeps_no_embedding_past_the_first_stage():
    whole = zoo.create_model("bert-tiny", n_layers=2, mlm_head=False, pooler=True, seed=0)
    first, last = Stage(copy.deepcopy(whole), 0, 2), Stage(copy.deepcopy(whole), 1, 2)
    assert last.model.embed is None and last.model.pooler is not None and first.model.pooler is None
    assert tied_embedding(first) is None and tied_embedding(last) is None


def _batch(kind: str, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (4, 10), generator=g)
    mask = torch.ones_like(ids).index_fill_(1, torch.tensor([8, 9]), 0)
    if kind == "generator":
        labels = ids.roll(-1, 1).index_fill_(1, torch.tensor([9]), -100)
        return {"input_ids": ids, "labels": labels}
    if kind == "classifier":
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 2, 1, 2])}
    labels = torch.where(torch.rand(ids.shape, generator=g) < 0.3, ids, -100).masked_fill(mask == 0, -100)
    chosen = (labels != -100).flatten().nonzero().squeeze(1)  # as the collate finds them (MLMDataModule)
    per_row = [(row != -100).nonzero().squeeze(1).tolist() for row in labels]  # and row by row, -1 after
    width = max(len(r) for r in per_row)
    rows = torch.tensor([r + [-1] * (width - len(r)) for r in per_row])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "chosen": chosen, "chosen_rows": rows}


@pytest.mark.parametrize(
    ("kind", "pooling"), [("generator", None), ("classifier", "cls"), ("classifier", "mean"), ("mlm", None)]
)
def test_a_tasks_microbatch_losses_sum_to_its_batch_loss(kind, pooling):
    """What trainer=pp computes of a batch cut into microbatches (pipeline_batch, then pipeline_loss on each
    microbatch's rows, over the item count) is the task's one-process loss (model_step)."""
    from tasks.classifier import ClassifierTask
    from tasks.generator import GeneratorTask
    from tasks.mlm import MLMTask

    torch.manual_seed(0)
    optimizer = {"lr": 1e-3}
    if kind == "generator":
        task = GeneratorTask(model=zoo.get_config("gpt-tiny", dropout=0.0).to_dict(), optimizer=optimizer)
    elif kind == "classifier":
        model = zoo.get_config("bert-tiny", dropout=0.0).to_dict()
        task = ClassifierTask(model=model, optimizer=optimizer, label_names=["a", "b", "c"], pooling=pooling)
    else:
        task = MLMTask(model=zoo.get_config("bert-tiny", dropout=0.0, mlm_head=True).to_dict(), optimizer=optimizer)
    task.eval()
    batch = _batch(kind, task.model.config.vocab_size)
    cut = task.pipeline_batch(batch)
    with torch.no_grad():
        whole = task.model_step(batch, 0, "val")
        metrics = {k: v.item() for k, v in task.metrics_at("val").compute().items()}
        task.metrics_at("val").reset()
        total = torch.zeros(())
        for rows in torch.arange(4).tensor_split(2):  # two microbatches, as the schedule cuts the rows
            extra = {k: v[rows] for k, v in cut.extra.items()}
            model = task.model
            hidden = (
                model.features(cut.inputs[rows], **extra) if kind == "generator" else model(cut.inputs[rows], **extra)
            )
            total += task.pipeline_loss(hidden, {k: v[rows] for k, v in cut.target.items()}, "val")
    torch.testing.assert_close(total / cut.items, whole)
    assert {k: v.item() for k, v in task.metrics_at("val").compute().items()} == pytest.approx(metrics)


@pytest.mark.parametrize(
    ("preset", "overrides", "words"),
    [
        ("llama-tiny", {"value_residual": True}, r"^model.value_residual=true mixes"),
        ("llama-tiny", {"ffn": "moe", "n_experts": 2}, r"^ffn='moe' adds auxiliary losses"),
        ("t5-tiny", {}, r"^arch='encoder_decoder': trainer=pp cuts the blocks of a decoder or an encoder"),
        ("gpt-tiny", {"position": "t5_relative"}, r"^position='t5_relative': one learned bias table"),
        ("gpt-tiny", {"n_layers": 1}, r"^model.n_layers=1 cannot be cut into 2 pipeline stages"),
    ],
)
def test_what_cannot_be_cut_is_refused_in_one_line(preset, overrides, words):
    with torch.device("meta"):
        model = zoo.create_model(preset, **overrides)
    with pytest.raises(zoo.ConfigError, match=words) as caught:
        check_pipeline(model, 2)
    assert "\n" not in str(caught.value)


def test_the_pp_trainer_composes_and_checks_its_settings():
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("train", overrides=["trainer=pp"]).trainer
    assert cfg.devices == 2
    strategy = instantiate(cfg.strategy)
    assert isinstance(strategy, PipelineParallelStrategy) and strategy.schedule == "1f1b"
    with pytest.raises(zoo.ConfigError, match=r"^trainer.strategy.schedule='zb' is not a pipeline schedule"):
        PipelineParallelStrategy(schedule="zb")
    with pytest.raises(zoo.ConfigError, match=r"^trainer.strategy.microbatches=0 must be an integer >= 1"):
        PipelineParallelStrategy(microbatches=0)


def test_the_whole_optimizer_order_is_each_group_in_stage_order_each_name_once():
    first = [["embed", "b0.w"], ["b0.bias"]]
    last = [["b1.w", "head"], ["embed", "b1.bias"]]  # a tied copy of the embedding, in the other group
    assert _whole_order([first, last]) == {"embed": 0, "b0.w": 1, "b1.w": 2, "head": 3, "b0.bias": 4, "b1.bias": 5}


def test_zoo_train_refuses_what_pp_cannot_cut_before_it_claims_a_run_directory(tmp_path):
    from test_tasks import compose_train

    from tasks.cli.train.checks import check_composition

    cfg = compose_train("gpt_generator", tmp_path / "run", "trainer=pp", "model.value_residual=true")
    with pytest.raises(zoo.ConfigError, match=r"^model.value_residual=true"):
        check_composition(cfg)
    assert not (tmp_path / "run").exists()
    check_composition(compose_train("gpt_generator", tmp_path / "run", "trainer=pp"))


# ---- zoo-train: 2 stages against 1 process ---------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The same 6 steps in one process, on 2 stages (1F1B, tested after), and on 2 stages of GPipe and
    of 1F1B with 2 batches accumulated per step against one process accumulating them."""
    root = tmp_path_factory.mktemp("pp")
    train("cpu", root / "one", "test=false")
    train("pp", root / "pp")
    accumulate = ["trainer.accumulate_grad_batches=2", "trainer.max_steps=3", "test=false"]
    train("cpu", root / "one_acc", *accumulate)
    train("pp", root / "gpipe_acc", "trainer.strategy.schedule=gpipe", "trainer.strategy.microbatches=2", *accumulate)
    return {name: root / name for name in ("one", "pp", "one_acc", "gpipe_acc")}


@pytest.mark.slow
def test_pipeline_training_matches_one_process(runs):
    one, pp = losses(runs["one"]), losses(runs["pp"])
    assert sorted(pp) == list(range(1, 7))
    assert pp == pytest.approx(one, rel=1e-5)
    assert losses(runs["pp"], "val/loss") == pytest.approx(losses(runs["one"], "val/loss"), rel=1e-5)
    header = (runs["pp"] / "logs" / "metrics.csv").read_text().splitlines()[0]
    assert "test/loss" in header and "test/ppl" in header
    assert losses(runs["gpipe_acc"]) == pytest.approx(losses(runs["one_acc"]), rel=1e-5)
    counts = [re.findall(r"([\d,]+) parameters", (runs[r] / "stdout.txt").read_text()) for r in ("one", "pp")]
    assert counts[0] and counts[1] == counts[0]  # the closing table counts the whole model, not a stage


@pytest.mark.slow
def test_a_pipeline_checkpoint_is_a_one_process_checkpoint(runs):
    one = torch.load(runs["one"] / "checkpoints" / "last.ckpt", weights_only=True)
    pp = torch.load(runs["pp"] / "checkpoints" / "last.ckpt", weights_only=True)
    assert pp["state_dict"].keys() == one["state_dict"].keys()
    for name, value in one["state_dict"].items():
        torch.testing.assert_close(pp["state_dict"][name], value, atol=1e-6, rtol=1e-4, msg=name)
    ours, theirs = pp["optimizer_states"][0], one["optimizer_states"][0]
    assert [g["params"] for g in ours["param_groups"]] == [g["params"] for g in theirs["param_groups"]]
    assert ours["state"].keys() == theirs["state"].keys()
    for index, state in theirs["state"].items():
        torch.testing.assert_close(ours["state"][index], state, atol=1e-7, rtol=1e-3)


@pytest.mark.slow
def test_checkpoints_resume_across_one_process_and_pipeline_stages(runs, tmp_path):
    """Two more steps: on stages from the one-process checkpoint, and in one process from the stages'."""
    resume_both_ways("pp", runs, tmp_path)


@pytest.mark.slow
def test_three_stages_match_one_process(tmp_path):
    """A middle stage with neither embedding nor head, and a tied embedding summed over the first and the
    last stage's own process group."""
    three = ["model.n_layers=3", "trainer.max_steps=3", "test=false"]
    train("cpu", tmp_path / "one", *three)
    train("pp", tmp_path / "pp", "trainer.devices=3", *three)
    assert losses(tmp_path / "pp") == pytest.approx(losses(tmp_path / "one"), rel=1e-5)


# ---- the encoder tasks: a classifier's head and the MLM head on the last stage -----------------------------


@pytest.fixture(scope="module")
def encoder_runs(tmp_path_factory) -> dict[str, dict[str, Path]]:
    """Each encoder experiment's 6 steps in one process and on 2 stages, on the one tokenizer (a WordPiece
    trained twice may differ: tokenizers' trainer breaks ties in hash order)."""
    root, runs = tmp_path_factory.mktemp("pp_encoders"), {}
    for experiment in ("bert_classifier", "bert_mlm"):
        one, pp = root / experiment / "one", root / experiment / "pp"
        one.parent.mkdir()
        train("cpu", one, experiment=experiment)
        train("pp", pp, f"data.tokenizer_path={one / 'tokenizer.json'}", experiment=experiment)
        runs[experiment] = {"one": one, "pp": pp}
    return runs


@pytest.mark.slow
@pytest.mark.parametrize(("experiment", "metric"), [("bert_classifier", "val/acc"), ("bert_mlm", "val/masked_acc")])
def test_encoder_tasks_on_stages_match_one_process(encoder_runs, experiment, metric):
    """The same losses and metrics step for step, and a checkpoint (the classifier's head, the pooler, the
    MLM head with it) that is the one-process checkpoint."""
    one, pp = encoder_runs[experiment]["one"], encoder_runs[experiment]["pp"]
    assert sorted(losses(pp)) == list(range(1, 7))
    assert losses(pp) == pytest.approx(losses(one), rel=1e-5)
    for name in ("val/loss", metric):
        assert losses(pp, name) == pytest.approx(losses(one, name), rel=1e-5)
    ours = torch.load(pp / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    theirs = torch.load(one / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        torch.testing.assert_close(ours[name], value, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.slow
def test_a_classifier_resumes_across_one_process_and_pipeline_stages(encoder_runs, tmp_path):
    resume_both_ways("pp", encoder_runs["bert_classifier"], tmp_path, experiment="bert_classifier")
