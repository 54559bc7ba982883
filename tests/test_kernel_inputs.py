"""The one place that turns a mask and a position into a kernel's inputs (zoo/kernel_inputs.py), asked
directly, without a model: for every registered mask (x the window it may read) x position x where its
stack sits, on a padded batch of two documents, the dense answer and the flex answer see the same keys
with the same biases."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import tiny_config
from torch import Tensor

from zoo.attention import AttentionInputs
from zoo.kernel_inputs import keep_mask, self_attention_inputs
from zoo.registry import MASK, POSITION
from zoo.stack_role import LONE, StackRole

B, T = 2, 8
ROLES = {"decoder": StackRole(causal=True), "encoder": LONE}


def _cases() -> list:
    cases = []
    for mask, settings, position, form in itertools.product(MASK, ({}, {"window": 3}), POSITION, ROLES):
        cfg = tiny_config(arch=form, mask=mask, position=position, **settings)
        try:
            cfg.validate()
        except Exception:  # noqa: BLE001 - a refused combination (test_rules_once judges those)
            continue
        cases.append(pytest.param(cfg, ROLES[form], id=f"{mask}-{'w3-' if settings else ''}{position}-{form}"))
    return cases


def _dense(inputs: AttentionInputs, heads: int) -> Tensor:
    """The (B, H, T, T) bias a dense answer means: 0 where a key is seen, -inf where it is not, plus any bias."""
    if inputs.is_causal:
        seen = torch.ones(T, T, dtype=torch.bool).tril()
        return torch.zeros(T, T).masked_fill(~seen, float("-inf")).expand(B, heads, T, T)
    if inputs.mask is None:
        return torch.zeros(B, heads, T, T)
    if inputs.mask.dtype == torch.bool:
        return torch.zeros(inputs.mask.shape).masked_fill(~inputs.mask, float("-inf")).expand(B, heads, T, T)
    return inputs.mask.float().expand(B, heads, T, T)


def _flex(inputs: AttentionInputs, heads: int) -> Tensor:
    """The (B, H, T, T) bias flex_attention computes from the FlexMods, every (b, h, q, kv) at once."""
    assert inputs.flex is not None
    b, h = torch.arange(B)[:, None, None, None], torch.arange(heads)[None, :, None, None]
    q, kv = torch.arange(T)[None, None, :, None], torch.arange(T)[None, None, None, :]
    bias = torch.zeros(B, heads, T, T)
    if inputs.flex.score_mod is not None:
        bias = inputs.flex.score_mod(bias, b, h, q, kv).expand(B, heads, T, T).float()
    if inputs.flex.block_mask is not None:
        seen = inputs.flex.block_mask.mask_mod(b, h, q, kv).expand(B, heads, T, T)
        bias = bias.masked_fill(~seen, float("-inf"))
    return bias


@pytest.mark.parametrize(("cfg", "role"), _cases())
def test_dense_and_flex_inputs_see_the_same_keys_with_the_same_biases(cfg, role):
    mask = MASK.get(cfg.resolved_mask).from_config(cfg, role=role)
    position = POSITION.get(cfg.position).from_config(cfg, causal=mask.causal)
    padding = torch.ones(B, T, dtype=torch.long)
    padding[1, :2] = 0  # the second row left-padded
    documents = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1, 1]]) if mask.documents else None
    prefix = torch.tensor([3, 5]) if mask.needs_prefix_len else None
    asked = dict(keep=keep_mask(padding), prefix_len=prefix, document_ids=documents, batch=B)
    q_pos = torch.arange(T)
    dense = self_attention_inputs(mask, position, q_pos, flex=lambda dense: False, **asked)
    flex = self_attention_inputs(mask, position, q_pos, flex=lambda dense: True, **asked)
    assert dense.flex is None and flex.flex is not None
    want, got = _dense(dense, cfg.n_heads), _flex(flex, cfg.n_heads)
    assert torch.equal(torch.isinf(want), torch.isinf(got))
    assert torch.allclose(want.nan_to_num(neginf=0.0), got.nan_to_num(neginf=0.0), atol=1e-5)


def test_a_plain_causal_forward_needs_no_mask_tensor():
    cfg = tiny_config(arch="decoder")
    mask = MASK.get("causal").from_config(cfg, role=ROLES["decoder"])
    position = POSITION.get("rope").from_config(cfg, causal=True)
    assert self_attention_inputs(mask, position, torch.arange(T)).is_causal
    one = self_attention_inputs(mask, position, torch.arange(5, 6), past=5)
    assert (one.is_causal, one.mask, one.flex) == (False, None, None)  # one new query sees every key
