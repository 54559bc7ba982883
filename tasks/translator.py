"""T5-style translator: teacher forcing with label smoothing; validation decodes with the KV cache
(greedy or beam) and reports BLEU and chrF."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics.text import BLEUScore, CHRFScore

from tasks.base import ZooTask


class TranslatorTask(ZooTask):
    forms = ("encoder_decoder",)

    def __init__(self, *, model: dict[str, Any], optimizer: dict[str, Any], tokenizer_json: str | None = None,
                 label_smoothing: float = 0.1, num_beams: int = 1, length_penalty: float = 1.0,
                 max_new_tokens: int = 64, decode_batches: int = 4, n_samples: int = 3) -> None:
        """``decode_batches``: how many validation batches are translated for BLEU/chrF (all test batches are)."""
        super().__init__(model=model, optimizer=optimizer, tokenizer_json=tokenizer_json)
        self.label_smoothing, self.num_beams, self.length_penalty = label_smoothing, num_beams, length_penalty
        self.max_new_tokens, self.decode_batches, self.n_samples = max_new_tokens, decode_batches, n_samples
        self.bleu = torch.nn.ModuleDict({s: BLEUScore() for s in ("val", "test")})
        self.chrf = torch.nn.ModuleDict({s: CHRFScore() for s in ("val", "test")})
        self.samples: list[tuple[str, str, str]] = []

    def step_loss(self, batch: dict[str, Any]) -> Tensor:
        logits = self.model(batch["input_ids"], batch["decoder_input_ids"], batch["attention_mask"])
        return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100,
                               label_smoothing=self.label_smoothing)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        loss = self.step_loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def evaluate(self, batch: dict[str, Any], batch_idx: int, stage: str) -> None:
        self.log(f"{stage}/loss", self.step_loss(batch), prog_bar=stage == "val", sync_dist=True,
                 batch_size=len(batch["references"]))
        if stage == "val":  # decode decode_batches batches spread over the (length-sorted) validation set
            stride = max(1, math.ceil(self.trainer.num_val_batches[0] / self.decode_batches))
            if batch_idx % stride:
                return
        hypotheses = self.translate_ids(batch["input_ids"], batch["attention_mask"])
        references = [[ref] for ref in batch["references"]]
        self.bleu[stage].update(hypotheses, references)
        self.chrf[stage].update(hypotheses, references)
        self.log(f"{stage}/bleu", self.bleu[stage], prog_bar=stage == "val")
        self.log(f"{stage}/chrf", self.chrf[stage], prog_bar=stage == "val")
        if stage == "val" and batch_idx == 0 and not self.trainer.sanity_checking:
            sources = [self.tokenizer.decode(ids.tolist(), skip_special_tokens=True) for ids in batch["input_ids"]]
            self.samples = list(zip(sources, hypotheses, batch["references"], strict=True))[: self.n_samples]
            for src, hyp, ref in self.samples:
                self.log_text(f"[step {self.global_step}] {src!r} -> {hyp!r} (reference {ref!r})")

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.evaluate(batch, batch_idx, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.evaluate(batch, batch_idx, "test")

    @torch.no_grad()
    def translate_ids(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> list[str]:
        out = self.model.generate(input_ids, self.max_new_tokens, attention_mask=attention_mask,
                                  num_beams=self.num_beams, length_penalty=self.length_penalty)
        texts, eos = [], self.model.config.eos_token_id
        for row in out[:, 1:].tolist():  # drop the start token; cut at </s>
            row = row[: row.index(eos)] if eos in row else row
            texts.append(self.tokenizer.decode(row, skip_special_tokens=True))
        return texts

    def translate(self, texts: list[str]) -> list[str]:
        ids = [self.tokenizer.encode(t).ids + [self.model.config.eos_token_id] for t in texts]
        width = max(len(i) for i in ids)
        pad = self.model.config.pad_token_id
        batch = torch.full((len(ids), width), pad, dtype=torch.long, device=self.device)
        for row, i in enumerate(ids):
            batch[row, : len(i)] = torch.tensor(i)
        return self.translate_ids(batch, (batch != pad).long())
