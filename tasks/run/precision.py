"""Gradient clipping where Lightning's mixed-precision plugin refuses to clip: an optimizer that unscales
its gradients inside its own step (fused AdamW), under ``bf16-mixed`` or ``16-mixed``."""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.plugins.precision.amp import _optimizer_handles_unscaling
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType


def clip_under_mixed_precision(
    precision: Precision, optimizer: torch.optim.Optimizer, value: float | None, algorithm: Any
) -> bool:
    """Clip the gradients of ``optimizer`` (by norm or by value, at ``value``) where Lightning's
    mixed-precision plugin would refuse to: for an optimizer that unscales gradients inside its own
    step (fused AdamW: ``_step_supports_amp_scaling``). True when it clipped; False leaves the
    clipping to Lightning (any other optimizer or precision, or no clipping asked).

    - ``bf16-mixed`` has no gradient scaler: the gradients are the true ones and clipping them
      before the step is what the unfused optimizer gets.
    - ``16-mixed`` scales the loss: the gradients are unscaled first (``GradScaler.unscale_``, which
      also records the inf/NaN check), then clipped; the scaler's step sees the optimizer's state as
      unscaled and hands the fused step no scale to divide by again, and still skips a step whose
      gradients were not finite.

    The clipping itself is the plugin's (``Precision.clip_gradients``), so a strategy that replaced
    its clipping by norm (trainer=tp, pp: over every rank's part of the model) still clips by its rule.
    """
    if not value or not isinstance(precision, MixedPrecision) or not _optimizer_handles_unscaling(optimizer):
        return False
    if precision.scaler is not None:
        precision.scaler.unscale_(optimizer)
    Precision.clip_gradients(precision, optimizer, value, GradClipAlgorithmType(algorithm or "norm"))
    return True
