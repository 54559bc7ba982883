"""Comparing two float computations of the same function: the tolerance follows their rounding error.

Two exact-in-math computations of a model's outputs (a merged LoRA weight ``W + BA`` against the
adapter beside ``W``, one attention kernel against another, cached decoding against a recompute)
differ by rounding, and by how much depends on the computation, not on a fixed 1e-5: each sum of n
terms rounds with an error near ``eps * sqrt(n)`` of its magnitude (summed in an order the thread
count chooses), and each block passes the error on. So the tolerance here is

    atol = FACTOR * eps(dtype) * sqrt(width) * depth * max|expected|

with ``width`` the longest sum (d_ff or d_model), ``depth`` the blocks the signal passes through,
and a safety ``FACTOR``. A wrong computation (a bias dropped, a mask off by one position) is orders
of magnitude beyond it: at the tiny sizes of these tests, ``1e-5 < atol < 1e-3`` of logits ~1.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from zoo.blocks import Block

FACTOR = 16.0


def rounding_atol(expected: Tensor, *, width: int, depth: int) -> float:
    """The absolute tolerance for ``expected`` computed ``depth`` blocks deep with sums of ``width`` terms."""
    eps = torch.finfo(expected.dtype).eps
    scale = expected.detach().abs().max().item() if expected.numel() else 0.0
    return FACTOR * eps * math.sqrt(width) * max(depth, 1) * max(scale, 1.0)


def model_shape(model: torch.nn.Module) -> tuple[int, int]:
    """(width, depth) of a zoo model: its longest sum and the blocks it holds (an encoder-decoder's
    decoder reads the encoder's output, so the signal passes through all of them)."""
    cfg = model.config
    return max(cfg.d_model, cfg.resolved_d_ff), sum(isinstance(m, Block) for m in model.modules())


def assert_rounding_close(actual: Tensor, expected: Tensor, model: torch.nn.Module, msg: str | None = None) -> None:
    """``actual`` equals ``expected`` (outputs of ``model``, or of a model shaped like it) within its rounding."""
    width, depth = model_shape(model)
    torch.testing.assert_close(
        actual, expected, rtol=0, atol=rounding_atol(expected, width=width, depth=depth), msg=msg
    )
