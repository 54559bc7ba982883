"""YaRN (Peng et al. 2023, https://arxiv.org/abs/2309.00071) as ``rope_scaling=yarn`` (issue 23,
item 1): its frequencies and attention factor equal transformers' yarn, it is plain RoPE at factor 1,
scores still depend on m - n only, HF folders with yarn read and write back with the same logits,
and every missing or impossible setting is refused in one line."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_config

import zoo
from zoo.position import RoPE, apply_rotary

transformers = pytest.importorskip("transformers")

# (head_dim, original context, factor, base): ramps clamped at pair 0, ramps inside the pairs, factor 1
SETTINGS = [(16, 32, 4.0, 10000.0), (32, 2048, 4.0, 10000.0), (64, 4096, 8.0, 500000.0), (16, 64, 1.0, 10000.0)]


def _hf_rotary(head_dim: int, original: int, factor: float, base: float) -> torch.nn.Module:
    """transformers' Llama rotary embedding for yarn with these settings (4 heads of ``head_dim``)."""
    config = transformers.LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        max_position_embeddings=int(original * factor),
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": base,
            "factor": factor,
            "original_max_position_embeddings": original,
        },
    )
    return transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)


# ---- the rotation ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("head_dim", "original", "factor", "base"), SETTINGS)
def test_yarn_frequencies_and_attention_factor_equal_transformers(head_dim, original, factor, base):
    hf = _hf_rotary(head_dim, original, factor, base)
    rope = RoPE(head_dim, base, "yarn", factor, original)
    torch.testing.assert_close(rope.inv_freq(), hf.inv_freq, rtol=1e-6, atol=0)
    assert rope.scaling.attention_factor == pytest.approx(hf.attention_scaling, rel=1e-12)
    positions = torch.arange(256)  # angles up to 256 rad: float32 keeps them to ~3e-5
    cos, sin = rope.rotary(positions)
    hf_cos, hf_sin = hf(torch.zeros(1), positions[None])
    torch.testing.assert_close(cos, hf_cos[0], rtol=1e-5, atol=5e-5)
    torch.testing.assert_close(sin, hf_sin[0], rtol=1e-5, atol=5e-5)


def test_yarn_keeps_fast_pairs_interpolates_slow_ones_and_ramps_between():
    """hd=32, L=2048: pair i turns L * base^(-2i/hd) / (2 pi) times over L; > 32 turns (i <= 4) keep
    their frequency, < 1 turn (i >= 11 after rounding the bounds out) are divided by the factor."""
    plain, yarn = RoPE(32).inv_freq(), RoPE(32, scaling="yarn", factor=4.0, original_max_len=2048).inv_freq()
    turns = 2048 * plain / (2 * math.pi)
    assert (turns[:5] > 32).all() and (turns[11:] < 1).all()
    torch.testing.assert_close(yarn[:5], plain[:5], rtol=1e-6, atol=0)
    torch.testing.assert_close(yarn[11:], plain[11:] / 4, rtol=1e-6, atol=0)
    ratio = yarn[5:11] / plain[5:11]
    assert ((ratio < 1) & (ratio > 0.25)).all() and (ratio.diff() < 0).all()  # the ramp, monotone


def test_yarn_at_factor_one_is_plain_rope():
    positions = torch.tensor([[0, 5, 17, 63], [3, 4, 5, 6]])
    plain, yarn = (
        RoPE(16).rotary(positions),
        RoPE(16, scaling="yarn", factor=1.0, original_max_len=32).rotary(positions),
    )
    for a, b in zip(plain, yarn, strict=True):
        assert torch.equal(a, b)


def test_yarn_scores_depend_on_m_minus_n_and_scale_by_the_squared_attention_factor():
    rope = RoPE(16, scaling="yarn", factor=4.0, original_max_len=32)
    mscale = 0.1 * math.log(4.0) + 1
    q, k = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16, dtype=torch.float64)

    def score(m: int, n: int) -> float:
        qm = apply_rotary(q, *rope.rotary(torch.tensor([m])))
        kn = apply_rotary(k, *rope.rotary(torch.tensor([n])))
        return (qm * kn).sum().item()

    for m, n in ((7, 3), (2, 9), (40, 40), (100, 1)):
        assert score(m, n) == pytest.approx(score(m + 57, n + 57), rel=1e-5, abs=1e-5)
    assert score(0, 0) == pytest.approx(mscale**2 * (q * k).sum().item(), rel=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), rel=1e-3)  # positions do matter


