"""BERT-style sequence classifier: encoder, pooling (first token or mean), linear head."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Accuracy, F1Score, MetricCollection

from tasks.base import ZooTask

POOLINGS = ("cls", "mean")


class ClassifierTask(ZooTask):
    forms = ("encoder",)

    def __init__(self, *, model: dict[str, Any], optimizer: dict[str, Any], label_names: list[str],
                 pooling: str = "cls", head_dropout: float = 0.1, tokenizer_json: str | None = None) -> None:
        super().__init__(model=model, optimizer=optimizer, tokenizer_json=tokenizer_json)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r} must be one of {POOLINGS}")
        self.label_names, self.pooling = list(label_names), pooling
        n = len(self.label_names)
        self.head = nn.Sequential(nn.Dropout(head_dropout), nn.Linear(self.model.config.d_model, n))
        metrics = MetricCollection({"acc": Accuracy(task="multiclass", num_classes=n),
                                    "f1": F1Score(task="multiclass", num_classes=n, average="macro")})
        self.train_metrics, self.val_metrics, self.test_metrics = (metrics.clone(prefix=f"{s}/")
                                                                   for s in ("train", "val", "test"))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """(B, T) token ids -> (B, n_labels) logits."""
        hidden = self.model(input_ids, attention_mask)  # (B, T, D)
        if self.pooling == "mean":
            mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
            pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        elif self.model.pooler is not None:
            pooled = self.model.pool(hidden)
        else:
            pooled = hidden[:, 0]
        return self.head(pooled)

    def step(self, batch: dict[str, Tensor], stage: str) -> Tensor:
        logits = self(batch["input_ids"], batch["attention_mask"])
        loss = F.cross_entropy(logits.float(), batch["labels"])
        metrics = getattr(self, f"{stage}_metrics")
        metrics.update(logits, batch["labels"])
        self.log(f"{stage}/loss", loss, prog_bar=stage != "test", sync_dist=stage != "train")
        self.log_dict(metrics, prog_bar=stage == "val")
        return loss

    @torch.no_grad()
    def predict_text(self, text: str) -> tuple[str, float]:
        """The most likely label of ``text`` and its probability."""
        ids = torch.tensor([self.tokenizer.encode(text).ids], device=self.device)
        probs = self(ids).softmax(-1)[0]
        best = int(probs.argmax())
        return self.label_names[best], float(probs[best])
