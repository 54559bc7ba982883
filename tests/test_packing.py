"""Packed documents without cross-talk: ``data.packing=documents`` marks each position's document,
and a decoder with ``mask=document`` then computes, for every document of a packed row, the logits
it computes for that document alone (attention and positions both restart at each document)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from rounding import assert_rounding_close
from test_data import TEXTS
from test_reliability import run
from test_tasks import STEPS, TINY, compose_train

import zoo
from tasks.cli.train.checks import check_composition
from tasks.data import LMDataModule
from tasks.data.modules import IGNORE
from tasks.data.tokenizers import EOS
from tasks.errors import DataError
from zoo.mask import document_positions

LENGTHS = (5, 7, 4)  # one packed row of three documents, T = 16
POSITIONS = ["learned", "rope", "alibi", "sinusoidal", "t5_relative"]


def _model(position: str, mask: str = "document", attention: str = "sdpa") -> zoo.ZooModel:
    cfg = zoo.ModelConfig(
        arch="decoder",
        vocab_size=64,
        d_model=32,
        n_heads=2,
        n_layers=2,
        max_seq_len=32,
        position=position,
        mask=mask,
        attention=attention,
    )
    return zoo.build_model(cfg, seed=0).eval()


def _packed(lengths: tuple[int, ...] = LENGTHS, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, T) token ids and their (1, T) document ids."""
    ids = torch.randint(5, 64, (1, sum(lengths)), generator=torch.Generator().manual_seed(seed))
    document_ids = torch.cat([torch.full((n,), d) for d, n in enumerate(lengths)])[None]
    return ids, document_ids


def _spans(lengths: tuple[int, ...] = LENGTHS) -> list[slice]:
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    return [slice(s, s + n) for s, n in zip(starts, lengths, strict=True)]


@pytest.mark.parametrize("attention", ["sdpa", "math"])
@pytest.mark.parametrize("position", POSITIONS)
def test_a_packed_row_gives_each_documents_logits_alone(position, attention):
    model = _model(position, attention=attention)
    ids, document_ids = _packed()
    with torch.no_grad():
        packed = model(ids, document_ids=document_ids)  # (1, T, V)
        for span in _spans():
            alone = model(ids[:, span])
            assert_rounding_close(packed[:, span], alone, model)


@pytest.mark.parametrize("position", POSITIONS)
def test_a_change_in_one_document_leaves_the_next_unchanged(position):
    ids, document_ids = _packed()
    first, second = _spans()[:2]
    changed = ids.clone()
    changed[0, first] = (changed[0, first] + 1 - 5) % 59 + 5  # every token of document 0, still >= 5
    with torch.no_grad():
        model = _model(position)
        before, after = model(ids, document_ids=document_ids), model(changed, document_ids=document_ids)
        assert not torch.allclose(before[:, first], after[:, first])
        assert_rounding_close(after[:, second], before[:, second], model)
        causal = _model(position, mask="causal")  # the same check catches cross-talk
        assert not torch.allclose(causal(ids)[:, second], causal(changed)[:, second], atol=1e-5)


def test_two_rows_with_different_boundaries_in_one_batch():
    model = _model("rope")
    rows = [(5, 7, 4), (9, 7)]
    ids = torch.cat([_packed(r, seed=i)[0] for i, r in enumerate(rows)])  # (2, 16)
    document_ids = torch.cat([_packed(r)[1] for r in rows])
    with torch.no_grad():
        packed = model(ids, document_ids=document_ids)
        for b, row in enumerate(rows):
            for span in _spans(row):
                assert_rounding_close(packed[b : b + 1, span], model(ids[b : b + 1, span]), model)


def test_document_positions_restart_at_each_document():
    document_ids = torch.tensor([[0, 0, 0, 1, 1, 2], [0, 1, 1, 1, 1, 1]])
    assert document_positions(document_ids).tolist() == [[0, 1, 2, 0, 1, 0], [0, 0, 1, 2, 3, 4]]


