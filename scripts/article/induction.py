"""Experiment 1's synthetic half: an induction (copy) task where length extrapolation cannot hide.

Each row repeats a random segment of k tokens (k from L/8 to L/4, L the training length) to its end.
After the first segment every next token is determined by the tokens before it, so a model that has
learned to copy (an induction head, Olsson et al. 2022: find the earlier occurrence of the current
token, predict what followed it; or a head that looks back k) predicts it exactly. Training rows have
length L; evaluation rows have length n >= L with the same segment lengths, so the offsets to copy from
are familiar and only the positions are new: a position encoding that breaks past L shows it directly.
Accuracy is counted on the determined tokens, split by whether the predicted position lies inside the
training length or past it.

The model is zoo's own (``zoo.build_model``), trained by a plain AdamW loop on batches made here: the
task has no text, so it does not go through zoo-train's tokenizing data modules.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import zoo

VOCAB = 64


@dataclass(frozen=True)
class CopySetup:
    """The task's sizes: training length, steps, batch, and the small decoder that learns it."""

    length: int = 64
    steps: int = 800
    batch: int = 32
    lr: float = 1e-3
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4


def copy_rows(
    n_rows: int, length: int, *, train_length: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows (n_rows, length) of token ids, scored (n_rows, length - 1) bool). Each row repeats one random
    segment of k tokens, k drawn from [train_length/8, train_length/4] whatever the row's length, so the
    offsets to copy from are ones training saw; scored[r, t] is True where the token at t + 1 lies after
    the row's first segment (it is determined by the tokens before it)."""
    rows = torch.empty(n_rows, length, dtype=torch.long)
    scored = torch.zeros(n_rows, length - 1, dtype=torch.bool)
    low, high = max(2, train_length // 8), max(3, train_length // 4)
    for r in range(n_rows):
        k = int(torch.randint(low, high + 1, (1,), generator=generator))
        segment = torch.randint(0, VOCAB, (k,), generator=generator)
        rows[r] = segment.repeat(length // k + 1)[:length]
        scored[r, k - 1 :] = True  # targets k .. length-1
    return rows, scored


def decoder(position: str, setup: CopySetup, max_len: int, seed: int) -> zoo.ZooModel:
    """A small zoo decoder for the task, ``max_len`` positions (learned tables get as many rows)."""
    cfg = zoo.get_config("gpt-tiny").replace(
        vocab_size=VOCAB,
        d_model=setup.d_model,
        n_layers=setup.n_layers,
        n_heads=setup.n_heads,
        position=position,
        max_seq_len=max_len,
        dropout=0.0,
    )
    torch.manual_seed(seed)
    return zoo.build_model(cfg)


def train_copy(model: zoo.ZooModel, setup: CopySetup, seed: int) -> list[float]:
    """AdamW with a linear warmup over the first tenth of the steps; the loss counts every next token (those
    of the first segment cannot be learned). Returns the loss on the determined tokens every 50 steps."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=setup.lr, weight_decay=0.0)
    warmup = max(1, setup.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    curve = []
    model.train()
    for step in range(setup.steps):
        rows, scored = copy_rows(setup.batch, setup.length, train_length=setup.length, generator=generator)
        logits = model(rows[:, :-1])  # (B, L-1, V)
        losses = F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten(), reduction="none").view_as(scored)
        losses.mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        if step % 50 == 0 or step == setup.steps - 1:
            curve.append(float(losses.detach()[scored].mean()))
    model.eval()
    return curve


@torch.no_grad()
def copy_accuracy(model: zoo.ZooModel, length: int, train_length: int, *, rows: int, seed: int) -> dict[str, float]:
    """Greedy next-token accuracy on the predictable second-copy tokens of ``rows`` rows of ``length``:
    ``all``, ``inside`` (predicted positions < train_length) and ``past`` (>= train_length; NaN when none)."""
    generator = torch.Generator().manual_seed(10_000 + seed)
    tokens, scored = copy_rows(rows, length, train_length=train_length, generator=generator)
    hits = torch.cat([model(chunk[:, :-1]).argmax(-1) == chunk[:, 1:] for chunk in tokens.split(16)])
    past = (torch.arange(1, length) >= train_length).expand_as(scored)

    def rate(where: torch.Tensor) -> float:
        return float(hits[where].float().mean()) if where.any() else float("nan")

    return {"all": rate(scored), "inside": rate(scored & ~past), "past": rate(scored & past)}
