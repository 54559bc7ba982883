"""Validation: every impossible setting fails at build time with the field and the fix."""

import pytest
import torch
from conftest import tiny_config

import zoo
from zoo.position import NoPosition
from zoo.registry import POSITION


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(d_model=30, n_heads=4), r"n_heads=4 does not divide d_model=30"),
        (dict(n_kv_heads=3), r"n_kv_heads=3 does not divide n_heads=4"),
        (dict(position="rope", head_dim=7, n_heads=4), r"head_dim=7 must be even"),
        (dict(position="learned", max_seq_len=None), r"learned.*needs max_seq_len"),
        (dict(arch="encoder_decoder", mask="causal"), r"encoder_decoder's encoder cannot be causal"),
        (dict(arch="decoder", mask="bidirectional"), r"decoder see the tokens it must predict"),
        (dict(n_layers=0), r"n_layers=0 must be a positive integer"),
        (dict(d_model=-8), r"d_model=-8 must be a positive integer"),
        (dict(vocab_size=10.5), r"vocab_size=10.5 must be a positive integer"),
        (dict(dropout=1.0), r"dropout=1.0 must lie in \[0, 1\)"),
        (dict(dropout=-0.1), r"dropout=-0.1 must lie in \[0, 1\)"),
        (dict(attn_dropout=1.5), r"attn_dropout=1.5"),
        (dict(position="rop"), r"position='rop' is not a registered position.*Did you mean 'rope'"),
        (dict(norm="rms"), r"norm='rms'.*valid names: dyt, layernorm, rmsnorm"),
        (dict(ffn="swish"), r"ffn='swish'.*Did you mean 'swiglu'"),
        (dict(arch="gpt"), r"arch='gpt'.*decoder, encoder, encoder_decoder"),
        (dict(mask="casual"), r"mask='casual'.*Did you mean 'causal'"),
        (dict(norm_placement="pre_norm"), r"norm_placement='pre_norm'.*Did you mean 'pre'"),
        (dict(attention="flash"), r"attention='flash'.*math, sdpa"),
        (dict(pooler=True), r"pooler=True is an encoder head"),
        (dict(arch="encoder", n_encoder_layers=2), r"n_encoder_layers/n_decoder_layers are for arch='encoder_decoder'"),
        (dict(type_vocab_size=2), r"type_vocab_size .* is for arch='encoder'"),
        (dict(rope_scaling="longrope"), r"rope_scaling='longrope' is not a registered rope_scaling"),
        (dict(rope_scaling="linear", rope_scaling_factor=0.5), r"rope_scaling_factor=0.5 must be >= 1"),
        (dict(gelu_approximate="erf"), r"gelu_approximate='erf'"),
        (dict(position="t5_relative", rel_buckets=7), r"rel_buckets=7 must be even"),
        (dict(position="t5_relative", rel_max_distance=8, rel_buckets=32), r"rel_max_distance=8 must exceed"),
        (dict(eos_token_id=61), r"eos_token_id=61 must be a token id in \[0, vocab_size=61\)"),
        (dict(norm_eps=0.0), r"norm_eps=0.0 must be > 0"),
    ],
)
def test_invalid_configs_raise_config_error_naming_the_field(overrides, message):
    with pytest.raises(zoo.ConfigError, match=message):
        zoo.build_model(tiny_config(**overrides))


def test_unknown_fields_are_rejected_with_the_closest_name():
    with pytest.raises(zoo.ConfigError, match=r"'n_head' is not a ModelConfig field. Did you mean 'n_heads'"):
        zoo.create_model("gpt-tiny", n_head=4)
    with pytest.raises(zoo.ConfigError, match="'hidden' is not a ModelConfig field"):
        zoo.ModelConfig.from_dict({"hidden": 3})


def test_validate_asks_each_chosen_component_to_check_its_own_settings():
    @zoo.register("position", "even_layers_test")
    class EvenLayers(NoPosition):
        @classmethod
        def check(cls, cfg):
            if cfg.n_layers % 2:
                raise zoo.ConfigError(f"position={cfg.position!r} needs an even n_layers, not {cfg.n_layers}")

    try:
        zoo.build_model(tiny_config(position="even_layers_test", n_layers=2))
        with pytest.raises(zoo.ConfigError, match="position='even_layers_test' needs an even n_layers, not 3"):
            tiny_config(position="even_layers_test", n_layers=3).validate()
        tiny_config(position="none", n_layers=3).validate()  # the rule is the component's, not the config's
    finally:
        POSITION.unregister("even_layers_test")


def test_resolved_values_fill_in_the_fields_left_as_none():
    cfg = tiny_config(
        d_model=32,
        n_heads=4,
        head_dim=None,
        n_kv_heads=None,
        d_ff=None,
        ffn="gelu",
        mask=None,
        arch="encoder_decoder",
        n_decoder_layers=1,
    )
    assert (cfg.resolved_head_dim, cfg.resolved_n_kv_heads, cfg.resolved_d_ff) == (8, 4, 128)
    assert (cfg.resolved_n_encoder_layers, cfg.resolved_n_decoder_layers) == (2, 1)
    assert cfg.resolved_mask == "bidirectional" and tiny_config(arch="decoder").resolved_mask == "causal"
    assert (cfg.head_dim, cfg.n_kv_heads, cfg.d_ff, cfg.mask) == (None, None, None, None)  # fields untouched
    cfg = tiny_config(head_dim=6, n_kv_heads=2, d_ff=40, mask="prefix")
    resolved = (cfg.resolved_head_dim, cfg.resolved_n_kv_heads, cfg.resolved_d_ff, cfg.resolved_mask)
    assert resolved == (6, 2, 40, "prefix")


def test_config_round_trips_through_plain_data():
    cfg = zoo.get_config("t5-small", n_layers=2)
    assert zoo.ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.n_layers == 2 and zoo.get_config("t5-small").n_layers == 6  # presets are not mutated


def test_head_dim_decouples_heads_from_width():
    model = zoo.build_model(tiny_config(d_model=30, n_heads=4, head_dim=8))
    assert model(torch.randint(0, 61, (1, 3))).shape == (1, 3, 61)
