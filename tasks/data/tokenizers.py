"""Tokenizers from HF ``tokenizers``: trained on the training split when none is given, loaded
from a ``tokenizer.json``, or read from a Hugging Face model folder (``read_hf_tokenizer``).

Zoo's own tokenizers put the special tokens at fixed ids: 0 pad, 1 unk, 2 bos / [CLS], 3 eos /
[SEP], 4 mask. A Hugging Face tokenizer keeps them where its model was trained with them (BERT:
[PAD]=0, [CLS]=101; GPT-2: only <|endoftext|>), so the data modules ask a ``Specials`` where they
are instead of assuming zoo's ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tasks.errors import DataError
from zoo.io import JSON_LIMIT, TEMPLATE_LIMIT, TOKENIZER_LIMIT, parse_json, read_handed

SPECIALS = ["<pad>", "<unk>", "<s>", "</s>", "<mask>"]
PAD, UNK, BOS, EOS, MASK = range(len(SPECIALS))
KINDS = ("bpe", "wordpiece", "unigram")
ROLES = ("pad", "unk", "bos", "eos", "mask", "cls", "sep")  # as transformers names them: pad_token, ...
MODEL_IDS = ("pad", "eos", "bos", "decoder_start")  # a model's config.json ids: pad_token_id, ...


@dataclass(frozen=True)
class Specials:
    """Where a tokenizer's special tokens are: an id each, None where it has no such token.

    ``decoder_start`` is the first decoder input of an encoder-decoder (T5 and zoo: pad). ``others``
    are further ids the tokenizer marks special (T5's sentinels, Llama 3's other eos ids).
    ``origin`` names where the tokenizer came from, for error messages. ``chat_template`` is the
    model's Jinja chat template as text (a GGUF file's, an HF folder's), carried through training
    into the exports; text to render in a sandbox, never code to run.
    """

    pad: int | None = None
    unk: int | None = None
    bos: int | None = None
    eos: int | None = None
    mask: int | None = None
    cls: int | None = None
    sep: int | None = None
    decoder_start: int | None = None
    others: frozenset[int] = frozenset()
    origin: str = "zoo's tokenizer"
    chat_template: str | None = None

    @classmethod
    def zoo(cls) -> Specials:
        """Zoo's own tokenizers: <s> serves as bos and [CLS], </s> as eos and [SEP]."""
        return cls(pad=PAD, unk=UNK, bos=BOS, eos=EOS, mask=MASK, cls=BOS, sep=EOS, decoder_start=PAD)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Specials:
        """The Specials a ``record()`` holds (as a checkpoint stores it)."""
        given = {f.name: record[f.name] for f in fields(cls) if f.name in record}
        return cls(**{**given, "others": frozenset(given.get("others", ()))})

    def record(self) -> dict[str, Any]:
        """Plain data, as a checkpoint that loads with ``weights_only`` can hold."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "others": sorted(self.others)}

    @property
    def ids(self) -> frozenset[int]:
        """Every special id: masked language modelling never masks one, nor puts one in a token's place."""
        named = (getattr(self, role) for role in (*ROLES, "decoder_start"))
        return self.others | {i for i in named if i is not None}


def train_tokenizer(texts: Iterable[str], kind: str, vocab_size: int) -> Tokenizer:
    """Train a tokenizer of ``kind``: byte-level BPE (GPT), WordPiece (BERT) or Unigram (T5)."""
    if kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=SPECIALS,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
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
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=SPECIALS, unk_token=SPECIALS[UNK], show_progress=False
        )
    else:
        raise DataError(f"data.tokenizer_kind={kind}: not a tokenizer kind; choose one of {', '.join(KINDS)}")
    tok.train_from_iterator(_batches(texts), trainer=trainer)
    for i, token in enumerate(SPECIALS):
        assert tok.token_to_id(token) == i, f"special token {token} must have id {i}"
    return tok


