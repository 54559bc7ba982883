"""BERT masked-LM pretraining: predict the chosen tokens through the MLM head tied to the embeddings."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Metric

import zoo
from tasks.base import ZooTask, padding_mask, top_count
from tasks.data.modules import IGNORE
from tasks.strategy import PipelineBatch


class MaskedAccuracy(Metric):
    """The share of the chosen positions predicted right: torchmetrics' multiclass micro ``Accuracy`` with
    ``ignore_index``, counted with a mask of the entries that count instead of a boolean index (whose size
    a GPU reads back to the host: a wait in every step)."""

    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("hits", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, predictions: Tensor, labels: Tensor, counts: Tensor | None = None) -> None:
        """``predictions`` and ``labels`` (N,); ``counts`` (N,) bool: the entries that count (all: None)."""
        hit = predictions == labels
        if counts is None:
            self.hits += hit.sum()
            self.total += labels.numel()
        else:
            self.hits += (hit & counts).sum()
            self.total += counts.sum()

    def compute(self) -> Tensor:
        return self.hits.double().div(self.total.clamp(min=1)).float()


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
        return {"masked_acc": MaskedAccuracy()}

    def model_step(self, batch: dict[str, Tensor], batch_idx: int, stage: str) -> Tensor:
        hidden = self.model(batch["input_ids"], padding_mask(batch))  # (B, T, D)
        return self.masked_loss(hidden, batch["labels"], batch["chosen"], stage)

    def masked_loss(
        self,
        hidden: Tensor,
        labels: Tensor,
        chosen: Tensor,
        stage: str,
        reduction: str = "mean",
        counts: Tensor | None = None,
    ) -> Tensor:
        """The loss of the chosen positions' predictions from hidden states (B, T, D), labels (B, T)
        (-100 where not chosen) and ``chosen`` (N,), where the chosen positions are in the flattened
        (B*T) batch (the collate's); ``counts`` (N,) bool: which of them count (None: all); the stage's
        metrics are updated."""
        if len(chosen) == 0:  # a batch of special tokens only (its shape, known to the host): nothing to learn
            return hidden.sum() * 0.0
        # the head (dense, norm, vocabulary projection) runs on the chosen positions only
        logits = self.model.mlm_logits(hidden.flatten(0, 1).index_select(0, chosen))  # (N, V)
        labels = labels.flatten().index_select(0, chosen)  # (N,)
        if counts is not None:
            labels = labels.masked_fill(~counts, IGNORE)
        self.metrics_at(stage).update(logits.argmax(-1), labels, counts)
        return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE, reduction=reduction)

    def pipeline_batch(self, batch: dict[str, Tensor]) -> PipelineBatch:
        """The batch cut for pipeline stages (trainer=pp): token ids in, the padding mask to every stage,
        labels to the last; the loss averages over the chosen positions."""
        labels = batch["labels"]
        items = torch.full((), len(batch["chosen"]), device=labels.device)
        target = {"labels": labels, "chosen_rows": batch["chosen_rows"]}
        return PipelineBatch(batch["input_ids"], {"attention_mask": batch["attention_mask"]}, target, items)

    def pipeline_loss(self, hidden: Tensor, target: dict[str, Tensor], stage: str) -> Tensor:
        """On a pipeline's last stage (trainer=pp): one microbatch's losses, summed (the strategy divides by
        the batch's chosen positions). The schedule cuts the batch's rows into microbatches, so the
        chosen positions come row by row (the collate's ``chosen_rows``, (B, K), -1 past a row's own),
        a shape the host knows: it never waits for a count."""
        rows = target["chosen_rows"]  # (b, K)
        counts = rows >= 0
        at = torch.arange(rows.shape[0], device=rows.device).unsqueeze(1) * hidden.shape[1] + rows.clamp(min=0)
        return self.masked_loss(hidden, target["labels"], at.flatten(), stage, "sum", counts.flatten())

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
