"""GGUF vocabularies <-> HF ``tokenizers``.

A GGUF file keeps its tokenizer as arrays under ``tokenizer.ggml.*``: ``tokens`` (by id),
``token_type`` (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte), and by
``tokenizer.ggml.model``:

- ``gpt2``: byte-level BPE, its ``merges`` ("a b", by rank) and a pre-tokenizer named by
  ``tokenizer.ggml.pre`` (the split regex of the model family: :data:`PRE`).
- ``llama``: SentencePiece-style BPE, ``scores`` per token: llama.cpp merges the adjacent pair whose
  concatenation is a token of the highest score, falling back to ``<0xXX>`` byte tokens. As HF
  ``tokenizers`` BPE that is every (a, b) with a, b and a+b in the vocabulary, ranked by a+b's score.

Control tokens become special added tokens, user-defined ones added tokens; ``add_bos_token`` /
``add_eos_token`` become a post-processor. zoo writes byte-level BPE tokenizers (``gpt2``) and the
SentencePiece ones it read (``llama``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from zoo.gguf.reader import GGUFFile
from zoo.io import CheckpointError
from zoo.registry import ConfigError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = range(1, 7)
ROLES = {
    "bos": "bos_token_id",
    "eos": "eos_token_id",
    "unk": "unknown_token_id",
    "pad": "padding_token_id",
    "sep": "seperator_token_id",
    "cls": "cls_token_id",
    "mask": "mask_token_id",
    "eot": "eot_token_id",
}
"""Special-token roles and their ``tokenizer.ggml.<key>`` (``seperator`` is llama.cpp's spelling)."""
QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPACE = "\u2581"  # SentencePiece's visible space
MAX_TOKEN_CHARS = 1024
"""The longest token a vocabulary may hold (real ones stay under a few hundred characters): pairing a
SentencePiece token's splits takes time quadratic in its length."""


def _byte_level(*, regex: bool = True) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=regex)


def _split(pattern: str) -> list[pre_tokenizers.PreTokenizer]:
    return [pre_tokenizers.Split(Regex(pattern), behavior="isolated"), _byte_level(regex=False)]


PRE = {
    "gpt-2": lambda: [_byte_level()],
    "smollm": lambda: [pre_tokenizers.Digits(individual_digits=True), _byte_level()],
    "starcoder": lambda: [pre_tokenizers.Digits(individual_digits=True), _byte_level()],
    "qwen2": lambda: _split(QWEN2),
    "llama-bpe": lambda: _split(LLAMA3),
}
"""``tokenizer.ggml.pre`` -> the pre-tokenizer steps of llama.cpp's regexes for it."""
IGNORE_MERGES = ("llama-bpe",)  # a pre-token already in the vocabulary is one token (Llama 3)


@dataclass(frozen=True)
class Vocab:
    """A GGUF vocabulary: what ``tokenizer.ggml.*`` holds (``merges`` for gpt2, ``scores`` for llama)."""

    model: str
    tokens: Sequence[str]
    types: Sequence[int]
    merges: Sequence[str] = ()
    scores: Sequence[float] = ()
    pre: str | None = None
    add_space_prefix: bool | None = None  # llama: a space before the text (and after each special token)


# ---- reading --------------------------------------------------------------------------------------------
def read_specials(f: GGUFFile) -> dict[str, int]:
    """The special-token ids the file names (role -> id), ids outside its vocabulary left out."""
    n = len(f.get("tokenizer.ggml.tokens", "str[]", []))
    ids = {role: f.get(f"tokenizer.ggml.{key}", "int", None) for role, key in ROLES.items()}
    return {role: int(i) for role, i in ids.items() if i is not None and (n == 0 or 0 <= i < n)}


def read_vocab(f: GGUFFile) -> Vocab | None:
    """The file's vocabulary (None when it has none); a kind zoo cannot read is a CheckpointError."""
    model = f.get("tokenizer.ggml.model", "str", None)
    if model is None or model in ("none", "no_vocab"):
        return None
    if model not in ("gpt2", "llama"):
        raise CheckpointError(
            f"{f.path}: tokenizer.ggml.model={model!r} is a tokenizer zoo cannot read (it reads "
            "'gpt2' byte-level BPE and 'llama' SentencePiece vocabularies); read the weights "
            "alone with zoo.from_gguf, and give the tokenizer another way"
        )
    tokens = f.get("tokenizer.ggml.tokens", "str[]")
    longest = max(range(len(tokens)), key=lambda i: len(tokens[i]), default=None)
    if longest is not None and len(tokens[longest]) > MAX_TOKEN_CHARS:
        raise CheckpointError(
            f"{f.path}: tokenizer.ggml.tokens[{longest}] is {len(tokens[longest])} characters long, more than "
            f"the {MAX_TOKEN_CHARS} any vocabulary needs; the file is corrupt (read the weights alone with "
            "zoo.from_gguf)"
        )
    types = [int(t) for t in f.get("tokenizer.ggml.token_type", "int[]", [NORMAL] * len(tokens))]
    if len(types) != len(tokens):
        raise CheckpointError(
            f"{f.path}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens; "
            "the file is corrupt"
        )
    if model == "llama":
        scores = [float(s) for s in f.get("tokenizer.ggml.scores", "float[]", [0.0] * len(tokens))]
        if len(scores) != len(tokens):
            raise CheckpointError(
                f"{f.path}: tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} "
                "tokens; the file is corrupt"
            )
        prefix = f.get("tokenizer.ggml.add_space_prefix", "bool", True)
        return Vocab("llama", tokens, types, scores=scores, add_space_prefix=prefix)
    pre = f.get("tokenizer.ggml.pre", "str", "gpt-2")
    if pre not in PRE:
        raise CheckpointError(
            f"{f.path}: tokenizer.ggml.pre={pre!r} names a pre-tokenizer zoo does not know "
            f"(known: {', '.join(PRE)}); read the weights alone with zoo.from_gguf"
        )
    return Vocab("gpt2", tokens, types, merges=f.get("tokenizer.ggml.merges", "str[]"), pre=pre)


