"""BERT masked-LM pretraining: predict the chosen tokens through the MLM head tied to the embeddings."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Accuracy, Metric

import zoo
from tasks.base import ZooTask, padding_mask, top_count
from tasks.strategy import PipelineBatch


class MLMTask(ZooTask):
    forms = ("encoder",)
    pipelined = True

    def __init__(
        self,
        *,
        model: dict[str, Any],
        optimizer: dict[str, Any],
        scheduler: dict[str, Any] | None = None,
        tokenizer_json: str | None = None,
        adapter: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            model=model, optimizer=optimizer, scheduler=scheduler, tokenizer_json=tokenizer_json, adapter=adapter
        )
        self.add_metrics()

    @classmethod
    def check_model_config(cls, cfg: zoo.ModelConfig) -> None:
        super().check_model_config(cfg)
        if not cfg.mlm_head:
            raise zoo.ConfigError("the mlm task needs the masked-LM head: set model.mlm_head=true")

    def metrics(self, stage: str) -> dict[str, Metric]:
        return {"masked_acc": Accuracy(task="multiclass", num_classes=self.model.config.vocab_size, ignore_index=-100)}

    def model_step(self, batch: dict[str, Tensor], batch_idx: int, stage: str) -> Tensor:
        hidden = self.model(batch["input_ids"], padding_mask(batch))  # (B, T, D)
        return self.masked_loss(hidden, batch["labels"], stage)

    def masked_loss(self, hidden: Tensor, labels: Tensor, stage: str, reduction: str = "mean") -> Tensor:
        """The loss of the chosen positions' predictions from hidden states (B, T, D), labels (B, T)
        (-100 where not chosen); the stage's metrics are updated."""
        chosen = labels != -100  # (B, T): ~15% of the tokens
        # the head (dense, norm, vocabulary projection) runs on the chosen positions only
        logits = self.model.mlm_logits(hidden[chosen])  # (N, V)
        labels = labels[chosen]  # (N,)
        self.metrics_at(stage).update(logits.argmax(-1), labels)
        return F.cross_entropy(logits.float(), labels, reduction=reduction)

    def pipeline_batch(self, batch: dict[str, Tensor]) -> PipelineBatch:
        """The batch cut for pipeline stages (trainer=pp): token ids in, the padding mask to every stage,
        labels to the last; the loss averages over the chosen positions."""
        labels = batch["labels"]
        return PipelineBatch(
            batch["input_ids"], {"attention_mask": batch["attention_mask"]}, {"labels": labels}, (labels != -100).sum()
        )

    def pipeline_loss(self, hidden: Tensor, target: dict[str, Tensor], stage: str) -> Tensor:
        """On a pipeline's last stage (trainer=pp): one microbatch's losses, summed (the strategy divides by
        the batch's chosen positions)."""
        return self.masked_loss(hidden, target["labels"], stage, reduction="sum")

    @torch.no_grad()
    def fill_mask(self, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
        """For each mask token (``<mask>``, or the tokenizer's own, e.g. ``[MASK]``) in ``text``, the top_k
        tokens and their probabilities."""
        enc = self.tokenizer.encode(text)
        ids = torch.tensor([enc.ids], device=self.device)
        probs = self.model.mlm_logits(self.model(ids)).softmax(-1)[0]
        mask_id = self.special_tokens.mask
        out = []
        for pos in (ids[0] == mask_id).nonzero()[:, 0].tolist():
            top = probs[pos].topk(top_k)
            out.append(
                [(self.tokenizer.id_to_token(int(i)), float(p)) for p, i in zip(top.values, top.indices, strict=True)]
            )
        return out

    def respond(self, prompt: str, *, top: int, **_: Any) -> str:
        """For each <mask> of ``prompt``, its ``top`` most likely tokens and their probabilities."""
        top = top_count(top)
        self.prompt_ids(prompt)
        filled = self.fill_mask(prompt, top_k=top)
        mask = self.tokenizer.id_to_token(self.special_tokens.mask)
        if not filled:
            return f"no {mask} token in the prompt"
        return "\n".join(
            f"{mask} #{n + 1}: " + ", ".join(f"{tok} ({p:.3f})" for tok, p in options)
            for n, options in enumerate(filled)
        )

    def export_head(self, outputs: Tensor, attention_mask: Tensor) -> Tensor:
        return self.model.mlm_logits(outputs)
