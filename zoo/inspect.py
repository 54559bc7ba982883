"""Reading attention probabilities out of a model (for heatmaps, rollout and diagnostics)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor, nn

from zoo.attention import Attention


@contextmanager
def capture_attention(model: nn.Module) -> Iterator[dict[str, Tensor]]:
    """Run ``model`` on the reference ``math`` kernel and collect every layer's probabilities.

    Yields a dict filled during forward passes inside the block: module name (e.g.
    ``decoder.blocks.0.attn``) -> probabilities (B, H, Tq, Tk), detached. Kernels are restored after.
    """
    captured: dict[str, Tensor] = {}
    layers = {name: m for name, m in model.named_modules() if isinstance(m, Attention)}
    kernels = {name: m.kernel for name, m in layers.items()}
    handles = []
    for name, layer in layers.items():
        layer.kernel = "math"
        handles.append(layer.probe.register_forward_hook(
            lambda _m, _inp, out, name=name: captured.__setitem__(name, out.detach())))
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()
        for name, layer in layers.items():
            layer.kernel = kernels[name]
