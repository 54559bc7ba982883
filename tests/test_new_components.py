"""Issue 24: the squared-ReLU FFN (``ffn=relu2``, So et al. 2021, https://arxiv.org/abs/2109.08668)
and Dynamic Tanh (``norm=dyt``, Zhu et al. 2025, https://arxiv.org/abs/2503.10622). Each against its
formula written out by hand; the registry-wide walks (test_models, test_component_fields...) cover
building them in every composition."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config, tiny_model
from hydra import compose, initialize_config_dir

import zoo
from tasks.cli.schemas import conf_dir, model_config
from zoo.norm import DyT


# ---- relu2 ----------------------------------------------------------------------------------------
def test_relu2_is_relu_squared_of_the_first_projection_then_the_second():
    ffn = zoo.registry.FFN.get("relu2").from_config(tiny_config(ffn="relu2", bias=True))
    torch.nn.init.normal_(ffn.fc.bias)  # biases start at zero: make them count
    torch.nn.init.normal_(ffn.proj.bias)
    x = torch.randn(2, 5, 32)
    hidden = x @ ffn.fc.weight.T + ffn.fc.bias  # (2, 5, d_ff)
    expected = torch.where(hidden > 0, hidden * hidden, 0.0) @ ffn.proj.weight.T + ffn.proj.bias
    torch.testing.assert_close(ffn(x), expected)
    assert (hidden < 0).any() and (hidden > 1).any()  # both sides of the kink, and where squaring shows


def test_relu2_is_a_plain_mlp_as_wide_as_relu():
    cfg = tiny_config(ffn="relu2", d_ff=None, d_model=64)
    assert cfg.resolved_d_ff == tiny_config(ffn="relu", d_ff=None, d_model=64).resolved_d_ff == 256
    ffn = zoo.registry.FFN.get("relu2").from_config(cfg)
    assert ffn.fc.weight.shape == (256, 64) and ffn.residual_projections() == [ffn.proj]
    assert ffn.fused_segments() == {}


# ---- dyt ------------------------------------------------------------------------------------------
def _perturbed_dyt(dim: int = 32) -> DyT:
    norm = DyT.from_config(tiny_config(norm="dyt", bias=True, dyt_alpha=0.7), dim)
    with torch.no_grad():
        for p in norm.parameters():
            p.normal_()
    return norm


def test_dyt_is_weight_times_tanh_of_alpha_x_plus_bias():
    norm = _perturbed_dyt()
    x = 3 * torch.randn(2, 5, 32)
    alpha = norm.alpha.item()
    expected = norm.weight * ((torch.exp(2 * alpha * x) - 1) / (torch.exp(2 * alpha * x) + 1)) + norm.bias
    torch.testing.assert_close(norm(x), expected)


def test_dyt_alpha_is_one_learnable_scalar():
    norm = _perturbed_dyt()
    assert norm.alpha.shape == (1,) and norm.alpha.requires_grad
    norm(torch.randn(2, 5, 32)).square().sum().backward()
    assert norm.alpha.grad is not None and norm.alpha.grad.abs().item() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in (norm.weight, norm.bias))


def test_dyt_starts_as_the_paper_says_and_init_weights_resets_it():
    model = tiny_model(norm="dyt", norm_placement="sandwich", bias=True, dyt_alpha=0.8)
    norms = [m for m in model.modules() if isinstance(m, DyT)]
    assert len(norms) == 2 * 4 + 1  # two per sublayer (sandwich), two sublayers per block; the final norm

    def assert_initial() -> None:
        for norm in norms:
            assert norm.alpha.item() == pytest.approx(0.8)
            assert torch.equal(norm.weight, torch.ones(32)) and torch.equal(norm.bias, torch.zeros(32))

    assert_initial()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    model.init_weights()
    assert_initial()
    assert zoo.ModelConfig().dyt_alpha == 0.5  # the paper's default


def test_dyt_bias_follows_the_config():
    norm = DyT.from_config(tiny_config(norm="dyt", bias=False), 32)
    assert norm.bias is None and [n for n, _ in norm.named_parameters()] == ["alpha", "weight"]
    x = torch.randn(4, 32)
    torch.testing.assert_close(norm(x), torch.tanh(0.5 * x))


def test_dyt_alpha_is_refused_unless_norm_is_dyt_or_not_positive():
    with pytest.raises(zoo.ConfigError, match=r"^dyt_alpha=0.8 is read by norm=dyt only; norm=rmsnorm ignores"):
        tiny_config(norm="rmsnorm", dyt_alpha=0.8).validate()
    with pytest.raises(zoo.ConfigError, match=r"^dyt_alpha=0.0 must be > 0"):
        tiny_config(norm="dyt", dyt_alpha=0.0).validate()


@pytest.mark.parametrize("placement", zoo.registry.NORM_PLACEMENT.names())
def test_dyt_takes_every_placement_and_no_other_norm_is_left(placement):
    model = tiny_model(norm="dyt", norm_placement=placement)
    leaf_norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm | zoo.norm.RMSNorm)]
    assert not leaf_norms and any(isinstance(m, DyT) for m in model.modules())
    logits = model(torch.randint(0, 61, (2, 7)))
    assert logits.shape == (2, 7, 61) and torch.isfinite(logits).all()


# ---- configs and formats --------------------------------------------------------------------------
def test_the_config_groups_choose_them():
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("train", overrides=["model/ffn=relu2", "model/norm=dyt", "model.dyt_alpha=0.8"])
    model = model_config(cfg.model).validate()
    assert (model.ffn, model.norm, model.dyt_alpha) == ("relu2", "dyt", 0.8)


def test_a_saved_model_loads_back_with_its_alpha(tmp_path):
    model = tiny_model(ffn="relu2", norm="dyt", dyt_alpha=0.8)
    with torch.no_grad():
        model.decoder.final_norm.alpha.fill_(1.25)  # as if trained
    zoo.save_pretrained(model, tmp_path)
    loaded = zoo.load_pretrained(tmp_path).eval()
    assert loaded.config.dyt_alpha == 0.8 and loaded.decoder.final_norm.alpha.item() == 1.25
    x = torch.randint(0, 61, (1, 6))
    torch.testing.assert_close(loaded(x), model(x))


@pytest.mark.parametrize("choice", [dict(ffn="relu2"), dict(norm="dyt")])
@pytest.mark.parametrize("preset", ["gpt-tiny", "llama-tiny", "bert-tiny", "t5-tiny"])
def test_no_hf_family_claims_them(preset, choice):
    name, value = next(iter(choice.items()))
    with pytest.raises(zoo.ConfigError) as error:
        zoo.hf_exportable(zoo.get_config(preset, **choice))
    assert "\n" not in str(error.value) and f"{name}={value}" in str(error.value)