@pytest.mark.parametrize("position", ["learned", "alibi"])
def test_without_document_ids_the_document_mask_is_causal_and_generates(position):
    document, causal = _model(position), _model(position, mask="causal")
    ids, _ = _packed()
    with torch.no_grad():
        torch.testing.assert_close(document(ids), causal(ids), atol=0, rtol=0)
    prompt = ids[:, :6]
    assert torch.equal(document.generate(prompt, 5), causal.generate(prompt, 5))
    assert document.generate(prompt, 5).shape == (1, 11)


def test_other_masks_refuse_document_ids():
    ids, document_ids = _packed()
    with pytest.raises(ValueError, match="mask='document'"):
        _model("rope", mask="causal")(ids, document_ids=document_ids)


# ---- data -----------------------------------------------------------------------------------------
def _data(tmp_path: Path, **kwargs) -> LMDataModule:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "corpus.txt").write_text("\n".join(TEXTS * 3))
    dm = LMDataModule(
        source="local",
        source_args={"path": str(tmp_path)},
        vocab_size=300,
        seq_len=16,
        batch_size=4,
        val_fraction=0.2,
        test_fraction=0.0,
        **kwargs,
    )
    dm.setup("fit")
    return dm


def _batches(dm: LMDataModule) -> list[dict[str, torch.Tensor]]:
    return list(dm.train_dataloader()) + list(dm.val_dataloader())


def test_documents_packing_marks_documents_at_each_eos(tmp_path):
    plain, packed = _batches(_data(tmp_path / "a")), _batches(_data(tmp_path / "b", packing="documents"))
    assert len(plain) == len(packed) and any((b["input_ids"] == EOS).any() for b in packed)
    for before, batch in zip(plain, packed, strict=True):
        ids, docs, labels = batch["input_ids"], batch["document_ids"], batch["labels"]
        assert torch.equal(ids, before["input_ids"]) and docs.shape == ids.shape
        assert (docs[:, 0] == 0).all()
        steps = docs[:, 1:] - docs[:, :-1]  # a new document exactly after each eos
        assert torch.equal(steps, (ids[:, :-1] == EOS).long())
        # the eos is predicted from its document; nothing predicts the next document's first token
        assert torch.equal(labels == IGNORE, ids == EOS)
        assert torch.equal(labels[ids != EOS], before["labels"][ids != EOS])


def test_documents_come_from_the_index_not_from_an_eos_a_text_writes(tmp_path):
    folder = tmp_path / "text"
    folder.mkdir()
    (folder / "corpus.txt").write_text("\n".join([*TEXTS, "a line that writes </s> in its text", *TEXTS]))
    dm = LMDataModule(
        source="local",
        source_args={"path": str(folder)},
        vocab_size=300,
        seq_len=16,
        batch_size=4,
        val_fraction=0.2,
        test_fraction=0.0,
        packing="documents",
        cache_dir=str(tmp_path / "cache"),
    )
    dm.setup("fit")
    blocks = dm.datasets["train"]
    whole = blocks.split.read_ids()
    ends = set(blocks.split.read_ends().tolist())
    written = [i for i, token in enumerate(whole.tolist()) if token == EOS and i + 1 not in ends]
    assert written  # the text's own </s> became the eos id, inside its document
    block = blocks.block
    i = written[0] // block
    batch = dm.collate([blocks[i]])
    at = written[0] - i * block
    if at < block - 1:  # an input position: the same document goes on after it, and is predicted
        assert batch["document_ids"][0, at + 1] == batch["document_ids"][0, at] and batch["labels"][0, at] != IGNORE
    texts = [*TEXTS, "x </s> y"]
    in_memory = dm.build_dataset([{"text": t} for t in texts], "train").items  # (n, 2, block)
    marks = [m for t in texts for m in [0] * (len(dm.encode_with_eos(t)) - 1) + [1]]
    assert in_memory.shape[1:] == (2, block) and in_memory[:, 1].flatten().tolist() == marks[: in_memory[:, 1].numel()]
    assert blocks.ends.within(0, blocks.split.tokens).tolist() == sorted(ends)


