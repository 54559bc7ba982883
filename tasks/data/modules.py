"""LightningDataModules for the four tasks, each a ``TextDataModule`` (text_module.py: loading,
splitting, the tokenizer, the loaders) that says how its records become examples
(``build_dataset``), how examples become a batch (``collate``) and what the task must know
(``task_info``, e.g. the label names).

Batches are dicts of tensors. Language modelling packs documents into full blocks; the others pad
each batch only to its longest sequence and group sequences of similar length (bucketing).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any, ClassVar

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import Tensor

from tasks.data.columns import ColumnDataset
from tasks.data.loading import ListDataset, ZooDataset
from tasks.data.prepared import encode_fast, joined
from tasks.data.settings import LMData, MLMData, TranslationData
from tasks.data.text_module import PreparedDataModule, TextDataModule
from tasks.data.token_files import SplitTokens, TokenBlocks, TokenDocuments
from tasks.data.tokenizers import Specials, added_around, with_cls_sep
from tasks.errors import DataError

__all__ = [
    "IGNORE",
    "ClassificationDataModule",
    "LMDataModule",
    "MLMDataModule",
    "TextDataModule",
    "TranslationDataModule",
    "encoder_tokenizer",
    "length_mask",
    "pad_batch",
]

IGNORE = -100  # label of positions that carry no loss
MIN_TOKENS = 3  # a masked LM's example has more tokens than [CLS] x [SEP]


def pad_batch(seqs: Sequence[Sequence[int]], value: int) -> Tensor:
    """Right-pad to the longest sequence: (B, T_max)."""
    out = torch.full((len(seqs), max(len(s) for s in seqs)), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


def length_mask(seqs: Sequence[Sequence[int]]) -> Tensor:
    """1 on the tokens of each sequence, 0 on the padding ``pad_batch`` adds: (B, T_max). Taken from
    the lengths, not from ``ids != pad``: a tokenizer without a pad token pads with a real token."""
    lengths = [len(s) for s in seqs]  # Python ints: no tensor read to find the longest
    return (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()


def pads(seqs: Sequence[Sequence[int]]) -> bool:
    """Whether ``pad_batch`` pads any of ``seqs`` (they differ in length): a batch's ``padded``, decided
    here on the host, so that the model is given no mask to apply when nothing is padding and never
    reads a device tensor to find that out (``tasks.base.padding_mask``)."""
    return len({len(s) for s in seqs}) > 1


def encoder_tokenizer(tokenizer: Tokenizer, specials: Specials, seq_len: int) -> Tokenizer:
    """[CLS] text [SEP], cut to ``seq_len``. A tokenizer whose post-processor already puts tokens
    around a text (a BERT's, a RoBERTa's) keeps it; zoo's get BERT's post-processing."""
    if added_around(tokenizer) == ([], []) and specials.cls is not None and specials.sep is not None:
        tokenizer = with_cls_sep(tokenizer, specials.cls, specials.sep)
    tokenizer.enable_truncation(seq_len)
    return tokenizer


# ---- language modelling (decoder) ---------------------------------------------------------------
class LMDataModule(PreparedDataModule):
    """Causal LM: documents joined with eos and cut into blocks of seq_len + 1 tokens. Blocks are
    full, so nothing is padded: a tokenizer without a pad token (GPT-2, Llama) gets eos as its pad
    id, which only tells the model a pad id (see ``use_tokenizer``).

    ``packing`` says what a block's documents may see of each other:

    - ``concat``: nothing separates them; a token attends to the end of the previous document.
    - ``documents``: the same blocks, and each batch also carries ``document_ids`` (B, T), the
      document of each input position counted from 0 within its row (an eos belongs to the document
      it ends), for a model with ``mask=document``; where documents end comes from the prepared split's
      index (an eos id that a text itself writes stays inside its document). The eos is still predicted
      from its document's last token; the label of an input eos (the next document's first token) is
      IGNORE, as nothing predicts a document's first token when it runs alone. A document cut by a
      block boundary continues in the next block as a document of its own, its positions starting at 0.
    """

    tokenizer_kind = "bpe"
    needs = ("eos",)
    packings: ClassVar[tuple[str, ...]] = ("concat", "documents")

    Settings = LMData

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        packing = typing.cast(LMData, self.settings).packing
        if packing not in self.packings:
            raise DataError(f"data.packing={packing!r} is not one of {list(self.packings)}")
        self.packing = packing

    def encode_documents(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The texts' ids, each ending in one eos (``encode_with_eos``), one after the other, and each
        one's length; encoded in the tokenizer's thread pool."""
        drop = self.added[1][-1:] == [self.specials.eos]
        rows = [e.ids[:-1] if drop else e.ids for e in encode_fast(self.tokenizer, texts)]
        return joined(rows, self.specials.eos)

    def prepared_dataset(self, split: SplitTokens, name: str) -> TokenBlocks:
        """Blocks of seq_len + 1 ids of the split's map."""
        blocks = TokenBlocks(split, self.seq_len + 1, documents=self.packing == "documents")
        if len(blocks) == 0:
            raise self.no_block(name, split.tokens)
        return blocks

    def build_dataset(self, records: Iterable[dict[str, Any]], split: str) -> ZooDataset:
        """The blocks of ``records`` built in memory, as ``prepared_dataset`` reads them from the cache."""
        ids: list[int] = []
        last: list[int] = []
        for record in records:
            own = self.encode_with_eos(record["text"])
            ids += own
            last += [0] * (len(own) - 1) + [1]
        block = self.seq_len + 1
        n = len(ids) // block
        if n == 0:
            raise self.no_block(split, len(ids))
        blocks = torch.tensor(ids[: n * block]).view(n, block)
        if self.packing == "documents":
            blocks = torch.stack([blocks, torch.tensor(last[: n * block]).view(n, block)], dim=1)  # (n, 2, block)
        return ListDataset(blocks)

    def no_block(self, split: str, tokens: int) -> DataError:
        return DataError(
            f"data.seq_len={self.seq_len}: the {split} split has {tokens} tokens, fewer than one block of "
            f"{self.seq_len + 1}; lower data.seq_len, add data, or raise data.val_fraction / data.test_fraction"
        )

    def collate(self, batch: list[Tensor]) -> dict[str, Tensor]:
        blocks = torch.stack(batch)  # (B, T+1), or (B, 2, T+1) with each document's last id marked
        if self.packing == "concat":
            return {"input_ids": blocks[:, :-1], "labels": blocks[:, 1:]}
        inputs, labels = blocks[:, 0, :-1], blocks[:, 0, 1:]
        ends = blocks[:, 1, :-1].bool()  # (B, T): the last position of a document, from the split's index
        document_ids = ends.long().cumsum(dim=1) - ends.long()  # documents ended before each position
        return {"input_ids": inputs, "labels": labels.masked_fill(ends, IGNORE), "document_ids": document_ids}


