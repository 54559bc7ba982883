"""Mixtral both ways (zoo/hf/mixtral.py): tiny random ``MixtralForCausalLM`` models read by
``zoo.from_hf`` from a loaded module (transformers 5's stacked experts) and from a saved folder (one
tensor per expert) give HF's logits (float32, atol 1e-5) and greedy tokens; zoo's own MoE models
written by ``zoo.to_hf`` load in transformers with every weight placed and compute the same; what
Mixtral cannot compute is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import zoo

transformers = pytest.importorskip("transformers")

from hf_tiny import NEW, VOCAB, _build, _tokens  # noqa: E402  (after the importorskip)


def _config(**kw) -> transformers.MixtralConfig:
    """hf_tiny's Llama sizes (64 wide, two layers, GQA 4:2, std 0.2) with four experts, two per token."""
    values = dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    return transformers.MixtralConfig(**{**values, **kw})


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _greedy(hf: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    hf.generation_config.eos_token_id = None  # all NEW steps, as zoo runs them with eos_token_id=None
    hf.generation_config.pad_token_id = 0
    with torch.no_grad():
        return hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW)


def _load(folder) -> torch.nn.Module:
    """The folder through transformers' Auto class, every weight placed (none missing, none left over)."""
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return hf.eval()


@pytest.fixture(scope="module")
def mixtral():
    return _build(transformers.MixtralForCausalLM, _config())


# ---- HF -> zoo -----------------------------------------------------------------------------------
def test_a_loaded_model_converts_to_the_same_logits(mixtral):
    model = zoo.from_hf(mixtral)
    cfg = model.config
    assert (cfg.ffn, cfg.n_experts, cfg.moe_top_k, cfg.moe_renormalize, cfg.moe_shared_expert) == (
        "moe",
        4,
        2,
        True,
        False,
    )
    assert (cfg.d_ff, cfg.resolved_n_kv_heads, cfg.mask, cfg.bias) == (96, 2, None, False)
    assert "mlp.experts.gate_up_proj" in "".join(n for n, _ in mixtral.named_parameters())  # the stacked layout
    ids = _tokens(2, 12)
    with torch.no_grad():
        _close(model(ids), mixtral(ids).logits)


def test_a_saved_folder_holds_one_tensor_per_expert_and_converts_to_the_same_tokens(mixtral, tmp_path):
    mixtral.save_pretrained(tmp_path)
    names = load_file(tmp_path / "model.safetensors").keys()
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in names
    model = zoo.from_hf(tmp_path)
    ids = _tokens(2, 12)
    with torch.no_grad():
        _close(model(ids), mixtral(ids).logits)
    prompt = _tokens(1, 7, seed=4)
    got = model.generate(prompt, max_new_tokens=NEW, eos_token_id=None)
    assert got.tolist() == _greedy(mixtral, prompt).tolist()
    assert len(set(got[0, 7:].tolist())) > 1  # not one token repeated: the comparison can fail


@pytest.mark.parametrize(
    "settings", [dict(num_experts_per_tok=1), dict(num_experts_per_tok=4), dict(sliding_window=4), dict(head_dim=32)]
)
def test_other_settings_convert_to_the_same_logits(settings):
    hf = _build(transformers.MixtralForCausalLM, _config(**settings))
    model = zoo.from_hf(hf)
    if "sliding_window" in settings:
        assert (model.config.mask, model.config.window) == ("sliding_window", 4)
    ids = _tokens(2, 12)
    with torch.no_grad():
        _close(model(ids), hf(ids).logits)


def test_the_balancing_coefficient_converts_so_that_one_layer_gives_hfs_loss():
    """One layer: HF's pooled loss is that layer's, with its assignment fractions summing to top_k."""
    hf = _build(transformers.MixtralForCausalLM, _config(num_hidden_layers=1, output_router_logits=True))
    hf.config.router_aux_loss_coef = 0.05
    model = zoo.from_hf(hf)
    assert model.config.moe_aux_loss_coef == pytest.approx(0.05 * 2 / 1)
    assert model.config.moe_z_loss_coef == 0.0  # Mixtral has none
    ids = _tokens(2, 12)
    with torch.no_grad():
        expected = 0.05 * hf(ids).aux_loss
        model(ids)
    assert set(model.aux_losses()) == {"moe_aux_loss"}
    _close(model.aux_losses()["moe_aux_loss"], expected)