# ---- HF folders -----------------------------------------------------------------------------------
def _hf_llama(cls_name: str, seed: int = 0) -> torch.nn.Module:
    config_cls = transformers.Qwen2Config if cls_name.startswith("Qwen2") else transformers.LlamaConfig
    config = config_cls(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        vocab_size=100,
        max_position_embeddings=64,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 500.0,
            "factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    )
    torch.manual_seed(seed)
    return getattr(transformers, cls_name)(config).eval()


def _ids() -> torch.Tensor:
    return torch.randint(3, 100, (2, 40), generator=torch.Generator().manual_seed(1))  # past the original 16


@pytest.mark.parametrize("cls_name", ["LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_a_yarn_folder_reads_in_zoo_with_transformers_logits(cls_name, tmp_path):
    hf = _hf_llama(cls_name)
    hf.save_pretrained(tmp_path / "hf")
    model = zoo.from_hf(tmp_path / "hf").eval()
    cfg = model.config
    assert (cfg.rope_scaling, cfg.rope_scaling_factor, cfg.rope_original_max_len, cfg.rope_base) == (
        "yarn",
        4.0,
        16,
        500.0,
    )
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)


def test_a_zoo_yarn_model_exports_to_a_folder_transformers_reads_with_the_same_logits(tmp_path):
    model = zoo.create_model(
        "llama-tiny", seed=0, rope_scaling="yarn", rope_scaling_factor=4.0, rope_original_max_len=16, max_seq_len=64
    ).eval()
    zoo.hf.to_hf(model, tmp_path / "out")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    params = hf.config.rope_parameters
    assert (params["rope_type"], params["factor"], params["original_max_position_embeddings"]) == ("yarn", 4.0, 16)
    ids = torch.randint(3, 1024, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-4, rtol=1e-4)
    again = zoo.from_hf(tmp_path / "out").config
    assert {k: getattr(again, k) for k in ("rope_scaling", "rope_scaling_factor", "rope_original_max_len")} == {
        "rope_scaling": "yarn",
        "rope_scaling_factor": 4.0,
        "rope_original_max_len": 16,
    }


# ---- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(rope_scaling="yarn", rope_scaling_factor=4.0), "rope_scaling='yarn' needs rope_original_max_len"),
        (
            dict(rope_scaling="yarn", rope_scaling_factor=0.5, rope_original_max_len=16),
            "rope_scaling_factor=0.5 must be >= 1",
        ),
        (dict(rope_scaling="yarn", rope_original_max_len=0), "rope_original_max_len=0 must be a positive integer"),
        (dict(rope_scaling="yarm"), "rope_scaling='yarm' is not a registered rope_scaling.*Did you mean 'yarn'"),
        (
            dict(position="alibi", rope_original_max_len=16),
            "rope_original_max_len=16 is read by position=rope only; position=alibi ignores it",
        ),
    ],
)
def test_impossible_yarn_settings_are_refused_in_one_line(overrides, message):
    with pytest.raises(zoo.ConfigError, match=message) as refused:
        zoo.build_model(tiny_config(**overrides))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"beta_fast": 16}, "beta_fast=16 is not supported: zoo's yarn has beta_fast=32"),
        ({"beta_slow": 2.0}, "beta_slow=2.0 is not supported"),
        ({"truncate": False}, "truncate=False is not supported"),
        ({"attention_factor": 1.0}, "attention_factor=1.0 is not supported"),
        ({"mscale": 0.707, "mscale_all_dim": 1.0}, "mscale=0.707 with mscale_all_dim=1.0"),
    ],
)
def test_hf_yarn_parameters_zoo_does_not_compute_are_refused(extra, message):
    params = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 16, **extra}
    config = transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=4, max_position_embeddings=64, rope_parameters=params
    )
    with pytest.raises(ValueError, match=message) as refused:
        zoo.from_hf_config(config)
    assert "\n" not in str(refused.value)


def test_hf_yarn_with_its_own_attention_factor_spelled_out_is_read():
    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32.0}
    params["attention_factor"] = 0.1 * math.log(4.0) + 1
    config = transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=4, max_position_embeddings=64, rope_parameters=params
    )
    cfg = zoo.from_hf_config(config)
    assert (cfg.rope_scaling, cfg.rope_scaling_factor, cfg.rope_original_max_len) == ("yarn", 4.0, 16)


def test_gguf_export_refuses_yarn_in_one_line_and_writes_nothing(tmp_path):
    pytest.importorskip("gguf")
    model = zoo.create_model(
        "llama-tiny", seed=0, rope_scaling="yarn", rope_scaling_factor=4.0, rope_original_max_len=16
    )
    with pytest.raises(zoo.ConfigError, match=r"rope_scaling=yarn \(zoo's GGUF files carry none or linear\)") as no:
        zoo.to_gguf(model, tmp_path / "m.gguf")
    assert "\n" not in str(no.value)
    assert list(tmp_path.iterdir()) == []