# ---- sequence classification (encoder) ---------------------------------------------------------
class ClassificationDataModule(TextDataModule):
    """Text -> label. Labels are the sorted distinct values of the records' ``label`` field."""

    tokenizer_kind = "wordpiece"
    fields = ("text", "label")

    def prepare_tokenizer(self, tokenizer: Tokenizer) -> Tokenizer:
        return encoder_tokenizer(tokenizer, self.specials, self.seq_len)

    def build_dataset(self, records: Iterable[dict[str, Any]], split: str) -> ZooDataset:
        """(ids, label) examples, the ids held compactly (tasks/data/columns.py); records of a label the
        training split lacks are left out. One pass over ``records`` (two for the training split)."""
        if split == "train":
            self.label_names = sorted({str(r["label"]) for r in records})
        index = {name: i for i, name in enumerate(self.label_names)}
        labels: list[int] = []

        def texts() -> Iterator[str]:
            for record in records:
                if (label := index.get(str(record["label"]))) is not None:
                    labels.append(label)
                    yield record["text"]

        ids = self.encoded(texts())
        return ColumnDataset((ids, labels), ids.lengths)

    def collate(self, batch: list[tuple[list[int], int]]) -> dict[str, Tensor]:
        seqs = [ids for ids, _ in batch]
        return {
            "input_ids": pad_batch(seqs, self.specials.pad),
            "attention_mask": length_mask(seqs),
            "padded": pads(seqs),
            "labels": torch.tensor([label for _, label in batch]),
        }

    def task_info(self) -> dict[str, Any]:
        return {"label_names": list(self.label_names)}


