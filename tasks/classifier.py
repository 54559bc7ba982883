"""BERT-style sequence classifier: encoder, pooling (first token or mean), linear head."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Accuracy, Metric

import zoo
from tasks.base import ZooTask, padding_mask, top_count
from tasks.strategy import PipelineBatch

POOLINGS = ("cls", "mean")


class MacroF1(Metric):
    """The F1 score of each label, averaged over the labels seen (as predictions or targets): torchmetrics'
    ``F1Score(task="multiclass", average="macro")``, counted in a (label, prediction) table by ``index_add_``.
    torchmetrics' ``bincount`` sizes its output by the largest value, which a GPU reads back to the host:
    a wait in every training step."""

    full_state_update = False

    def __init__(self, num_classes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.add_state("counts", torch.zeros(num_classes * num_classes, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, logits: Tensor, labels: Tensor) -> None:
        """``logits`` (B, n_labels), ``labels`` (B,)."""
        cell = labels * self.num_classes + logits.argmax(-1)  # (B,): row label, column prediction
        self.counts.index_add_(0, cell, torch.ones_like(cell))

    def compute(self) -> Tensor:
        table = self.counts.view(self.num_classes, self.num_classes).double()  # (label, prediction)
        hits = table.diagonal()
        errors = table.sum(0) + table.sum(1) - 2 * hits  # false positives + false negatives
        seen = (hits + errors) > 0
        f1 = torch.where(seen, 2 * hits / (2 * hits + errors).clamp(min=1), 0.0)
        return (f1.sum() / seen.sum().clamp(min=1)).float()


class ClassifierTask(ZooTask):
    forms = ("encoder",)
    pipelined = True

    def __init__(
        self,
        *,
        model: dict[str, Any],
        optimizer: dict[str, Any],
        scheduler: dict[str, Any] | None = None,
        label_names: list[str],
        pooling: str = "cls",
        head_dropout: float = 0.1,
        tokenizer_json: str | None = None,
        adapter: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            model=model, optimizer=optimizer, scheduler=scheduler, tokenizer_json=tokenizer_json, adapter=adapter
        )
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r} must be one of {POOLINGS}")
        self.label_names, self.pooling = list(label_names), pooling
        self.head = nn.Sequential(nn.Dropout(head_dropout), nn.Linear(self.model.config.d_model, len(self.label_names)))
        self.add_metrics()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """(B, T) token ids -> (B, n_labels) logits."""
        return self.classify(self.model(input_ids, attention_mask), attention_mask)

    def classify(self, hidden: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """(B, T, D) hidden states -> (B, n_labels) logits: pooled (first token or masked mean), then the head."""
        if self.pooling == "mean":
            mask = (
                torch.ones(hidden.shape[:2], dtype=torch.long, device=hidden.device)
                if attention_mask is None
                else attention_mask
            )  # (B, T)
            pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        elif self.model.pooler is not None:
            pooled = self.model.pool(hidden)
        else:
            pooled = hidden[:, 0]
        return self.head(pooled)

    def metrics(self, stage: str) -> dict[str, Metric]:
        n = len(self.label_names)
        return {
            "acc": Accuracy(task="multiclass", num_classes=n, validate_args=False),  # its checks wait on a GPU
            "f1": MacroF1(n),
        }

    def model_step(self, batch: dict[str, Tensor], batch_idx: int, stage: str) -> Tensor:
        hidden = self.model(batch["input_ids"], padding_mask(batch))  # (B, T, D)
        return self.labelled_loss(hidden, batch, stage)

    def labelled_loss(self, hidden: Tensor, batch: dict[str, Tensor], stage: str, reduction: str = "mean") -> Tensor:
        """The loss of the encoder's hidden states (B, T, D) against ``batch``'s labels (B,), pooled
        under its attention mask; the stage's metrics are updated."""
        logits = self.classify(hidden, batch["attention_mask"])  # (B, n_labels)
        self.metrics_at(stage).update(logits, batch["labels"])
        return F.cross_entropy(logits.float(), batch["labels"], reduction=reduction)

    def pipeline_batch(self, batch: dict[str, Tensor]) -> PipelineBatch:
        """The batch cut for pipeline stages (trainer=pp): token ids in, the padding mask to every stage,
        labels and the mask (mean pooling reads it) to the last; the loss averages over the rows."""
        mask, labels = batch["attention_mask"], batch["labels"]
        rows = torch.full((), labels.shape[0], device=labels.device)
        return PipelineBatch(
            batch["input_ids"], {"attention_mask": mask}, {"labels": labels, "attention_mask": mask}, rows
        )

    def pipeline_loss(self, hidden: Tensor, target: dict[str, Tensor], stage: str) -> Tensor:
        """On a pipeline's last stage (trainer=pp): one microbatch's losses, summed (the strategy divides by
        the batch's rows)."""
        return self.labelled_loss(hidden, target, stage, reduction="sum")

    @torch.no_grad()
    def respond(self, prompt: str, *, top: int, **_: Any) -> str:
        """The ``top`` most likely labels of ``prompt``, one ``label<TAB>probability`` line each."""
        probs = self(torch.tensor([self.prompt_ids(prompt)], device=self.device)).softmax(-1)[0]
        best = probs.topk(min(top_count(top), len(probs)))
        return "\n".join(
            f"{self.label_names[int(i)]}\t{float(p):.3f}" for p, i in zip(best.values, best.indices, strict=True)
        )

    def export_info(self, *, head_in_graph: bool) -> dict[str, Any]:
        """The label names; unless the file computes the head (an ONNX graph), also the pooling, which
        head.safetensors needs."""
        return {"label_names": self.label_names, **({} if head_in_graph else {"pooling": self.pooling})}

    def hf_classifier(self) -> tuple[nn.Linear, list[str]]:
        """The head's linear layer over the pooled first token: BertForSequenceClassification's ``classifier``."""
        if self.model.pooler is None:
            raise zoo.ConfigError(
                "model.pooler=false: BertForSequenceClassification classifies the pooled first "
                "token; train with model.pooler=true, or export with format=safetensors or onnx"
            )
        if self.pooling != "cls":
            raise zoo.ConfigError(
                f"task.pooling={self.pooling}: BertForSequenceClassification classifies the pooled "
                "first token; export this run with format=safetensors or format=onnx"
            )
        return self.head[1], self.label_names

    def export_modules(self) -> dict[str, nn.Module]:
        return {"head.safetensors": self.head}

    def export_head(self, outputs: Tensor, attention_mask: Tensor) -> Tensor:
        return self.classify(outputs, attention_mask)
