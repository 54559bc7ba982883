"""BERT masked-LM pretraining: predict the chosen tokens through the MLM head tied to the embeddings."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Accuracy, Metric

import zoo
from tasks.base import ZooTask, padding_mask, top_count
from tasks.data.modules import IGNORE
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
        # updated with the chosen positions alone: no ignore_index (a boolean index inside torchmetrics) and
        # no validation of the labels (torch.unique): each waits for the device in a training step
        vocab = self.model.config.vocab_size
        return {"masked_acc": Accuracy(task="multiclass", num_classes=vocab, validate_args=False)}

    def model_step(self, batch: dict[str, Tensor], batch_idx: int, stage: str) -> Tensor:
        hidden = self.model(batch["input_ids"], padding_mask(batch))  # (B, T, D)
        return self.masked_loss(hidden, batch["labels"], batch["chosen"], stage)

    def masked_loss(
        self, hidden: Tensor, labels: Tensor, chosen: Tensor, stage: str, reduction: str = "mean"
    ) -> Tensor:
        """The loss of the chosen positions' predictions from hidden states (B, T, D), labels (B, T)
        (-100 where not chosen) and ``chosen`` (N,), where the chosen positions are in the flattened
        (B*T) batch (the collate's); the stage's metrics are updated."""
        if len(chosen) == 0:  # a batch of special tokens only (its shape, known to the host): nothing to learn
            return hidden.sum() * 0.0
        # the head (dense, norm, vocabulary projection) runs on the chosen positions only
        logits = self.model.mlm_logits(hidden.flatten(0, 1).index_select(0, chosen))  # (N, V)
        labels = labels.flatten().index_select(0, chosen)  # (N,)
        self.metrics_at(stage).update(logits.argmax(-1), labels)
        return F.cross_entropy(logits.float(), labels, reduction=reduction)

    def pipeline_batch(self, batch: dict[str, Tensor]) -> PipelineBatch:
        """The batch cut for pipeline stages (trainer=pp): token ids in, the padding mask to every stage,
        labels to the last; the loss averages over the chosen positions."""
        labels = batch["labels"]
        items = torch.full((), len(batch["chosen"]), device=labels.device)
        return PipelineBatch(batch["input_ids"], {"attention_mask": batch["attention_mask"]}, {"labels": labels}, items)

    def pipeline_loss(self, hidden: Tensor, target: dict[str, Tensor], stage: str) -> Tensor:
        """On a pipeline's last stage (trainer=pp): one microbatch's losses, summed (the strategy divides by
        the batch's chosen positions). The schedule cuts the batch's rows into microbatches, so a
        microbatch's chosen positions are found from its labels here: the host waits for their count."""
        labels = target["labels"]
        chosen = (labels.flatten() != IGNORE).nonzero().squeeze(1)  # (N,)
        return self.masked_loss(hidden, labels, chosen, stage, reduction="sum")

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