def build_tokenizer(
    vocab: Vocab, specials: dict[str, int], *, add_bos: bool, add_eos: bool, where: str = "the vocabulary"
) -> Tokenizer:
    """The ``tokenizers.Tokenizer`` that encodes as llama.cpp does with ``vocab``."""
    try:
        tok = _bpe(vocab) if vocab.model == "gpt2" else _sentencepiece(vocab, specials)
    except Exception as error:  # tokenizers raises its own exception types for a vocabulary it rejects
        raise CheckpointError(
            f"{where}: the {vocab.model} vocabulary does not make a tokenizer ({error}); the file is corrupt"
        ) from None
    added = [
        AddedToken(t, special=kind == CONTROL, normalized=False)
        for t, kind in zip(vocab.tokens, vocab.types, strict=True)
        if kind in (CONTROL, USER_DEFINED)
    ]
    tok.add_special_tokens([t for t in added if t.special])
    tok.add_tokens([t for t in added if not t.special])
    ends = {role: specials.get(role) for role, on in (("bos", add_bos), ("eos", add_eos)) if on}
    for role, i in ends.items():
        if i is None:
            raise CheckpointError(f"{where}: add_{role}_token is set but the file names no {role} token id")
    if ends:
        names = {role: vocab.tokens[i] for role, i in ends.items()}
        single = " ".join([*([names["bos"]] if add_bos else []), "$A", *([names["eos"]] if add_eos else [])])
        tok.post_processor = processors.TemplateProcessing(
            single=single, special_tokens=[(names[role], i) for role, i in ends.items()]
        )
    return tok


def _ids(vocab: Vocab) -> dict[str, int]:
    """token -> id; a token listed twice keeps its first id (llama.cpp's lookup finds that one)."""
    ids: dict[str, int] = {}
    for i, token in enumerate(vocab.tokens):
        ids.setdefault(token, i)
    return ids


def _bpe(vocab: Vocab) -> Tokenizer:
    ids = _ids(vocab)
    pairs = []
    for i, merge in enumerate(vocab.merges):
        left, space, right = merge.partition(" ")
        if not space:
            raise ValueError(f"tokenizer.ggml.merges[{i}]={merge!r} is not 'a b'")
        pairs.append((left, right))
    tok = Tokenizer(models.BPE(ids, pairs, ignore_merges=vocab.pre in IGNORE_MERGES))
    steps = PRE[vocab.pre or "gpt-2"]()
    tok.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece(vocab: Vocab, specials: dict[str, int]) -> Tokenizer:
    add_space_prefix = vocab.add_space_prefix is not False
    ids = _ids(vocab)
    unk = specials.get("unk")
    tok = Tokenizer(
        models.BPE(
            ids,
            _score_merges(vocab, ids),
            unk_token=vocab.tokens[unk] if unk is not None else None,
            fuse_unk=True,
            byte_fallback=BYTE in vocab.types,
        )
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPACE, split=False, prepend_scheme="always" if add_space_prefix else "never"
    )
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if add_space_prefix else []))
    return tok