def test_document_ends_are_found_page_by_page(tmp_path, monkeypatch):
    from tasks.data.token_files import DocumentEnds, SplitTokens

    monkeypatch.setattr(DocumentEnds, "PAGE", 4)
    ends = np.cumsum(np.random.default_rng(0).integers(1, 9, size=50)).astype(np.int64)
    ends.tofile(tmp_path / "x.ends")
    index = DocumentEnds(SplitTokens(tmp_path / "x.ids", tmp_path / "x.ends", "uint16", int(ends[-1]), len(ends)))
    for start, stop in [(0, 1), (0, int(ends[-1])), (5, 40), (int(ends[20]) - 1, int(ends[20])), (100, 100)]:
        assert index.within(start, stop).tolist() == [e for e in ends.tolist() if start < e <= stop]


def test_concat_packing_is_the_default_and_unchanged(tmp_path):
    default, concat = _batches(_data(tmp_path / "a")), _batches(_data(tmp_path / "b", packing="concat"))
    for a, b in zip(default, concat, strict=True):
        assert set(a) == set(b) == {"input_ids", "labels"}
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
        assert torch.equal(a["input_ids"][:, 1:], a["labels"][:, :-1])  # labels: the next token, nothing ignored


def test_an_unknown_packing_is_refused(tmp_path):
    with pytest.raises(DataError, match="data.packing='docs'"):
        LMDataModule(source="local", source_args={"path": str(tmp_path)}, packing="docs")


def test_a_packed_batch_through_the_document_model_matches_its_documents_alone(tmp_path):
    dm = _data(tmp_path, packing="documents")
    batch = next(iter(dm.train_dataloader()))
    model = _model("learned")
    model = zoo.build_model(
        zoo.ModelConfig(**{**vars(model.config), "vocab_size": dm.tokenizer.get_vocab_size()}), seed=0
    ).eval()
    with torch.no_grad():
        packed = model(batch["input_ids"], document_ids=batch["document_ids"])
        for row, docs, logits in zip(batch["input_ids"], batch["document_ids"], packed, strict=True):
            for d in docs.unique():
                where = docs == d
                assert_rounding_close(logits[where], model(row[where][None])[0], model)


def test_the_generator_task_hands_document_ids_to_the_model():
    from tasks.generator import GeneratorTask

    cfg = _model("learned").config
    task = GeneratorTask(model=cfg.to_dict(), optimizer={"lr": 1e-3}).eval()
    ids, document_ids = _packed()
    labels = torch.roll(ids, -1, dims=1)
    with torch.no_grad():
        loss = task.model_step({"input_ids": ids, "labels": labels, "document_ids": document_ids}, 0, "train")
        expected = torch.nn.functional.cross_entropy(task.model(ids, document_ids=document_ids)[0], labels[0])
        crosstalk = torch.nn.functional.cross_entropy(task.model(ids)[0], labels[0])
    torch.testing.assert_close(loss, expected)
    assert not torch.allclose(loss, crosstalk)


# ---- the real command -----------------------------------------------------------------------------
def test_the_real_command_trains_with_packed_documents(tmp_path):
    out = tmp_path / "run"
    result = run(
        "train",
        "experiment=gpt_generator",
        "data.packing=documents",
        "model/mask=document",
        *TINY["gpt_generator"],
        *STEPS,
        f"hydra.run.dir={out}",
        "test=false",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with (out / "logs" / "metrics.csv").open() as f:
        losses = [float(r["val/loss"]) for r in csv.DictReader(f) if r.get("val/loss")]
    assert losses and all(math.isfinite(v) for v in losses)
    saved = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["zoo_run"]["data"]["packing"] == "documents"
    assert "mask: document" in saved["zoo_run"]["config_yaml"]


def test_packed_documents_without_the_document_mask_stop_at_composition(tmp_path):
    with pytest.raises(zoo.ConfigError, match=r"data.packing=documents .* model/mask=document"):
        check_composition(compose_train("gpt_generator", tmp_path, "data.packing=documents"))
    check_composition(compose_train("gpt_generator", tmp_path, "data.packing=documents", "model/mask=document"))