# ---- masked language modelling (encoder) -------------------------------------------------------
class MLMDataModule(PreparedDataModule):
    """BERT pretraining: 15% of tokens are chosen; 80% of those become <mask>, 10% a random token,
    10% stay; the loss is on the chosen ones only (Devlin et al. 2019). Special tokens are never
    chosen, and never put in a chosen token's place."""

    tokenizer_kind = "wordpiece"
    needs = ("mask",)

    Settings = MLMData

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.mask_prob = typing.cast(MLMData, self.settings).mask_prob

    def prepare_tokenizer(self, tokenizer: Tokenizer) -> Tokenizer:
        return encoder_tokenizer(tokenizer, self.specials, self.seq_len)

    def build_dataset(self, records: Iterable[dict[str, Any]], split: str) -> ZooDataset:
        """The documents of ``records`` in memory (``setup`` reads them from the prepared map)."""
        items = [ids for r in records if len(ids := self.encode(r["text"])) > MIN_TOKENS]
        return ListDataset(items, [len(ids) for ids in items])

    def encode_documents(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The texts' ids ([CLS] text [SEP] cut to seq_len) one after the other, and each one's length."""
        return joined([e.ids for e in encode_fast(self.tokenizer, texts)])

    def prepared_dataset(self, split: SplitTokens, name: str) -> TokenDocuments:
        return TokenDocuments(split, longer_than=MIN_TOKENS)

    def collate(self, batch: list[list[int]], *, fixed: bool = False) -> dict[str, Tensor]:
        """``fixed``: the same masks for the same batch every time (comparable validation numbers);
        else masks from the global RNG."""
        padded = self.pad(batch)
        generator = torch.Generator().manual_seed(int(padded["input_ids"].sum())) if fixed else None
        return {**self.mask(padded["input_ids"], padded["attention_mask"], generator), "padded": padded["padded"]}

    def mask(self, input_ids: Tensor, attention_mask: Tensor, generator: torch.Generator | None) -> dict[str, Tensor]:
        labels = input_ids.clone()
        special = torch.tensor(sorted(self.specials.ids))
        ordinary = torch.arange(self.tokenizer.get_vocab_size())
        ordinary = ordinary[~torch.isin(ordinary, special)]  # the tokens a chosen one may become
        eligible = attention_mask.bool() & ~torch.isin(input_ids, special)
        chosen = (torch.rand(input_ids.shape, generator=generator) < self.mask_prob) & eligible
        if not chosen.any() and eligible.any():  # a short batch may draw none: choose one of its tokens
            place = eligible.flatten().nonzero().squeeze(1)
            chosen.view(-1)[place[torch.randint(len(place), (), generator=generator)]] = True
        labels[~chosen] = IGNORE
        action = torch.rand(input_ids.shape, generator=generator)
        masked = input_ids.masked_fill(chosen & (action < 0.8), self.specials.mask)
        random_tokens = ordinary[torch.randint(len(ordinary), input_ids.shape, generator=generator)]
        swap = chosen & (action >= 0.8) & (action < 0.9)
        masked = torch.where(swap, random_tokens, masked)
        # where the chosen positions are in the flattened (B*T) batch: found here on the CPU, the step
        # selects them with index_select, not a boolean index (the host would wait on the device for the count)
        chosen_at = chosen.flatten().nonzero().squeeze(1)  # (N,)
        # and row by row, for a pipeline's microbatches (trainer=pp): each row's positions, then -1, (B, K)
        counts = chosen.sum(1)
        first = torch.argsort((~chosen).to(torch.int8), dim=1, stable=True)[:, : max(int(counts.max()), 1)]
        rows = first.masked_fill(torch.arange(first.shape[1]) >= counts.unsqueeze(1), -1)
        return {
            "input_ids": masked,
            "attention_mask": attention_mask,
            "labels": labels,
            "chosen": chosen_at,
            "chosen_rows": rows,
        }

    def pad(self, batch: list[list[int]]) -> dict[str, Tensor]:
        ids, mask = pad_batch(batch, self.specials.pad), length_mask(batch)
        return {"input_ids": ids, "attention_mask": mask, "padded": pads(batch)}

    def draw(self, batch: dict[str, Any], generator: torch.Generator) -> dict[str, Any]:
        return {**self.mask(batch["input_ids"], batch["attention_mask"], generator), "padded": batch["padded"]}

    def collate_for(self, split: str) -> Callable[[list[Any]], dict[str, Any]]:
        """Training batches are only padded here; ``draw`` masks them (seeded by their place in the run)."""
        return self.pad if split == "train" else partial(self.collate, fixed=True)


# ---- translation (encoder-decoder) -------------------------------------------------------------
class TranslationDataModule(TextDataModule):
    """Source -> target pairs with one tokenizer for both sides. The decoder input is the target
    shifted right behind the decoder start token (zoo's and T5's: pad); source and labels end with
    one eos. A tokenizer without a pad token pads with its eos (see ``use_tokenizer``)."""

    tokenizer_kind = "unigram"
    Settings = TranslationData
    fields = ("source", "target")
    needs = ("eos",)

    def texts(self, record: dict[str, Any]) -> list[str]:
        return [record["source"], record["target"]]

    def build_dataset(self, records: Iterable[dict[str, Any]], split: str) -> ZooDataset:
        """(source ids, target ids, target text) examples, the ids held compactly (tasks/data/columns.py);
        the target texts are kept as the references a score reads. Two passes over ``records``."""
        sources = self.encoded((r["source"] for r in records), ended=True)
        references = [r["target"] for r in records]
        targets = self.encoded(references, ended=True)
        lengths = [s + t for s, t in zip(sources.lengths, targets.lengths, strict=True)]
        return ColumnDataset((sources, targets, references), lengths)

    def collate(self, batch: list[tuple[list[int], list[int], str]]) -> dict[str, Any]:
        sources, targets = [s for s, _, _ in batch], [t for _, t, _ in batch]
        start, pad = self.specials.decoder_start, self.specials.pad
        return {
            "input_ids": pad_batch(sources, pad),
            "attention_mask": length_mask(sources),
            "padded": pads(sources),
            "decoder_input_ids": pad_batch([[start] + t[:-1] for t in targets], pad),
            "labels": pad_batch(targets, IGNORE),
            "references": [ref for _, _, ref in batch],
        }

    def model_sizes(self) -> dict[str, int | None]:
        return {**super().model_sizes(), "decoder_start_token_id": self.specials.decoder_start}
