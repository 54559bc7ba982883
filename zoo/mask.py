"""Self-attention masks (``mask``). A mask says which keys each query may attend to; padding
(``attention_mask``, 1 = token, 0 = padding) is combined with it by the stack.

- ``causal``: key position <= query position (GPT).
- ``bidirectional``: every key (BERT, the T5 encoder); only padding is masked.
- ``prefix``: bidirectional over the first ``prefix_len`` positions, causal after (Raffel et al.
  2020's prefix LM; UniLM).
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from zoo.config import ModelConfig
from zoo.registry import MASK


class Mask:
    """Class flags say what the mask is; forms and the stack ask them instead of comparing names."""

    causal: ClassVar[bool] = False  # no query sees a key after it (relative position buckets look one way)
    kernel_causal: ClassVar[bool] = False  # exactly the lower triangle: kernels' is_causal can do it
    bidirectional: ClassVar[bool] = False  # every query sees every key: nothing is left to predict
    needs_prefix_len: ClassVar[bool] = False  # forward (and generation) must pass prefix_len

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Raise ConfigError for settings this mask cannot work with (ModelConfig.validate calls it)."""

    def allowed(self, q_pos: Tensor, k_pos: Tensor, prefix_len: int | Tensor | None = None) -> Tensor | None:
        """A boolean (Tq, Tk) or (B, 1, Tq, Tk) tensor, True where attention is allowed; None: all."""
        return None


@MASK.register("bidirectional")
class Bidirectional(Mask):
    bidirectional = True


@MASK.register("causal")
class Causal(Mask):
    causal = True
    kernel_causal = True

    def allowed(self, q_pos: Tensor, k_pos: Tensor, prefix_len: int | Tensor | None = None) -> Tensor:
        return k_pos[None, :] <= q_pos[:, None]  # (Tq, Tk)


@MASK.register("prefix")
class Prefix(Mask):
    # the prefix sees its own future, so relative position buckets must be bidirectional
    causal = False
    needs_prefix_len = True

    def allowed(self, q_pos: Tensor, k_pos: Tensor, prefix_len: int | Tensor | None = None) -> Tensor:
        if prefix_len is None:
            raise ValueError("mask='prefix' needs prefix_len (an int, or a (B,) tensor) in forward")
        causal = k_pos[None, :] <= q_pos[:, None]  # (Tq, Tk)
        if isinstance(prefix_len, Tensor) and prefix_len.dim() == 1:
            in_prefix = k_pos[None, :] < prefix_len[:, None]  # (B, Tk)
            return causal[None, None] | in_prefix[:, None, None, :]  # (B, 1, Tq, Tk)
        return causal | (k_pos < prefix_len)[None, :]
