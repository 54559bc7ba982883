"""How a rule is written once and read by every kernel: the mods' types and the grids that turn a mod
into a dense tensor.

A mask's rule is flex_attention's ``mask_mod`` (b, h, q_idx, kv_idx) -> bool and a position bias's
its ``score_mod`` (score, b, h, q_idx, kv_idx) -> score. flex evaluates them inside its kernel; sdpa
and math read the same functions evaluated on broadcast index grids. Masks (zoo.mask) and positions
(zoo.position) both write their rules with these helpers, so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]  # (b, h, q_idx, kv_idx) -> bool, True = attend


def index_grids(
    q_pos: Tensor, k_pos: Tensor, *, rows: int | None = None, heads: int | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(b, h, q_idx, kv_idx) that broadcast to (B, H, Tq, Tk), flex_attention's layout, so that a mod
    evaluated on them yields its whole dense tensor at once: b is (B, 1, 1, 1) and h (H, 1, 1), or a
    0-d zero where ``rows`` / ``heads`` is None (the result then has no such dimension); q_idx is
    (Tq, 1), kv_idx (1, Tk)."""
    device = q_pos.device
    zero = torch.zeros((), dtype=torch.long, device=device)
    b = zero if rows is None else torch.arange(rows, device=device).view(rows, 1, 1, 1)
    h = zero if heads is None else torch.arange(heads, device=device).view(heads, 1, 1)
    return b, h, q_pos[:, None], k_pos[None, :]


def dense_mask(mask_mod: MaskMod, q_pos: Tensor, k_pos: Tensor, *, rows: int | None = None) -> Tensor:
    """``mask_mod`` over queries at ``q_pos`` and keys at ``k_pos``: a boolean (Tq, Tk) tensor, or
    (B, 1, Tq, Tk) where the mod reads b of ``rows`` = B rows."""
    return over_keys(mask_mod(*index_grids(q_pos, k_pos, rows=rows)), q_pos.shape[0], k_pos.shape[0])


def over_keys(t: Tensor, n_queries: int, n_keys: int) -> Tensor:
    """``t`` with its last two dimensions (Tq, Tk), broadcast there (a view) if a mod ignored q or kv."""
    if t.shape[-2:] == (n_queries, n_keys):
        return t
    return t.expand(*t.shape[:-2], n_queries, n_keys) if t.dim() >= 2 else t.expand(n_queries, n_keys)


def refuse_half_rules(cls: type, pairs: tuple[tuple[str, str], ...], base: type) -> None:
    """Raise TypeError if ``cls`` takes a dense rule and its mod (each pair: (dense, mod)) from
    different classes: one half written and the other inherited or derived from ``base``, so that one
    kernel would compute what the other does not. A dense rule left to ``base`` is derived from the mod."""
    for dense, mod in pairs:
        owner = {name: next(c for c in cls.__mro__ if name in c.__dict__) for name in (dense, mod)}
        if owner[dense] is not base and owner[dense] is not owner[mod]:
            raise TypeError(
                f"{cls.__name__} takes {dense} from {owner[dense].__name__} but {mod} from {owner[mod].__name__}: "
                f"the dense kernels (math, sdpa) would read one rule and flex another. Write the rule once as "
                f"{mod} ({base.__name__} derives {dense} from it), or define both in one class (a dense fast path)"
            )


ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]  # (score, b, h, q_idx, kv_idx) -> score
