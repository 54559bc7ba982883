"""The classifier's and the translator's examples are held compactly (issue 35, item 3): the same
examples as encoding each text alone, in 2 bytes a token (a 4096-token vocabulary) where lists of
Python ints took about 36."""

import json

import numpy as np
import pytest

from tasks.data import ClassificationDataModule, TranslationDataModule
from tasks.data.columns import ColumnDataset, Ragged, id_width


def test_ragged_gives_back_each_sequence():
    seqs = [[5, 6, 7], [], [70000], [1, 2]]
    ragged = Ragged([seqs[:2], seqs[2:]], np.uint32)
    assert [ragged[i] for i in range(len(ragged))] == seqs and ragged.lengths == [3, 0, 1, 2]
    assert ragged.dtype == np.uint32 and id_width(4096) is np.uint16 and id_width(70000) is np.uint32
    data = ColumnDataset((ragged, ["a", "b", "c", "d"]), ragged.lengths)
    assert data[2] == ([70000], "c") and data.items[3] == ([1, 2], "d") and len(data) == 4


def test_classifier_examples_are_each_texts_own_ids_in_two_bytes_a_token(tmp_path):
    rows = [{"text": f"def f{i}(x): return x * {i} + {i % 7}", "label": str(i % 3)} for i in range(400)]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    dm = ClassificationDataModule(source="local", source_args={"path": str(tmp_path / "rows.jsonl")}, vocab_size=300)
    dm.setup("fit")
    train = dm.datasets["train"]
    texts = {r["text"]: r["label"] for r in rows}
    by_ids = {tuple(dm.encode(t)): dm.label_names.index(label) for t, label in texts.items()}
    assert all(by_ids[tuple(ids)] == label for ids, label in train.items) and len(train) > 300
    ids = train.columns[0]
    assert ids.dtype == np.uint16 and ids.nbytes == 2 * sum(train.lengths)


@pytest.mark.parametrize("seq_len", [8, 32])
def test_translator_examples_end_in_one_eos_and_keep_their_reference(seq_len):
    dm = TranslationDataModule(source="numbers", source_args={"n": 300}, vocab_size=150, seq_len=seq_len)
    dm.setup("fit")
    for source, target, reference in dm.datasets["train"].items[:50]:
        assert target == dm.encode_with_eos(reference, seq_len) and len(source) <= seq_len
        assert source[-1] == target[-1] == dm.specials.eos


def _rows(tmp_path, n: int = 300):
    rows = [{"text": f"def g{i}(y): return y - {i} * {i % 5}", "label": f"l{i % 4}"} for i in range(n)]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return str(tmp_path / "rows.jsonl")


def test_a_streamed_source_gives_the_examples_it_gives_read_whole(tmp_path, monkeypatch):
    import tasks.data.text_module as text_module
    from tasks.data.sources.local import Local

    seen: list[list[str]] = []
    real = text_module.train_tokenizer
    monkeypatch.setattr(
        text_module, "train_tokenizer", lambda texts, *a: seen.append(list(texts)) or real(seen[-1], *a)
    )
    path = _rows(tmp_path)
    streamed = ClassificationDataModule(source="local", source_args={"path": path}, vocab_size=300)
    streamed.setup("fit")
    monkeypatch.setattr(Local, "streams", False)  # the source read into a list, as before
    listed = ClassificationDataModule(source="local", source_args={"path": path}, vocab_size=300)
    listed.setup("fit")
    assert seen[0] == seen[1] and streamed.label_names == listed.label_names  # the tokenizer learns from the same
    again = ClassificationDataModule(source="local", source_args={"path": path}, vocab_size=300)
    again.tokenizer = listed.tokenizer  # HF's WordPiece trainer breaks ties differently from run to run
    again.setup("fit")
    monkeypatch.undo()
    streamed_again = ClassificationDataModule(source="local", source_args={"path": path}, vocab_size=300)
    streamed_again.tokenizer = listed.tokenizer
    streamed_again.setup("fit")
    assert {k: d.items for k, d in streamed_again.datasets.items()} == {k: d.items for k, d in again.datasets.items()}


def test_the_tokenizer_of_a_large_record_source_learns_from_a_seeded_sample(tmp_path, monkeypatch):
    import tasks.data.text_module as text_module

    seen: list[list[str]] = []
    real = text_module.train_tokenizer
    monkeypatch.setattr(
        text_module, "train_tokenizer", lambda texts, *a: seen.append(list(texts)) or real(seen[-1], *a)
    )
    path = _rows(tmp_path, 3000)
    budget = 0.01  # MB: a fraction of the training split's text
    for seed in (0, 0, 1):
        dm = ClassificationDataModule(source="local", source_args={"path": path}, tokenizer_sample_mb=budget, seed=seed)
        dm.setup("fit")
    sizes = [sum(len(t) for t in texts) for texts in seen]
    assert all(0 < size <= budget * 2**20 for size in sizes) and seen[0] == seen[1] != seen[2]
    whole = ClassificationDataModule(source="local", source_args={"path": path})
    whole.setup("fit")
    assert sum(len(t) for t in seen[-1]) > 5 * budget * 2**20  # under the sample size: every training text
