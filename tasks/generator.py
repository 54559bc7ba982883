"""GPT-style language model: next-token cross-entropy, perplexity, a sample at each validation."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.text import Perplexity

import zoo
from tasks.base import ZooTask
from tasks.chat.templates import chat_prompt
from tasks.run.loggers import sample_block
from tasks.strategy import PipelineBatch


class GeneratorTask(ZooTask):
    forms = ("decoder",)
    pipelined = True
    chats = True

    def __init__(
        self,
        *,
        model: dict[str, Any],
        optimizer: dict[str, Any],
        scheduler: dict[str, Any] | None = None,
        tokenizer_json: str | None = None,
        adapter: dict[str, Any] | None = None,
        sample_prompt: str = "def",
        sample_tokens: int = 48,
        sample_temperature: float = 0.8,
        loss_chunk: int | None = None,
    ) -> None:
        """``loss_chunk``: rows (tokens) per chunk of the training loss (zoo.chunked_cross_entropy), so
        the whole (B, T, V) logits never exist in training; None or 0: the whole logits at once."""
        super().__init__(
            model=model, optimizer=optimizer, scheduler=scheduler, tokenizer_json=tokenizer_json, adapter=adapter
        )
        self.sample_prompt, self.sample_tokens = sample_prompt, sample_tokens
        self.sample_temperature, self.loss_chunk = sample_temperature, loss_chunk
        self.samples: list[str] = []
        self.add_metrics()

    @classmethod
    def check_settings(cls, settings: dict[str, Any], model: zoo.ModelConfig) -> None:
        if not str(settings.get("sample_prompt", "def")).strip():
            raise zoo.ConfigError(
                "task.sample_prompt is empty; give the text the validation samples continue "
                "(e.g. task.sample_prompt=def)"
            )
        tokens = settings.get("sample_tokens", 48)
        if tokens < 1:
            raise zoo.ConfigError(f"task.sample_tokens={tokens} must be >= 1")
        limit = zoo.position_limit(model)
        if limit is not None and tokens >= limit:
            raise zoo.ConfigError(
                f"task.sample_tokens={tokens} does not fit the model's {limit} positions "
                f"(model.max_seq_len); lower task.sample_tokens"
            )
        if settings.get("sample_temperature", 0.8) <= 0:
            raise zoo.ConfigError(f"task.sample_temperature={settings['sample_temperature']} must be > 0")
        if (settings.get("loss_chunk") or 0) < 0:
            raise zoo.ConfigError(
                f"task.loss_chunk={settings['loss_chunk']} must be >= 1 (rows per chunk of the "
                f"training loss), or null or 0 for the whole logits at once"
            )

    def metrics(self, stage: str) -> dict[str, Metric]:
        return {} if stage == "train" else {"ppl": Perplexity(ignore_index=-100)}

    def model_step(self, batch: dict[str, Tensor], batch_idx: int, stage: str) -> Tensor:
        if stage == "train":  # no metric reads the logits in training
            return self.training_loss(batch)
        logits = self.model(batch["input_ids"], document_ids=batch.get("document_ids"))  # (B, T, V)
        self.metrics_at(stage).update(logits.float(), batch["labels"])
        return next_token_loss(logits, batch["labels"])

    def train_loss(self, batch: dict[str, Tensor]) -> Tensor:
        """The next-token loss of a training batch: over the whole logits, or ``loss_chunk`` rows at a time."""
        if self.loss_chunk:
            hidden = self.model.features(batch["input_ids"], document_ids=batch.get("document_ids"))  # (B, T, D)
            return zoo.chunked_cross_entropy(hidden, self.model.logits, batch["labels"], chunk=self.loss_chunk)
        logits = self.model(batch["input_ids"], document_ids=batch.get("document_ids"))  # (B, T, V)
        return next_token_loss(logits, batch["labels"])

    def pipeline_batch(self, batch: dict[str, Tensor]) -> PipelineBatch:
        """The batch cut for pipeline stages (trainer=pp): token ids in, packed documents' ids to every
        stage, labels to the last; the loss averages over the labels that count."""
        extra = {"document_ids": batch["document_ids"]} if batch.get("document_ids") is not None else {}
        labels = batch["labels"]
        return PipelineBatch(batch["input_ids"], extra, {"labels": labels}, (labels != -100).sum())

    def pipeline_loss(self, hidden: Tensor, target: dict[str, Tensor], stage: str) -> Tensor:
        """On a pipeline's last stage (trainer=pp): one microbatch's next-token losses, summed (the
        strategy divides by the batch's label count), from its final hidden states (B, T, D); outside
        training, the stage's metrics are updated as ``model_step`` updates them."""
        logits, labels = self.model.logits(hidden), target["labels"]  # (B, T, V), (B, T)
        metrics = self.metrics_at(stage)
        if metrics:
            metrics.update(logits.float(), labels)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="sum")

    def on_validation_epoch_end(self) -> None:
        if self.tokenizer_json is None or self.trainer.sanity_checking:
            return
        if self.pipeline_step() is not None:  # no rank holds the whole model to sample from
            return
        text = self.generate_text(self.sample_prompt, **self.generation_settings())
        self.samples.append(text)
        self.log_text(sample_block(f"[step {self.global_step}] sample:", {"": text}))

    def generation_settings(self) -> dict[str, Any]:
        """The ``model.generate`` keywords of this task's validation samples, which ``zoo-export
        format=hf`` writes into generation_config.json: sampled at ``sample_temperature``, unfiltered."""
        return {"max_new_tokens": self.sample_tokens, "do_sample": True, "temperature": self.sample_temperature}

    @torch.no_grad()
    def chat(
        self,
        messages: list[dict[str, str]],
        *,
        origin: str,
        max_new_tokens: int,
        do_sample: bool,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
        seed: int,
        repetition_penalty: float = 1.0,
        no_repeat_ngram_size: int = 0,
        compile: bool = False,
        **_: Any,
    ) -> str:
        """The model's reply to ``messages`` (the conversation so far), as its chat template asks for one
        (tasks.chat.templates: rendered in a sandbox), ended by its end-of-turn token; the reply alone."""
        ids, end = chat_prompt(self, messages, origin)
        sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p) if do_sample else {}
        generator = torch.Generator(device=self.device).manual_seed(seed)
        out = self.model.generate(
            torch.tensor([ids], device=self.device),
            max_new_tokens,
            generator=generator,
            eos_token_id=end,
            do_sample=bool(do_sample),
            repetition_penalty=repetition_penalty,
            no_repeat_ngram_size=no_repeat_ngram_size,
            compile=bool(compile),
            **sampling,
        )
        return self.tokenizer.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True).strip()

    @torch.no_grad()
    def generate_text(self, prompt: str, max_new_tokens: int, *, seed: int = 0, **kwargs: Any) -> str:
        """Continue ``prompt``; kwargs go to ``model.generate`` (sampling when a temperature is given)."""
        ids = self.tokenizer.encode(prompt).ids
        generator = torch.Generator(device=self.device).manual_seed(seed)
        kwargs.setdefault("do_sample", "temperature" in kwargs)
        out = self.model.generate(
            torch.tensor([ids], device=self.device), max_new_tokens, generator=generator, **kwargs
        )
        return self.tokenizer.decode(out[0].tolist(), skip_special_tokens=True)

    def respond(
        self,
        prompt: str,
        *,
        max_new_tokens: int,
        do_sample: bool,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
        seed: int,
        repetition_penalty: float = 1.0,
        no_repeat_ngram_size: int = 0,
        compile: bool = False,
        **_: Any,
    ) -> str:
        """``prompt`` continued: sampled with ``temperature``, ``top_k`` and ``top_p``, or greedy;
        ``repetition_penalty`` and ``no_repeat_ngram_size`` apply to either; ``compile``: a static
        cache and a compiled step (``ZooModel.generate``)."""
        sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p) if do_sample else {}
        return self.generate_text(
            prompt,
            max_new_tokens,
            seed=seed,
            do_sample=bool(do_sample),
            repetition_penalty=repetition_penalty,
            no_repeat_ngram_size=no_repeat_ngram_size,
            compile=bool(compile),
            **sampling,
        )


def next_token_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy of logits (B, T, V) against labels (B, T), in float32; -100 labels count nowhere."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