def test_the_balancing_coefficient_reads_per_layer_and_writes_back():
    cfg = zoo.from_hf_config(_config(num_hidden_layers=4, output_router_logits=True, router_aux_loss_coef=0.02))
    assert cfg.moe_aux_loss_coef == pytest.approx(0.02 * 2 / 4)
    written = zoo.hf.FAMILIES.get("mixtral").write_config(cfg)
    assert written["router_aux_loss_coef"] == pytest.approx(0.02) and written["output_router_logits"] is True
    off = zoo.from_hf_config(_config(router_aux_loss_coef=0.02))  # without output_router_logits HF does not balance
    assert off.moe_aux_loss_coef == 0.0
    assert zoo.hf.FAMILIES.get("mixtral").write_config(off)["output_router_logits"] is False


def test_experts_of_another_activation_are_refused():
    with pytest.raises(ValueError, match="hidden_act='gelu' experts are not supported"):
        zoo.from_hf_config(_config(hidden_act="gelu"))


# ---- zoo -> HF -----------------------------------------------------------------------------------
def _native(**overrides) -> zoo.ZooModel:
    values = dict(
        vocab_size=VOCAB,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=96,
        max_seq_len=64,
        init_std=0.2,
        ffn="moe",
        n_experts=4,
        moe_top_k=2,
        tie_embeddings=False,
        eos_token_id=2,
        pad_token_id=2,
    )
    return zoo.build_model(zoo.ModelConfig(**{**values, **overrides}), seed=0).eval()


@pytest.mark.parametrize("overrides", [{}, dict(mask="sliding_window", window=4, moe_top_k=1, tie_embeddings=True)])
def test_a_zoo_model_exports_loads_in_transformers_and_reads_back(overrides, tmp_path):
    model = _native(**overrides)
    assert zoo.hf_exportable(model.config) == "mixtral"
    assert zoo.to_hf(model, tmp_path / "out") == "MixtralForCausalLM"
    hf = _load(tmp_path / "out")
    ids = _tokens(2, 12)
    with torch.no_grad():
        _close(hf(ids).logits, model(ids))
    prompt = _tokens(1, 7, seed=4)
    assert _greedy(hf, prompt).tolist() == model.generate(prompt, max_new_tokens=NEW, eos_token_id=None).tolist()
    back = zoo.from_hf(tmp_path / "out")
    expected = model.config.replace(attn_dropout=0.0, moe_z_loss_coef=0.0)  # Mixtral has no z-loss
    assert back.config == expected
    for (name, a), b in zip(model.state_dict().items(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_a_folder_round_trips_every_tensor(mixtral, tmp_path):
    mixtral.save_pretrained(tmp_path / "hf")
    zoo.to_hf(zoo.from_hf(tmp_path / "hf"), tmp_path / "zoo")
    original, written = (
        load_file(tmp_path / "hf" / "model.safetensors"),
        load_file(tmp_path / "zoo" / "model.safetensors"),
    )
    assert written.keys() == original.keys()
    assert all(torch.equal(written[name], original[name]) for name in original)
    config = json.loads((tmp_path / "zoo" / "config.json").read_text())
    assert (config["num_local_experts"], config["num_experts_per_tok"]) == (4, 2)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(moe_shared_expert=True), "moe_shared_expert=True"),
        (dict(moe_renormalize=False), "moe_renormalize=False"),
        (dict(bias=True), "bias=True"),
    ],
)
def test_what_mixtral_cannot_compute_is_refused_in_one_line(overrides, field, tmp_path):
    model = _native(**overrides)
    assert any(problem.startswith(field) for problem in zoo.hf.FAMILIES.get("mixtral").unfit(model.config))
    with pytest.raises(zoo.ConfigError) as error:
        zoo.to_hf(model, tmp_path / "out")
    assert "\n" not in str(error.value) and not (tmp_path / "out").exists()


def test_a_dense_model_is_not_mixtrals():
    cfg = zoo.get_config("llama-tiny")
    assert zoo.hf.FAMILIES.get("mixtral").unfit(cfg) == ["ffn=swiglu (Mixtral has moe)"]
    assert zoo.hf_exportable(cfg) == "llama"
