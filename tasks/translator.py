"""T5-style translator: teacher forcing with label smoothing; validation decodes with the KV cache
(greedy or beam) and reports BLEU and chrF."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, processors
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.text import BLEUScore

import zoo
from tasks.base import ZooTask, padding_mask
from tasks.data.tokenizers import added_around
from tasks.run.loggers import sample_block
from tasks.text_metrics import ChrF
from zoo.beam_search import check_beams
from zoo.ranges import FloatRange

SETTING_RANGES = {
    "label_smoothing": FloatRange(0.0, 1.0, hint="the probability spread over the other tokens"),
    "length_penalty": FloatRange(-math.inf, hint="scores divided by length**length_penalty"),
}


class TranslatorTask(ZooTask):
    forms = ("encoder_decoder",)

    def __init__(
        self,
        *,
        model: dict[str, Any],
        optimizer: dict[str, Any],
        scheduler: dict[str, Any] | None = None,
        tokenizer_json: str | None = None,
        adapter: dict[str, Any] | None = None,
        label_smoothing: float = 0.1,
        num_beams: int = 1,
        length_penalty: float = 1.0,
        max_new_tokens: int = 64,
        decode_batches: int = 4,
        n_samples: int = 3,
        loss_chunk: int | None = None,
    ) -> None:
        """``decode_batches``: how many validation batches are translated for BLEU/chrF (all test batches are).
        ``loss_chunk``: rows (target tokens) per chunk of the training loss (zoo.chunked_cross_entropy), so
        the whole (B, T, V) logits never exist in training; None or 0: the whole logits at once."""
        super().__init__(
            model=model, optimizer=optimizer, scheduler=scheduler, tokenizer_json=tokenizer_json, adapter=adapter
        )
        self.label_smoothing, self.num_beams, self.length_penalty = label_smoothing, num_beams, length_penalty
        self.max_new_tokens, self.decode_batches, self.n_samples = max_new_tokens, decode_batches, n_samples
        self.loss_chunk = loss_chunk
        self.samples: list[tuple[str, str, str]] = []
        self.add_metrics()

    @classmethod
    def check_settings(cls, settings: dict[str, Any], model: zoo.ModelConfig) -> None:
        """Counts are whole numbers, floats finite and in range, and ``num_beams`` what beam search takes
        (zoo.beam_search.check_beams: at most MAX_BEAMS, and no more than the distinct continuations)."""
        if (settings.get("loss_chunk") or 0) < 0:
            raise zoo.ConfigError(
                f"task.loss_chunk={settings['loss_chunk']} must be >= 1 (rows per chunk of the "
                f"training loss), or null or 0 for the whole logits at once"
            )
        for name, least in (("num_beams", 1), ("max_new_tokens", 0), ("decode_batches", 0), ("n_samples", 0)):
            value = settings.get(name, least)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise zoo.ConfigError(f"task.{name}={value!r} must be a whole number >= {least}")
        try:
            check_beams(settings.get("num_beams", 1), model.vocab_size, settings.get("max_new_tokens", 1))
        except zoo.ConfigError as error:
            raise zoo.ConfigError(f"task.{error}") from None
        for name, allowed in SETTING_RANGES.items():
            value = settings.get(name, 0.0)
            if isinstance(value, bool) or not isinstance(value, int | float) or not allowed.holds(value):
                raise zoo.ConfigError(f"task.{name}={value!r} must {allowed}")

    def metrics(self, stage: str) -> dict[str, Metric]:
        return {} if stage == "train" else {"bleu": BLEUScore(), "chrf": ChrF()}

    def model_step(self, batch: dict[str, Any], batch_idx: int, stage: str) -> Tensor:
        """Teacher-forced loss; outside training the batch is also translated for BLEU/chrF (in
        validation only ``decode_batches`` batches, spread over the length-sorted set)."""
        if stage == "train":  # nothing is translated in training
            return self.training_loss(batch)
        logits = self.model(batch["input_ids"], batch["decoder_input_ids"], padding_mask(batch))  # (B, T, V)
        loss = self.smoothed_loss(logits, batch["labels"])
        if stage == "val" and batch_idx % self.decode_stride():
            return loss
        hypotheses = self.translate_ids(batch["input_ids"], batch["attention_mask"])
        self.metrics_at(stage).update(hypotheses, [[ref] for ref in batch["references"]])
        if stage == "val" and batch_idx == 0 and not self.trainer.sanity_checking:
            self.show_samples(batch, hypotheses)
        return loss

    def train_loss(self, batch: dict[str, Any]) -> Tensor:
        """The teacher-forced, label-smoothed loss of a training batch: over the whole logits, or
        ``loss_chunk`` target rows at a time."""
        if self.loss_chunk:
            memory = self.model.encode(batch["input_ids"], padding_mask(batch))  # (B, S, D)
            hidden = self.model.decoder_features(batch["decoder_input_ids"], memory, padding_mask(batch))
            return zoo.chunked_cross_entropy(
                hidden, self.model.logits, batch["labels"], chunk=self.loss_chunk, label_smoothing=self.label_smoothing
            )  # hidden: (B, T, D)
        logits = self.model(batch["input_ids"], batch["decoder_input_ids"], padding_mask(batch))  # (B, T, V)
        return self.smoothed_loss(logits, batch["labels"])

    def smoothed_loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Mean label-smoothed cross-entropy of logits (B, T, V) against labels (B, T), in float32."""
        return F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, label_smoothing=self.label_smoothing
        )

    def decode_stride(self) -> int:
        """Every how many validation batches one is translated, for ``decode_batches`` in all."""
        return max(1, math.ceil(self.trainer.num_val_batches[0] / self.decode_batches))

    def show_samples(self, batch: dict[str, Any], hypotheses: list[str]) -> None:
        """Keep and print the first ``n_samples`` translations of ``batch`` beside their references."""
        sources = [self.tokenizer.decode(ids.tolist(), skip_special_tokens=True) for ids in batch["input_ids"]]
        self.samples = list(zip(sources, hypotheses, batch["references"], strict=True))[: self.n_samples]
        for src, hyp, ref in self.samples:
            self.log_text(
                sample_block(
                    f"[step {self.global_step}] translation:", {"source": src, "output": hyp, "reference": ref}
                )
            )

    def generation_settings(self) -> dict[str, Any]:
        """The ``model.generate`` keywords this task translates with (validation, test, zoo-generate's
        defaults), which ``zoo-export format=hf`` writes into generation_config.json."""
        return {
            "max_new_tokens": self.max_new_tokens,
            "num_beams": self.num_beams,
            "length_penalty": self.length_penalty,
        }

    @torch.no_grad()
    def translate_ids(self, input_ids: Tensor, attention_mask: Tensor | None = None, **settings: Any) -> list[str]:
        """(B, S) source ids -> B translations. ``settings`` (num_beams, max_new_tokens, length_penalty)
        replace the task's own for this call."""
        settings = {**self.generation_settings(), **settings}
        out = self.model.generate(input_ids, attention_mask=attention_mask, **settings)
        texts, eos = [], self.model.config.eos_token_id
        for row in out[:, 1:].tolist():  # drop the start token; cut at </s>
            row = row[: row.index(eos)] if eos in row else row
            texts.append(self.tokenizer.decode(row, skip_special_tokens=True))
        return texts

    def translate(self, texts: list[str], **settings: Any) -> list[str]:
        """Translations of ``texts``; ``settings`` as for ``translate_ids``."""
        eos = self.model.config.eos_token_id
        ids = [i if i[-1:] == [eos] else i + [eos] for i in (self.tokenizer.encode(t).ids for t in texts)]
        width = max(len(i) for i in ids)
        pad = self.model.config.pad_token_id
        batch = torch.full((len(ids), width), pad, dtype=torch.long, device=self.device)
        mask = torch.zeros_like(batch)
        for row, i in enumerate(ids):
            batch[row, : len(i)] = torch.tensor(i)
            mask[row, : len(i)] = 1  # from the lengths: pad may be a real token (eos, for a tokenizer without one)
        return self.translate_ids(batch, mask, **settings)

    def export_tokenizer(self) -> Tokenizer:
        """The tokenizer with ``$A </s>`` as its post-processing, as sources are encoded in training
        (a T5 tokenizer read from a folder has it already)."""
        tokenizer = Tokenizer.from_str(self.tokenizer.to_str())
        eos = self.model.config.eos_token_id
        if eos is not None and eos not in added_around(tokenizer)[1]:
            token = tokenizer.id_to_token(eos)
            tokenizer.post_processor = processors.TemplateProcessing(
                single=f"$A {token}", pair=f"$A {token} $B:1 {token}:1", special_tokens=[(token, eos)]
            )
        return tokenizer

    def respond(
        self,
        prompt: str,
        *,
        max_new_tokens: int,
        num_beams: int,
        repetition_penalty: float = 1.0,
        no_repeat_ngram_size: int = 0,
        compile: bool = False,
        **_: Any,
    ) -> str:
        """The translation of ``prompt``, greedy or with ``num_beams`` beams; ``compile``: a static
        cache and a compiled step (``ZooModel.generate``)."""
        return self.translate(
            [prompt],
            num_beams=num_beams,
            max_new_tokens=max_new_tokens,
            repetition_penalty=repetition_penalty,
            no_repeat_ngram_size=no_repeat_ngram_size,
            compile=bool(compile),
        )[0]
