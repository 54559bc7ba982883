"""Registries, user components, presets and their published parameter counts."""

import pytest
import torch
from torch import nn

import zoo
from zoo.registry import NORM, Registry

PUBLISHED = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "gpt3-175b": 174_604_259_328,
    "qwen2.5-72b": 72_706_203_648,
    "bert-base": 109_482_240,
    "bert-large": 335_141_888,
    "t5-small": 60_506_624,
    "t5-base": 222_903_552,
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_preset_parameter_counts_equal_published_figures(name):
    with torch.device("meta"):
        model = zoo.create_model(name)
    assert zoo.count_parameters(model) == PUBLISHED[name]


def test_list_models_filters_with_fnmatch():
    assert zoo.list_models("llama*") == ["llama-tiny", "llama2-13b", "llama2-70b", "llama2-7b"]
    assert set(PUBLISHED) | {"gpt-tiny", "bert-tiny", "t5-tiny"} <= set(zoo.list_models())


@pytest.mark.parametrize("name", ["gpt-tiny", "bert-tiny", "t5-tiny", "llama-tiny"])
def test_tiny_presets_train_a_step(name):
    model = zoo.create_model(name, seed=0).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = model(**model.example_inputs(model.config, length=16))
    out.float().square().mean().backward()
    opt.step()
    assert zoo.count_parameters(model) < 3_000_000


def test_create_model_applies_overrides():
    model = zoo.create_model(
        "gpt2", n_layers=4, position="alibi", vocab_size=101, d_model=64, n_heads=4, eos_token_id=100, pad_token_id=0
    )
    assert len(model.decoder.blocks) == 4 and type(model.decoder.position).__name__ == "ALiBi"
    with pytest.raises(zoo.ConfigError, match="'gpt5' is not a registered model.*Did you mean"):
        zoo.create_model("gpt5")


def test_list_components_names_every_family():
    components = zoo.list_components()
    assert components["position"] == ["alibi", "learned", "none", "rope", "sinusoidal", "t5_relative"]
    assert components["norm"] == ["dyt", "layernorm", "rmsnorm", "rmsnorm_1p"]
    assert components["ffn"] == ["geglu", "gelu", "moe", "relu", "relu2", "swiglu"]
    assert components["mask"] == ["bidirectional", "causal", "document", "prefix", "sliding_window"]
    assert components["arch"] == ["decoder", "encoder", "encoder_decoder"]
    assert {"pre", "post"} <= set(components["norm_placement"])
    assert components["attention"] == ["auto", "flex", "math", "sdpa"]


def test_duplicate_names_are_errors():
    with pytest.raises(ValueError, match="already registered"):
        NORM.register("rmsnorm")(object)


def test_a_family_registers_subclasses_of_its_base_only():
    from zoo.registry import REGISTRIES, Component

    for family, registry in REGISTRIES.items():
        assert registry.base is not None and issubclass(registry.base, Component), family
        for name in registry.names():
            assert issubclass(registry.get(name), registry.base), (family, name)
    with pytest.raises(TypeError, match="not a subclass of zoo.norm.Norm"):
        NORM.register("plain_module_test")(nn.Module)
    with pytest.raises(TypeError, match="not a subclass of zoo.sublayer.FeedForward"):
        zoo.register("ffn", "a_function_test")(lambda cfg: None)
    assert "plain_module_test" not in NORM and "a_function_test" not in zoo.registry.FFN


def test_a_user_component_plugs_in_by_name():
    registry = zoo.registry.NORM

    @zoo.register("norm", "scalenorm_test")
    class ScaleNorm(zoo.norm.Norm):  # Nguyen & Salazar 2019: g * x / ||x||
        def __init__(self, dim: int, eps: float) -> None:
            super().__init__()
            self.g = nn.Parameter(torch.tensor(dim**0.5))
            self.eps = eps

        @classmethod
        def from_config(cls, cfg, dim):
            return cls(dim, cfg.norm_eps)

        def forward(self, x):
            return self.g * x / x.norm(dim=-1, keepdim=True).clamp(min=self.eps)

    try:
        model = zoo.create_model("gpt-tiny", norm="scalenorm_test")
        assert isinstance(model.decoder.final_norm, ScaleNorm)
        assert torch.isfinite(model(torch.randint(0, 1024, (1, 4)))).all()
    finally:
        registry.unregister("scalenorm_test")
    assert "scalenorm_test" not in zoo.list_components()["norm"]


def test_unknown_registry_lookup_lists_names():
    reg = Registry("colour")
    reg.register("red")(1)
    reg.register("green")(2)
    with pytest.raises(
        zoo.ConfigError,
        match=r"colour='gren' is not a registered colour; valid names: green, red\. "
        r"Did you mean 'green'\?",
    ):
        reg.get("gren")


def test_unregister_removes_a_name_and_refuses_an_unknown_one():
    reg = Registry("colour")
    reg.register("red")(1)
    assert reg.unregister("red") == 1 and "red" not in reg
    reg.register("red")(2)  # the name is free again
    with pytest.raises(zoo.ConfigError, match=r"colour='blue' is not a registered colour; valid names: red"):
        reg.unregister("blue")
