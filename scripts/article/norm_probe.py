"""Experiment 2's measurements at initialisation, on zoo models built directly: the gradient norm in each
layer (Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture") and how far one
optimizer step moves the output (Liu et al. 2020, "Understanding the Difficulty of Training Transformers")."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import zoo

VOCAB = 512


def narrow_decoder(placement: str, depth: int, seed: int, d_model: int = 64) -> zoo.ZooModel:
    """The ablation's decoder (gpt-tiny layout, d_model 64, 4 heads) at ``depth`` layers, no dropout."""
    cfg = zoo.get_config("gpt-tiny").replace(
        vocab_size=VOCAB, d_model=d_model, n_heads=4, n_layers=depth, norm_placement=placement, dropout=0.0
    )
    torch.manual_seed(seed)
    return zoo.build_model(cfg)


def batch(seed: int, rows: int = 8, length: int = 64) -> torch.Tensor:
    """Random token rows (rows, length + 1): the measurements are about the network, not the data."""
    return torch.randint(0, VOCAB, (rows, length + 1), generator=torch.Generator().manual_seed(seed))


def _loss(model: zoo.ZooModel, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def ffn_grad_norms(model: zoo.ZooModel, tokens: torch.Tensor) -> list[float]:
    """The norm of the loss gradient over each block's FFN weights, first layer to last."""
    model.zero_grad(set_to_none=True)
    _loss(model, tokens).backward()
    blocks = model.stacks()[-1].blocks
    return [float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in b.ffn.parameters()]))) for b in blocks]


def output_change(model: zoo.ZooModel, tokens: torch.Tensor, lr: float = 1e-3) -> float:
    """Mean squared change of the logits on ``tokens`` after one Adam step of ``lr`` on their loss."""
    model.eval()  # no dropout either way; the step itself needs no train mode
    with torch.no_grad():
        before = model(tokens[:, :-1])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    optimizer.zero_grad(set_to_none=True)
    _loss(model, tokens).backward()
    optimizer.step()
    with torch.no_grad():
        after = model(tokens[:, :-1])
    return float((after - before).pow(2).mean())
