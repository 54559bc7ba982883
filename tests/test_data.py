"""Data modules: deterministic splits, packing, padding, masking, bucketing, tokenizers; conf/ in sync."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

import zoo
from tasks import MLMTask
from tasks.cli.schemas import conf_dir
from tasks.data import LMDataModule, MLMDataModule, TranslationDataModule
from tasks.data.loading import BucketBatchSampler
from tasks.data.modules import IGNORE
from tasks.data.sources import load_records, split_of
from tasks.data.tokenizers import EOS, MASK, PAD, SPECIALS, load_or_train, train_tokenizer

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    x: int\n    y: int\n",
    "The quick brown fox jumps over the lazy dog.",
] * 30


def test_splits_are_deterministic_and_proportional():
    keys = [f"file_{i}.py" for i in range(5000)]
    splits = Counter(split_of(k, 0.1, 0.1) for k in keys)
    assert [split_of(k, 0.1, 0.1) for k in keys[:50]] == [split_of(k, 0.1, 0.1) for k in keys[:50]]
    assert 400 < splits["val"] < 600 and 400 < splits["test"] < 600


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "unigram"])
def test_tokenizers_train_with_fixed_special_ids_and_round_trip(kind, tmp_path):
    tok = train_tokenizer(TEXTS, kind, vocab_size=200)
    assert [tok.token_to_id(t) for t in SPECIALS] == [0, 1, 2, 3, 4]
    ids = tok.encode("def add(a, b):").ids
    assert tok.decode(ids).replace(" ", "") == "defadd(a,b):"
    tok.save(str(tmp_path / "tokenizer.json"))
    assert load_or_train(tmp_path / "tokenizer.json", [], kind, 0).encode("class").ids == tok.encode("class").ids


def test_a_tokenizer_without_our_special_tokens_is_refused(tmp_path):
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token="a")).save(str(tmp_path / "t.json"))
    with pytest.raises(ValueError, match="special tokens"):
        load_or_train(tmp_path / "t.json", [], "bpe", 0)


def _setup(dm):
    dm.setup("fit")
    return dm


def test_lm_data_packs_full_blocks_with_shifted_labels(tmp_path):
    (tmp_path / "corpus.txt").write_text("\n".join(TEXTS * 3))
    dm = _setup(
        LMDataModule(
            source="local",
            source_args={"path": str(tmp_path)},
            vocab_size=300,
            seq_len=16,
            batch_size=4,
            val_fraction=0.2,
            test_fraction=0.0,
        )
    )
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == batch["labels"].shape == (4, 16)
    assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
    assert dm.model_sizes() == {"vocab_size": dm.tokenizer.get_vocab_size(), "pad_token_id": PAD, "eos_token_id": EOS}


def test_local_records_read_csv_and_jsonl(tmp_path):
    (tmp_path / "a.csv").write_text("sentence,category\nhello there,greeting\nbye now,farewell\n")
    rows = load_records("local", path=tmp_path / "a.csv", text="sentence", label="category")
    assert [(r["text"], r["label"]) for r in rows] == [("hello there", "greeting"), ("bye now", "farewell")]
    (tmp_path / "b.jsonl").write_text('{"source": "one", "target": "eins"}\n')
    assert load_records("local", path=tmp_path / "b.jsonl")[0]["target"] == "eins"


def test_mlm_masking_follows_15_percent_and_80_10_10():
    dm = MLMDataModule(source="stdlib_docstrings", vocab_size=300, seq_len=64, max_records=50)
    dm.tokenizer = train_tokenizer(TEXTS, "wordpiece", 300)
    dm.prepare_tokenizer(dm.tokenizer)
    torch.manual_seed(0)
    original = [list(range(len(SPECIALS), len(SPECIALS) + 60))] * 400
    batch = dm.collate(original)
    chosen = batch["labels"] != IGNORE
    assert abs(chosen.float().mean().item() - 0.15) < 0.01
    assert torch.equal(batch["chosen"], chosen.flatten().nonzero().squeeze(1))  # the step's flat indices
    masked = (batch["input_ids"] == MASK) & chosen
    kept = (batch["input_ids"] == batch["labels"]) & chosen
    assert abs(masked.sum() / chosen.sum() - 0.8) < 0.03
    assert abs(kept.sum() / chosen.sum() - 0.1) < 0.03  # (random replacements rarely hit the same token)
    assert (batch["input_ids"][~chosen] == torch.tensor(original)[~chosen]).all()


def test_a_short_mlm_batch_that_draws_no_position_gets_one_and_its_loss_is_finite():
    """At 15% a batch of one 4-token text draws no position about half the time: the collate then
    chooses one of its ordinary tokens, so the mean loss is never an average over nothing (NaN)."""
    dm = MLMDataModule(source="stdlib_docstrings", vocab_size=300, seq_len=64, max_records=50)
    dm.tokenizer = train_tokenizer(TEXTS, "wordpiece", 300)
    dm.prepare_tokenizer(dm.tokenizer)
    short = [[SPECIALS.index("<s>"), 40, 41, 42]]
    ordinary = torch.tensor(short[0]) >= len(SPECIALS)
    for seed in range(40):
        batch = dm.draw(dm.pad(short), torch.Generator().manual_seed(seed))
        assert len(batch["chosen"]) >= 1, seed
        assert ordinary.flatten()[batch["chosen"]].all()  # never a special token
    settings = {"name": "adamw", "lr": 1e-3}
    task = MLMTask(model=zoo.get_config("bert-tiny", vocab_size=300, mlm_head=True).to_dict(), optimizer=settings)
    hidden = torch.randn(1, 4, task.model.config.d_model, requires_grad=True)
    nothing = torch.zeros(0, dtype=torch.long)
    loss = task.masked_loss(hidden, torch.full((1, 4), IGNORE), nothing, "train")
    loss.backward()  # a batch of special tokens only: zero, and still a step autograd can take
    assert loss.item() == 0.0 and hidden.grad is not None


def test_translation_batches_shift_the_target_behind_the_start_token():
    dm = _setup(
        TranslationDataModule(source="numbers", source_args={"n": 300}, vocab_size=150, seq_len=32, batch_size=8)
    )
    batch = next(iter(dm.val_dataloader()))
    labels, dec = batch["labels"], batch["decoder_input_ids"]
    assert (dec[:, 0] == PAD).all()
    keep = (labels[:, :-1] != IGNORE) & (labels[:, :-1] != EOS)  # the step after </s> is padding
    assert torch.equal(dec[:, 1:][keep], labels[:, :-1][keep])
    assert ((labels == EOS).sum(1) == 1).all()
    assert batch["attention_mask"].sum() == (batch["input_ids"] != PAD).sum()


def test_bucketing_covers_every_index_once_and_groups_lengths():
    lengths = [int(x) for x in torch.randint(1, 200, (1000,))]
    sampler = BucketBatchSampler(lengths, 16, shuffle=True, seed=0)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / len(batches)
    assert spread < 20  # random batches would spread ~170
    assert list(sampler) != batches  # a new order each epoch


def test_docstring_labels_are_packages():
    records = load_records("stdlib_docstrings", packages=("json",))
    assert records and {r["label"] for r in records} == {"json"}


def test_every_registered_name_has_a_yaml_file_and_back():
    conf = Path(conf_dir()) / "model"
    for family, names in zoo.list_components().items():
        files = sorted(p.stem for p in (conf / family).glob("*.yaml"))
        assert files == names, family
        for name in names:
            assert (conf / family / f"{name}.yaml").read_text().splitlines()[1] == f"{family}: {name}"
    assert sorted(p.stem for p in conf.glob("*.yaml")) == zoo.list_models()


def test_number_pairs_give_short_numbers_weight_and_score_each_number_once():
    records = load_records("numbers", n=4000, target_lang="fr")
    digits = Counter(len(r["key"]) for r in records)
    assert digits[1] + digits[2] > 0.15 * len(records)  # drawn uniformly below 100,000 they would be 0.1%
    targets: dict[str, set[str]] = {}
    for r in records:
        targets.setdefault(r["key"], set()).add(r["target"])
    assert all(len(t) == 1 for t in targets.values()) and targets["6"] == {"six"}
    dm = _setup(
        TranslationDataModule(source="numbers", source_args={"n": 4000}, vocab_size=300, seq_len=32, batch_size=8)
    )
    held_out = [dm.datasets[s] for s in ("val", "test")]
    for dataset in held_out:  # a repeated number weights training; a score counts it once
        references = [item[2] for item in dataset.items]
        assert len(references) == len(set(references))
    train = Counter(item[2] for item in dm.datasets["train"].items)
    assert max(train.values()) > 1
