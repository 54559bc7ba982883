"""Hugging Face tokenizers in the data modules: special tokens at the ids a model folder gives them
(a BERT's [PAD], [CLS], [SEP], [MASK] at non-zero ids; a GPT-2's lone <|endoftext|>; a T5's
<pad>=0, </s>=1, <unk>=2), read from tokenizer.json, tokenizer_config.json, special_tokens_map.json
and config.json as transformers' ``save_pretrained`` writes them. Batches keep one [CLS] / [SEP] /
</s>, pad with the pad id (eos where there is none), mask only ordinary tokens, and start the
decoder with the decoder start token."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tasks.data import ClassificationDataModule, LMDataModule, MLMDataModule, TranslationDataModule
from tasks.data.modules import IGNORE
from tasks.data.tokenizers import ROLES, Specials, read_hf_tokenizer
from tasks.errors import DataError

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "cat",
    "sat",
    "on",
    "mat",
    "red",
    "blue",
    "green",
    "tree",
    "house",
    "runs",
    "far",
]
LINES = [" ".join(WORDS[(i * k + k) % len(WORDS)] for k in range(1, 4 + i % 6)) + f" {WORDS[i % 7]}" for i in range(60)]
BERT_ORDER = [
    *sorted(WORDS)[:5],
    "[PAD]",
    *sorted(WORDS)[5:9],
    "[UNK]",
    "[CLS]",
    "[SEP]",
    *sorted(WORDS)[9:13],
    "[MASK]",
    *sorted(WORDS)[13:],
]  # BERT's special tokens at non-zero ids, between ordinary ones
ADDED_TOKEN = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}


def _write(folder: Path, tok: Tokenizer, **files: dict) -> Path:
    folder.mkdir(parents=True)
    tok.save(str(folder / "tokenizer.json"))
    for name, content in files.items():
        (folder / f"{name}.json").write_text(json.dumps(content))
    return folder


def _bert() -> Tokenizer:
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(BERT_ORDER)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    cls, sep = BERT_ORDER.index("[CLS]"), BERT_ORDER.index("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tok


def _gpt2() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(
        LINES,
        trainers.BpeTrainer(vocab_size=300, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    )
    tok.add_special_tokens(["<|endoftext|>"])  # after the merges, as GPT-2's 50256
    return tok


def _t5() -> Tokenizer:
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        LINES,
        trainers.UnigramTrainer(
            vocab_size=80, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>", show_progress=False
        ),
    )
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    return tok


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """bert: plain-string entries split over tokenizer_config.json and special_tokens_map.json;
    gpt2: tokenizer_config.json only, no pad; t5: AddedToken dicts and a config.json; bart_start: a
    T5 tokenizer whose model starts decoding from eos."""
    root = tmp_path_factory.mktemp("hf")
    return {
        "bert": _write(
            root / "bert",
            _bert(),
            tokenizer_config={"pad_token": "[PAD]", "unk_token": "[UNK]", "sep_token": "[SEP]"},
            special_tokens_map={"cls_token": "[CLS]", "mask_token": "[MASK]"},
        ),
        "gpt2": _write(
            root / "gpt2",
            _gpt2(),
            tokenizer_config={"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"},
        ),
        "t5": _write(
            root / "t5",
            _t5(),
            tokenizer_config={
                f"{role}_token": {"content": token, **ADDED_TOKEN, "__type": "AddedToken"}
                for role, token in (("pad", "<pad>"), ("eos", "</s>"), ("unk", "<unk>"))
            },
            config={"pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0},
        ),
        "bart_start": _write(
            root / "bart_start",
            _t5(),
            tokenizer_config={"pad_token": "<pad>", "eos_token": "</s>"},
            config={"decoder_start_token_id": 1},
        ),  # BART starts decoding from eos, not pad
    }


def _expected(name: str, tok: Tokenizer) -> dict[str, int | None]:
    if name == "bert":
        ids = {role: BERT_ORDER.index(f"[{role.upper()}]") for role in ("pad", "unk", "cls", "sep", "mask")}
        return {**ids, "bos": None, "eos": None, "decoder_start": ids["pad"]}
    if name == "gpt2":
        eot = tok.get_vocab_size() - 1
        return {
            "pad": None,
            "unk": eot,
            "bos": eot,
            "eos": eot,
            "mask": None,
            "cls": None,
            "sep": None,
            "decoder_start": None,
        }
    return {"pad": 0, "eos": 1, "unk": 2, "bos": None, "mask": None, "cls": None, "sep": None, "decoder_start": 0}


@pytest.mark.parametrize("name", ["bert", "gpt2", "t5"])
def test_special_ids_are_read_from_the_folder(folders, name):
    tok, specials = read_hf_tokenizer(folders[name])
    assert {role: getattr(specials, role) for role in (*ROLES, "decoder_start")} == _expected(name, tok)
    named = {i for i in _expected(name, tok).values() if i is not None}
    assert named <= specials.ids and all(tok.id_to_token(i) in tok.get_vocab() for i in specials.ids)
    assert str(folders[name]) in specials.origin


def test_config_json_ids_win_and_every_id_of_an_eos_list_is_special(folders, tmp_path):
    folder = tmp_path / "t5"
    shutil.copytree(folders["t5"], folder)
    tok, _ = read_hf_tokenizer(folder)
    word = tok.encode("the", add_special_tokens=False).ids[0]
    (folder / "config.json").write_text(
        json.dumps({"eos_token_id": [word, 1], "decoder_start_token_id": 2, "pad_token_id": None})
    )
    _, specials = read_hf_tokenizer(folder)
    assert (specials.eos, specials.decoder_start, specials.pad) == (word, 2, 0)
    assert {word, 1, 2, 0} <= specials.ids


@pytest.mark.parametrize(
    "name, tokens",
    [
        (
            "bert",
            {
                "pad_token": "[PAD]",
                "unk_token": "[UNK]",
                "cls_token": "[CLS]",
                "sep_token": "[SEP]",
                "mask_token": "[MASK]",
            },
        ),
        ("gpt2", {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}),
        ("t5", {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}),
    ],
)
def test_a_folder_transformers_saved_reads_with_the_ids_transformers_reports(name, tokens, tmp_path):
    transformers = pytest.importorskip("transformers")
    built = {"bert": _bert, "gpt2": _gpt2, "t5": _t5}[name]()
    transformers.PreTrainedTokenizerFast(tokenizer_object=built, **tokens).save_pretrained(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    tok, specials = read_hf_tokenizer(tmp_path)
    assert {role: getattr(specials, role) for role in ROLES} == {
        role: getattr(theirs, f"{role}_token_id") for role in ROLES
    }
    assert tok.encode(LINES[3]).ids == theirs(LINES[3])["input_ids"]


def test_specials_survive_a_weights_only_checkpoint_and_zoo_records_none(folders):
    tok, specials = read_hf_tokenizer(folders["t5"])
    dm = TranslationDataModule(source="numbers")
    assert dm.specials_record() is None  # zoo's own tokenizers: fixed ids, nothing to keep
    dm.use_tokenizer(tok, specials)
    buffer = io.BytesIO()
    torch.save({"tokenizer_specials": dm.specials_record()}, buffer)
    buffer.seek(0)
    assert Specials.from_record(torch.load(buffer, weights_only=True)["tokenizer_specials"]) == specials
    assert specials.others and specials != Specials.zoo()


def _one_line_error(call, *args) -> str:
    with pytest.raises(DataError) as caught:
        call(*args)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_folder_without_a_readable_tokenizer_json_is_refused_by_name(folders, tmp_path):
    assert f"init_from={tmp_path / 'nope'}: no such folder" in _one_line_error(read_hf_tokenizer, tmp_path / "nope")
    (tmp_path / "model").mkdir()
    message = _one_line_error(read_hf_tokenizer, tmp_path / "model")
    assert f"init_from={tmp_path / 'model'}: no tokenizer.json" in message and "save_pretrained" in message
    (tmp_path / "model" / "tokenizer.json").write_text("{not json")
    message = _one_line_error(read_hf_tokenizer, tmp_path / "model")
    assert str(tmp_path / "model" / "tokenizer.json") in message and "not a tokenizer file" in message
    shutil.copy(folders["bert"] / "tokenizer.json", tmp_path / "model")
    (tmp_path / "model" / "tokenizer_config.json").write_text(json.dumps({"mask_token": "<mask>"}))
    message = _one_line_error(read_hf_tokenizer, tmp_path / "model")
    assert str(tmp_path / "model") in message and "mask_token='<mask>'" in message


@pytest.mark.parametrize(
    "module, name, role",
    [(MLMDataModule, "t5", "mask"), (TranslationDataModule, "bert", "eos"), (LMDataModule, "bert", "eos")],
)
def test_a_tokenizer_without_a_token_the_task_needs_is_refused_by_folder(folders, module, name, role):
    dm = module(source="local", source_args={"path": "unused"})
    message = _one_line_error(dm.use_tokenizer, *read_hf_tokenizer(folders[name]))
    assert message.startswith(f"init_from={folders[name]}: the tokenizer has no {role} token")


def test_a_foreign_tokenizer_set_without_its_specials_is_refused(folders, tmp_path):
    (tmp_path / "lines.txt").write_text("\n".join(LINES))
    dm = LMDataModule(source="local", source_args={"path": str(tmp_path / "lines.txt")}, val_fraction=0.25)
    dm.tokenizer, _ = read_hf_tokenizer(folders["bert"])
    assert "use_tokenizer" in _one_line_error(dm.setup, "fit")


def _data_module(module, folder: Path, path: Path, **kwargs):
    dm = module(
        source="local", source_args={"path": str(path)}, batch_size=8, val_fraction=0.25, test_fraction=0.0, **kwargs
    )
    dm.use_tokenizer(*read_hf_tokenizer(folder))
    dm.setup("fit")
    return dm


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_lm_blocks_hold_documents_separated_by_one_eos(folders, tmp_path, name):
    (tmp_path / "lines.txt").write_text("\n".join(LINES))
    dm = _data_module(LMDataModule, folders[name], tmp_path / "lines.txt", seq_len=16)
    eos = dm.specials.eos
    documents = {tuple(dm.tokenizer.encode(line, add_special_tokens=False).ids) for line in LINES}
    stream = dm.datasets["train"].items.flatten().tolist()
    pieces = " ".join(map(str, stream)).split(f" {eos} ")  # the stream starts at a document; the last is cut
    assert len(pieces) > 10
    assert all(tuple(map(int, piece.split())) in documents for piece in pieces[:-1])
    assert dm.model_sizes() == {
        "vocab_size": dm.tokenizer.get_vocab_size(),
        "pad_token_id": dm.specials.pad,
        "eos_token_id": eos,
    }
    assert dm.specials.pad == (eos if name == "gpt2" else 0)


def _classified(folders, tmp_path, name: str, seq_len: int) -> tuple[list[list[int]], dict]:
    (tmp_path / "rows.jsonl").write_text(
        "\n".join(json.dumps({"text": line, "label": str(i % 3)}) for i, line in enumerate(LINES))
    )
    dm = _data_module(ClassificationDataModule, folders[name], tmp_path / "rows.jsonl", seq_len=seq_len)
    items = [ids for ids, _ in dm.datasets["train"].items[:16]]
    return items, dm.collate([(ids, 0) for ids in items]) | {"specials": dm.specials}


def _padded_exactly(batch: dict, items: list[list[int]], pad: int) -> None:
    lengths = torch.tensor([len(ids) for ids in items])
    assert len(set(lengths.tolist())) > 1  # some rows are padded
    mask = batch["attention_mask"].bool()
    assert torch.equal(mask.sum(1), lengths) and (batch["input_ids"][~mask] == pad).all()
    assert all(batch["input_ids"][i, : len(ids)].tolist() == ids for i, ids in enumerate(items))


def test_classification_keeps_the_tokenizers_one_cls_and_sep_and_pads_with_its_pad(folders, tmp_path):
    items, batch = _classified(folders, tmp_path, "bert", seq_len=7)
    specials = batch["specials"]
    assert specials.pad != 0 and max(len(ids) for ids in items) == 7  # long texts are cut, keeping [SEP]
    for ids in items:
        assert ids[0] == specials.cls and ids[-1] == specials.sep
        assert ids.count(specials.cls) == 1 and ids.count(specials.sep) == 1
    _padded_exactly(batch, items, specials.pad)


def test_classification_without_a_pad_token_pads_with_eos_and_masks_by_length(folders, tmp_path):
    items, batch = _classified(folders, tmp_path, "gpt2", seq_len=32)
    eos = batch["specials"].eos
    assert batch["specials"].pad == eos and not any(eos in ids for ids in items)
    _padded_exactly(batch, items, eos)


def test_mlm_masks_only_ordinary_tokens_with_the_tokenizers_mask_id(folders, tmp_path):
    (tmp_path / "lines.txt").write_text("\n".join(LINES))
    dm = _data_module(MLMDataModule, folders["bert"], tmp_path / "lines.txt", seq_len=32, mask_prob=0.5)
    specials, items = dm.specials, dm.datasets["train"].items[:16]
    assert all(
        ids[0] == specials.cls and ids[1:].count(specials.cls) == 0 and ids.count(specials.sep) == 1 for ids in items
    )
    original = dm.pad(items)["input_ids"]
    special = torch.isin(original, torch.tensor(sorted(specials.ids)))
    swapped = masked = 0
    for seed in range(20):  # validation's collate, and training's draw
        batch = dm.collate(items) if seed % 2 else dm.draw(dm.pad(items), torch.Generator().manual_seed(seed))
        chosen = batch["labels"] != IGNORE
        assert not (chosen & special).any() and torch.equal(batch["labels"][chosen], original[chosen])
        assert torch.equal(batch["input_ids"][~chosen], original[~chosen])
        new = batch["input_ids"][chosen]
        masked += int((new == specials.mask).sum())
        others = new[(new != specials.mask) & (new != original[chosen])]
        assert not torch.isin(others, torch.tensor(sorted(specials.ids))).any()
        swapped += len(others)
    assert masked > 100 and swapped > 10


@pytest.mark.parametrize("name, start", [("t5", 0), ("gpt2", "eos"), ("bart_start", 1)])
def test_translation_ends_each_side_with_one_eos_and_starts_the_decoder_with_decoder_start(
    folders, tmp_path, name, start
):
    (tmp_path / "pairs.jsonl").write_text(
        "\n".join(json.dumps({"source": line, "target": " ".join(line.split()[::-1])}) for line in LINES)
    )
    dm = _data_module(TranslationDataModule, folders[name], tmp_path / "pairs.jsonl", seq_len=32)
    specials = dm.specials
    assert specials.decoder_start == (specials.eos if start == "eos" else start) and specials.pad is not None
    assert dm.model_sizes()["decoder_start_token_id"] == specials.decoder_start
    items = dm.datasets["train"].items[:16]
    batch = dm.collate(items)
    assert (batch["decoder_input_ids"][:, 0] == specials.decoder_start).all()
    for i, (source, target, _) in enumerate(items):
        for ids in (source, target):
            assert ids[-1] == specials.eos and ids.count(specials.eos) == 1
        assert batch["labels"][i, : len(target)].tolist() == target
        assert (batch["labels"][i, len(target) :] == IGNORE).all()
        assert batch["decoder_input_ids"][i, 1 : len(target)].tolist() == target[:-1]
    _padded_exactly(batch, [source for source, _, _ in items], specials.pad)
