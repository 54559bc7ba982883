"""Tokenizers from HF ``tokenizers``: trained on the training split when none is given, or loaded
from a ``tokenizer.json``. Every kind uses the same special tokens at the same ids, so tasks can
rely on them: 0 pad, 1 unk, 2 bos / [CLS], 3 eos / [SEP], 4 mask.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tasks.errors import DataError

SPECIALS = ["<pad>", "<unk>", "<s>", "</s>", "<mask>"]
PAD, UNK, BOS, EOS, MASK = range(len(SPECIALS))
KINDS = ("bpe", "wordpiece", "unigram")


def train_tokenizer(texts: Iterable[str], kind: str, vocab_size: int) -> Tokenizer:
    """Train a tokenizer of ``kind``: byte-level BPE (GPT), WordPiece (BERT) or Unigram (T5)."""
    if kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=SPECIALS[UNK]))
        tok.normalizer = normalizers.BertNormalizer(lowercase=False)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False)
    elif kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, unk_token=SPECIALS[UNK],
                                          show_progress=False)
    else:
        raise DataError(f"data.tokenizer_kind={kind}: not a tokenizer kind; choose one of {', '.join(KINDS)}")
    tok.train_from_iterator(_batches(texts), trainer=trainer)
    for i, token in enumerate(SPECIALS):
        assert tok.token_to_id(token) == i, f"special token {token} must have id {i}"
    return tok


def with_cls_sep(tok: Tokenizer) -> Tokenizer:
    """BERT-style post-processing: <s> text </s> (and <s> a </s> b </s> for pairs)."""
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
        special_tokens=[("<s>", BOS), ("</s>", EOS)])
    return tok


def load_or_train(path: str | Path | None, texts: Iterable[str], kind: str, vocab_size: int) -> Tokenizer:
    """The tokenizer.json at ``path`` (data.tokenizer_path), or one trained on ``texts`` when it is None."""
    if path is None:
        return train_tokenizer(texts, kind, vocab_size)
    tok = read_tokenizer(path)
    wrong = [f"{t}={tok.token_to_id(t)}" for i, t in enumerate(SPECIALS) if tok.token_to_id(t) != i]
    if wrong:
        raise DataError(f"data.tokenizer_path={path}: zoo's tasks need the special tokens {SPECIALS} at ids 0..4; "
                        f"found {', '.join(wrong)}; use a tokenizer.json that zoo-train wrote, or "
                        f"data.tokenizer_path=null to train one")
    return tok


def read_tokenizer(path: str | Path, field: str = "data.tokenizer_path") -> Tokenizer:
    """A HF ``tokenizers`` JSON file; a DataError naming ``field`` (the setting that gave ``path``)
    when it is not one."""
    fix = "point it at a tokenizer.json (zoo-train and zoo-export write one)"
    if field == "data.tokenizer_path":
        fix += " or set data.tokenizer_path=null to train one"
    if not Path(path).is_file():
        what = "a folder" if Path(path).is_dir() else "no such file"
        raise DataError(f"{field}={path}: {what}; {fix}")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises a bare Exception for any file it cannot parse
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise DataError(f"{field}={path}: not a tokenizer file ({reason}); {fix}") from error


def _batches(texts: Iterable[str], size: int = 1000) -> Iterator[list[str]]:
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
