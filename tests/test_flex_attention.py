"""attention='flex' (torch.nn.attention.flex_attention) computes what the ``math`` reference does for
every position encoding and mask, with padding: masks reach it as block masks and ALiBi / T5 biases
as a score_mod. On the CPU torch runs flex_attention's forward only (eagerly; no backward), so these
tests compare forwards; the CUDA training path is measured by scripts/bench/flex.py."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config, tiny_model
from torch import Tensor

import zoo

POSITIONS = zoo.list_components()["position"]
B, T = 2, 9
# (arch, mask, extra config): every mask in the form it belongs to; bidirectional where the form allows
CASES = [
    ("decoder", "causal", {}),
    ("decoder", "prefix", {}),
    ("decoder", "sliding_window", {"window": 3}),
    ("decoder", "document", {}),
    ("encoder", "bidirectional", {}),
    ("encoder", "sliding_window", {"window": 3}),
    ("encoder_decoder", None, {}),
]


def _pair(**overrides) -> tuple[zoo.ZooModel, zoo.ZooModel]:
    """The same weights (one seed) with attention='flex' and attention='math'."""
    return tiny_model(attention="flex", **overrides), tiny_model(attention="math", **overrides)


def _inputs(arch: str, mask: str | None) -> dict[str, Tensor]:
    """Token ids with padding (left for a decoder, as generation pads; right for an encoder) and
    whatever the mask reads: per-row prefix lengths, or packed documents' ids."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 61, (B, T), generator=g)
    keep = torch.ones(B, T, dtype=torch.long)
    if arch == "decoder":
        keep[1, :3] = 0
    else:
        keep[1, -3:] = 0
    kwargs = {"attention_mask": keep}
    if mask == "prefix":
        kwargs["prefix_len"] = torch.tensor([4, 6])
    if mask == "document":
        kwargs = {"document_ids": torch.tensor([[0, 0, 0, 0, 1, 1, 1, 2, 2], [0, 0, 1, 1, 1, 1, 1, 1, 1]])}
    if arch == "encoder_decoder":
        kwargs["decoder_input_ids"] = torch.randint(1, 61, (B, 5), generator=g)
        kwargs["decoder_attention_mask"] = torch.tensor([[1] * 5, [1] * 3 + [0] * 2])
    return {"input_ids": ids, **kwargs}


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize(("arch", "mask", "extra"), CASES, ids=[f"{a}-{m}" for a, m, _ in CASES])
def test_flex_forward_equals_math(arch, mask, extra, position):
    overrides = dict(arch=arch, position=position, **extra)
    if mask is not None:
        overrides["mask"] = mask
    flex, math = _pair(**overrides)
    inputs = _inputs(arch, mask)
    with torch.no_grad():
        expected = math(**inputs)
        got = flex(**inputs)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_flex_without_padding_and_with_grouped_query_heads(position):
    """No mask tensor at all (the kernel's is_causal) and key/value heads shared by query heads."""
    flex, math = _pair(position=position, n_kv_heads=2)
    ids = torch.randint(1, 61, (B, T))
    with torch.no_grad():
        torch.testing.assert_close(flex(ids), math(ids), atol=1e-5, rtol=1e-5)


def test_flex_refuses_attention_dropout_when_the_model_is_composed():
    with pytest.raises(zoo.ConfigError, match="attn_dropout=0"):
        tiny_config(attention="flex", attn_dropout=0.1).validate()
    with pytest.raises(zoo.ConfigError, match="attn_dropout=0"):
        tiny_config(attention="flex", dropout=0.1).validate()  # attn_dropout=None follows dropout
    tiny_config(attention="flex", dropout=0.1, attn_dropout=0.0).validate()
    model = tiny_model(attention="flex").train()  # the kernel refuses it too, if asked past validate
    model.decoder.blocks[0].attn.dropout = 0.1
    with torch.no_grad(), pytest.raises(ValueError, match="attn_dropout=0"):
        model(torch.randint(1, 61, (1, 4)))