def with_cls_sep(tok: Tokenizer, cls: int = BOS, sep: int = EOS) -> Tokenizer:
    """BERT-style post-processing: [CLS] text [SEP] (and [CLS] a [SEP] b [SEP] for pairs), where
    zoo's tokenizers use <s> and </s>."""
    c, s = tok.id_to_token(cls), tok.id_to_token(sep)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{c} $A {s}", pair=f"{c} $A {s} $B:1 {s}:1", special_tokens=[(c, cls), (s, sep)]
    )
    return tok


def added_around(tok: Tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer's post-processor puts before and after a text (a BERT's: [CLS] and
    [SEP]; a T5's: nothing and </s>; a GPT-2's: nothing), found by encoding a probe."""
    encoding = tok.encode("a")
    flags = encoding.special_tokens_mask
    before = next((i for i, flag in enumerate(flags) if not flag), len(flags))
    after = next((i for i, flag in enumerate(reversed(flags)) if not flag), 0)
    return encoding.ids[:before], encoding.ids[len(flags) - after :]


def misplaced_specials(tok: Tokenizer) -> list[str]:
    """``token=id`` for each of zoo's special tokens that ``tok`` does not have at zoo's id."""
    return [f"{t}={tok.token_to_id(t)}" for i, t in enumerate(SPECIALS) if tok.token_to_id(t) != i]


def load_or_train(path: str | Path | None, texts: Iterable[str], kind: str, vocab_size: int) -> Tokenizer:
    """The tokenizer.json at ``path`` (data.tokenizer_path), or one trained on ``texts`` when it is None."""
    if path is None:
        return train_tokenizer(texts, kind, vocab_size)
    tok = read_tokenizer(path)
    if wrong := misplaced_specials(tok):
        raise DataError(
            f"data.tokenizer_path={path}: zoo's tasks need the special tokens {SPECIALS} at ids 0..4; "
            f"found {', '.join(wrong)}; use a tokenizer.json that zoo-train wrote, or "
            f"data.tokenizer_path=null to train one"
        )
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
    return _parse(Path(path), f"{field}={path}", fix)


def read_folder_tokenizer(folder: str | Path, field: str, fix: str) -> Tokenizer | None:
    """The ``tokenizer.json`` of a handed model folder, read as the folder's own file
    (``zoo.io.read_handed``: no link out of it, a regular file, at most ``TOKENIZER_LIMIT`` bytes);
    None when the folder has none. A DataError naming ``field`` and ``fix`` when it is no tokenizer."""
    path = Path(folder) / "tokenizer.json"
    data = read_handed(folder, "tokenizer.json", limit=TOKENIZER_LIMIT, error=DataError)
    if data is None:
        return None
    return _parse(path, f"{field}={path}", fix, data)


HF_FIX = (
    "a Hugging Face model folder needs its fast tokenizer's tokenizer.json, which "
    "AutoTokenizer.from_pretrained(folder).save_pretrained(folder) writes"
)


def read_hf_tokenizer(folder: str | Path, field: str = "init_from") -> tuple[Tokenizer, Specials]:
    """The tokenizer of a Hugging Face model folder as transformers' ``save_pretrained`` writes it,
    and where its special tokens are; errors name ``field`` (the setting that gave ``folder``).

    ``tokenizer.json`` is the tokenizer, kept with its own post-processor (a BERT's adds [CLS] and
    [SEP], a T5's appends </s>) but without saved padding or truncation: the data modules cut and
    pad. ``tokenizer_config.json`` and ``special_tokens_map.json`` (which wins, as in transformers)
    name the special tokens; the ids in the model's ``config.json`` win over both, since the
    weights were trained with them.
    """
    folder = Path(folder)
    where = f"{field}={folder}"
    if not folder.is_dir():
        raise DataError(
            f"{where}: no such folder; point it at a Hugging Face model folder (save_pretrained writes one)"
        )
    tok = read_folder_tokenizer(folder, field, HF_FIX)  # every file: the folder's own (zoo.io.read_handed)
    if tok is None:
        raise DataError(f"{where}: no tokenizer.json in the folder; {HF_FIX}")
    tok.no_padding()
    tok.no_truncation()
    ids, others = _model_ids(_read_json(folder / "config.json", where), where)
    names = {
        **_token_names(folder / "tokenizer_config.json", where),
        **_token_names(folder / "special_tokens_map.json", where),
    }
    for role, token in names.items():
        if role in ids:  # config.json's id wins
            continue
        ids[role] = token_id = tok.token_to_id(token)
        if token_id is None:
            raise DataError(
                f"{where}: the tokenizer files name {role}_token={token!r}, which tokenizer.json does "
                f"not have; correct or remove that entry"
            )
    ids.setdefault("decoder_start", ids.get("pad"))  # T5's convention, which zoo's encoder-decoders follow
    others |= {i for i, token in tok.get_added_tokens_decoder().items() if token.special}
    return tok, Specials(**ids, others=frozenset(others), origin=where, chat_template=_chat_template(folder, where))


def _chat_template(folder: Path, where: str) -> str | None:
    """The folder's chat template: chat_template.jinja (transformers 5 writes it there), else the
    "chat_template" of tokenizer_config.json (as a string, or the entry named "default" of a list)."""
    jinja = read_handed(folder, "chat_template.jinja", limit=TEMPLATE_LIMIT, error=DataError)
    if jinja is not None:
        try:
            return jinja.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataError(
                f"{where}: chat_template.jinja is not readable text ({error}); repair or remove it"
            ) from error
    entry = _read_json(folder / "tokenizer_config.json", where).get("chat_template")
    if isinstance(entry, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        entry = next((t.get("template") for t in entry if isinstance(t, dict) and t.get("name") == "default"), None)
    if entry is not None and not isinstance(entry, str):
        raise DataError(f"{where}: tokenizer_config.json has a chat_template that is not text; repair or remove it")
    return entry


def _model_ids(config: dict[str, Any], where: str) -> tuple[dict[str, int | None], set[int]]:
    """The special ids a model's config.json sets (``pad_token_id``, ...), and every id of a list
    (Llama 3 ends a generation at any of several eos ids: the first counts as the eos)."""
    ids: dict[str, int | None] = {}
    others: set[int] = set()
    for role in MODEL_IDS:
        key = f"{role}_token_id"
        values = config.get(key)
        values = values if isinstance(values, list) else [] if values is None else [values]
        for value in values:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise DataError(f"{where}: config.json has {key}={config[key]!r}, not a token id; correct or remove it")
            others.add(value)
        if values:
            ids[role] = values[0]
    return ids, others


def _token_names(path: Path, where: str) -> dict[str, str]:
    """The special tokens a tokenizer_config.json or special_tokens_map.json names, by role; an
    entry is a string or, as transformers serialises an AddedToken, a dict with its "content"."""
    names: dict[str, str] = {}
    for role, entry in ((role, _read_json(path, where).get(f"{role}_token")) for role in ROLES):
        token = entry.get("content") if isinstance(entry, dict) else entry
        if isinstance(token, str):
            names[role] = token
    return names


def _read_json(path: Path, where: str) -> dict[str, Any]:
    """The JSON object in ``path`` (a file of a handed folder: ``zoo.io.read_handed``); {} when there
    is no such file."""
    raw = read_handed(path.parent, path.name, limit=JSON_LIMIT, error=DataError)
    if raw is None:
        return {}
    try:
        data = parse_json(raw)
    except ValueError as error:
        raise DataError(f"{where}: {path.name} is not readable JSON ({error}); repair or remove it") from error
    if not isinstance(data, dict):
        raise DataError(f"{where}: {path.name} holds a {type(data).__name__}, not a JSON object; repair or remove it")
    return data


def _parse(path: Path, where: str, fix: str, data: bytes | None = None) -> Tokenizer:
    """The tokenizer in ``path`` (of the bytes already read from it: ``data``); a DataError when it is none."""
    try:
        return Tokenizer.from_file(str(path)) if data is None else Tokenizer.from_str(data.decode("utf-8"))
    except Exception as error:  # tokenizers raises a bare Exception for any file it cannot parse
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise DataError(f"{where}: not a tokenizer file ({reason}); {fix}") from error


def _batches(texts: Iterable[str], size: int = 1000) -> Iterator[list[str]]:
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