def _score_merges(vocab: Vocab, ids: dict[str, int]) -> list[tuple[str, str]]:
    """Every (a, b) whose concatenation is a normal token, the highest-scoring result first."""
    found = []
    for i, (token, kind) in enumerate(zip(vocab.tokens, vocab.types, strict=True)):
        if kind not in (NORMAL, USER_DEFINED) or ids.get(token) != i:
            continue
        for k in range(1, len(token)):
            left, right = token[:k], token[k:]
            if left in ids and right in ids:
                found.append((-vocab.scores[i], i, ids[left], left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


# ---- writing --------------------------------------------------------------------------------------------
def _signature(pre: dict | None) -> list[tuple]:
    """The steps of a serialized pre-tokenizer that decide its splits (flags that only move offsets left out)."""
    if pre is None:
        return []
    if pre["type"] == "Sequence":
        return [step for inner in pre["pretokenizers"] for step in _signature(inner)]
    keep = {
        "ByteLevel": ("add_prefix_space", "use_regex"),
        "Digits": ("individual_digits",),
        "Split": ("pattern", "behavior", "invert"),
    }.get(pre["type"])
    if keep is None:
        return [(pre["type"], json.dumps(pre, sort_keys=True))]
    return [(pre["type"], *(json.dumps(pre.get(k), sort_keys=True) for k in keep))]


def _pre_name(pre: dict | None) -> str | None:
    mine = _signature(pre)
    for name, steps in PRE.items():
        theirs = [step for s in steps() for step in _signature(json.loads(s.__getstate__()))]
        if theirs == mine:
            return name
    return None


def _is_sentencepiece(spec: dict) -> bool:
    """The shape :func:`build_tokenizer` gives a ``llama`` vocabulary: BPE with byte fallback over
    SentencePiece's visible space, no normalizer."""
    pre = spec.get("pre_tokenizer") or {}
    return (
        spec["model"].get("byte_fallback", False)
        and spec.get("normalizer") is None
        and pre.get("type") == "Metaspace"
        and pre.get("replacement") == SPACE
        and not pre.get("split", True)
    )


def tokenizer_vocab(tok: Tokenizer, vocab_size: int) -> Vocab:
    """The GGUF vocabulary of ``tok``: ``gpt2`` for a byte-level BPE, ``llama`` for the SentencePiece
    shape a ``llama`` file is read into (its scores from the merge ranks, which keeps the merge order).
    Padded to ``vocab_size`` entries with unused ``[PAD<id>]`` tokens (llama.cpp needs one token per
    embedding row), as llama.cpp's converter does.

    Raises:
        ConfigError: naming what llama.cpp's tokenizers cannot reproduce (another model, a
            normalizer, a pre-tokenizer it has no regex for, more tokens than embedding rows).
    """
    spec = json.loads(tok.to_str())
    model, pre = spec["model"], _pre_name(spec.get("pre_tokenizer"))
    spm = model["type"] == "BPE" and _is_sentencepiece(spec)
    if model["type"] != "BPE" or (spec.get("normalizer") is not None and not spm) or (pre is None and not spm):
        what = (
            f"a {model['type']} model"
            if model["type"] != "BPE"
            else "a normalizer"
            if spec.get("normalizer")
            else f"the pre-tokenizer {json.dumps(spec.get('pre_tokenizer'))[:120]}"
        )
        raise ConfigError(
            f"tokenizer: llama.cpp cannot reproduce {what}: zoo writes byte-level BPE tokenizers whose "
            f"pre-tokenizer is one of {', '.join(PRE)} (as tokenizer.ggml.pre), and SentencePiece "
            "vocabularies read from GGUF; export with tokenizer=None (the weights alone) or another "
            "tokenizer"
        )
    tokens, types = _table(tok, vocab_size)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    if not spm:
        return Vocab("gpt2", tokens, types, merges=merges, pre=pre)
    scores = [-float(len(merges) + 1)] * vocab_size  # tokens no merge makes: below every merge
    table = tok.get_vocab(with_added_tokens=True)
    for rank, merge in reversed(list(enumerate(merges))):  # a token's first (best) merge sets its score
        scores[table["".join(merge.split(" "))]] = -float(rank + 1)
    for token, i in table.items():
        types[i] = BYTE if types[i] == NORMAL and re.fullmatch(r"<0x[0-9A-F]{2}>", token) else types[i]
    if model.get("unk_token") in table:
        types[table[model["unk_token"]]] = UNKNOWN
    prepend = spec["pre_tokenizer"].get("prepend_scheme", "always") != "never"
    return Vocab("llama", tokens, types, scores=scores, add_space_prefix=prepend)


def _table(tok: Tokenizer, vocab_size: int) -> tuple[list[str], list[int]]:
    """Every token by id and its type (normal, control for special added tokens, user-defined for
    the others, unused for padding)."""
    table = tok.get_vocab(with_added_tokens=True)
    if len(table) > vocab_size or max(table.values(), default=0) >= vocab_size:
        raise ConfigError(
            f"tokenizer: {len(table)} tokens (ids up to {max(table.values())}) for a model of "
            f"vocab_size={vocab_size}; export with the tokenizer the model was trained with"
        )
    tokens, types = [f"[PAD{i}]" for i in range(vocab_size)], [UNUSED] * vocab_size
    for token, i in table.items():
        tokens[i], types[i] = token, NORMAL
    for i, added in tok.get_added_tokens_decoder().items():
        types[i] = CONTROL if added.special else USER_DEFINED
    return tokens, types


def role_ids(specials: dict[str, object] | None, vocab_size: int) -> dict[str, int]:
    """The special-token ids of ``specials`` (a role -> id mapping, e.g. a verb's Specials record)
    that GGUF has a key for; other entries (``origin``, ``others``...) are not GGUF's and are skipped."""
    out: dict[str, int] = {}
    for role, value in (specials or {}).items():
        if role not in ROLES or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
            raise ConfigError(f"specials: {role}={value!r} is not a token id in [0, vocab_size={vocab_size})")
        out[role] = value
    return out


__all__ = ["PRE", "ROLES", "Vocab", "build_tokenizer", "read_specials", "read_vocab", "role_ids", "tokenizer_vocab"]
