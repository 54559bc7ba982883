"""Issue 24: the attention options ``qk_norm`` (Qwen3, OLMo 2), ``attn_softcap`` and ``final_softcap``
(Gemma 2) and ``value_residual`` (Zhou et al. 2024, https://arxiv.org/abs/2410.17897). Each against its
formula written out by hand, the kernels against each other, causality and cached decoding in every
form, and the refusals of the kernels and formats that cannot compute them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config, tiny_model
from hydra import compose, initialize_config_dir

import zoo
from tasks.cli.schemas import conf_dir, model_config
from zoo.attention import AttentionInputs, SelfAttention, ValueResidual
from zoo.position import apply_rotary

OPTIONS = {
    "qk_norm": dict(qk_norm="rmsnorm"),
    "qk_layernorm": dict(qk_norm="layernorm", bias=True),
    "attn_softcap": dict(attn_softcap=0.5, attention="math"),
    "final_softcap": dict(final_softcap=0.7),
    "value_residual": dict(value_residual=True, n_layers=3),
    "together": dict(qk_norm="rmsnorm", attn_softcap=0.5, attention="math", final_softcap=0.7, value_residual=True),
}


def _perturb(model: torch.nn.Module) -> torch.nn.Module:
    """Move every norm weight and value-residual lambda away from its initial value, so each counts."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, zoo.norm.RMSNorm | torch.nn.LayerNorm | ValueResidual):
                module.weight.uniform_(0.2, 0.9)
    return model


# ---- qk_norm ----------------------------------------------------------------------------------------
def test_qk_norm_normalises_each_heads_queries_and_keys_before_rope():
    cfg = tiny_config(qk_norm="rmsnorm", n_kv_heads=2)
    attn = _perturb(SelfAttention.from_config(cfg))
    x, positions = torch.randn(2, 5, 32), torch.arange(5)
    rotary = zoo.position.RoPE.from_config(cfg, causal=True).rotary(positions)
    q, k, v = attn.qkv(x).split((32, 16, 16), dim=-1)

    def heads(t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # (B, T, n * 8) -> (B, n, T, 8)
        t = t.view(2, 5, -1, 8)
        t = t / torch.sqrt(t.square().mean(-1, keepdim=True) + cfg.norm_eps) * weight
        return t.transpose(1, 2)

    q = apply_rotary(heads(q, attn.q_norm.weight), *rotary)
    k = apply_rotary(heads(k, attn.k_norm.weight), *rotary)
    v = v.view(2, 5, 2, 8).transpose(1, 2)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    expected = attn.out(expected.transpose(1, 2).reshape(2, 5, 32))
    torch.testing.assert_close(attn(x, AttentionInputs(is_causal=True, rotary=rotary)), expected)


def test_qk_norm_makes_scores_blind_to_the_scale_of_the_query_and_key_projections():
    attn = SelfAttention.from_config(tiny_config(qk_norm="rmsnorm", norm_eps=1e-12))
    x = torch.randn(2, 6, 32)
    before = attn(x, AttentionInputs(is_causal=True))
    with torch.no_grad():
        attn.qkv.weight[:64] *= 30.0  # the q and k rows: without qk_norm the softmax would saturate
    torch.testing.assert_close(attn(x, AttentionInputs(is_causal=True)), before, rtol=1e-4, atol=1e-5)
    plain = SelfAttention.from_config(tiny_config())
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if "_norm" not in k})
    assert not torch.allclose(plain(x, AttentionInputs(is_causal=True)), before, atol=1e-3)


def test_qk_norm_has_one_norm_each_for_queries_and_keys_as_wide_as_a_head():
    model = tiny_model(qk_norm="rmsnorm", head_dim=16)
    attn = model.decoder.blocks[0].attn
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (16,)
    assert attn.q_norm is not attn.k_norm
    names = [n for n, _ in model.named_parameters() if ".q_norm" in n or ".k_norm" in n]
    assert names[:2] == ["decoder.blocks.0.attn.q_norm.weight", "decoder.blocks.0.attn.k_norm.weight"]
    assert len(names) == 2 * 2  # two layers, no other qk norms
    cross = tiny_model(arch="encoder_decoder", qk_norm="rmsnorm").decoder.blocks[0].cross_attn
    assert cross.q_norm is not None and cross.k_norm is not None


# ---- soft-capping ------------------------------------------------------------------------------------
def test_math_caps_the_scaled_scores_before_the_mask():
    cfg = tiny_config(attn_softcap=0.5, attention="math")
    attn = SelfAttention.from_config(cfg)
    x = 3 * torch.randn(1, 5, 32)
    q, k, v = (t.view(1, 5, 4, 8).transpose(1, 2) for t in attn.qkv(x).split(32, dim=-1))
    scores = 0.5 * torch.tanh((q @ k.transpose(-1, -2) / 8**0.5) / 0.5)
    scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    expected = attn.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(1, 5, 32))
    torch.testing.assert_close(attn(x, AttentionInputs(is_causal=True)), expected)
    assert (q @ k.transpose(-1, -2) / 8**0.5).abs().max() > 2  # the cap bites


@pytest.mark.parametrize("position", ["rope", "alibi", "t5_relative"])
@pytest.mark.parametrize("kernel", ["flex", "auto"])
def test_every_softcap_kernel_agrees_with_math(kernel, position):
    reference = tiny_model(attn_softcap=0.5, attention="math", position=position, init_std=0.5)
    other = tiny_model(attn_softcap=0.5, attention=kernel, position=position, init_std=0.5)
    x, mask = torch.randint(0, 61, (2, 9)), torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding: the flex path gets a block mask, the dense path a bool mask
    with torch.no_grad():
        torch.testing.assert_close(other(x, mask), reference(x, mask), rtol=1e-4, atol=1e-5)
        uncapped = tiny_model(attention="math", position=position, init_std=0.5)(x, mask)
    assert not torch.allclose(uncapped, reference(x, mask), atol=1e-3)


def test_sdpa_refuses_a_softcap_in_one_line_and_names_the_kernels_that_compute_it():
    with pytest.raises(zoo.ConfigError) as error:
        tiny_config(attn_softcap=50.0).validate()
    message = str(error.value)
    assert "\n" not in message and message.startswith("attention=sdpa cannot soft-cap")
    assert "attention=math" in message and "flex" in message
    for name in ("attn_softcap", "final_softcap"):
        with pytest.raises(zoo.ConfigError, match=rf"^{name}=0.0 must be > 0"):
            tiny_config(attention="math", **{name: 0.0}).validate()


def test_final_softcap_bends_the_logits_into_the_cap():
    capped, plain = tiny_model(final_softcap=0.7, init_std=1.0), tiny_model(init_std=1.0)
    x = torch.randint(0, 61, (2, 7))
    with torch.no_grad():
        raw, logits = plain(x), capped(x)
    assert raw.abs().max() > 2 and logits.abs().max() <= 0.7
    torch.testing.assert_close(logits, 0.7 * torch.tanh(raw / 0.7))


# ---- value residual ----------------------------------------------------------------------------------
def test_value_residual_mixes_each_later_layers_values_with_the_first_layers():
    model = _perturb(tiny_model(value_residual=True, n_layers=3))
    blocks = model.decoder.blocks
    assert blocks[0].attn.values_first and blocks[0].attn.value_residual is None
    assert all(not b.attn.values_first and isinstance(b.attn.value_residual, ValueResidual) for b in blocks[1:])
    seen = {}

    def keep(name):
        def hook(module, args, out) -> None:
            seen[name] = out

        return hook

    for i, block in enumerate(blocks):
        block.attn.qkv.register_forward_hook(keep(i))
    model(torch.randint(0, 61, (2, 6)))

    def values(i: int) -> torch.Tensor:
        return seen[i][..., 64:].view(2, 6, 4, 8).transpose(1, 2)  # (B, KV, T, hd)

    for i in (1, 2):
        lam = blocks[i].attn.value_residual.weight
        mixed = values(i) + lam * (values(0) - values(i))
        torch.testing.assert_close(blocks[i].attn.value_residual(values(i), values(0)), mixed)
    assert blocks[1].attn.value_residual.weight.item() != blocks[2].attn.value_residual.weight.item()


def test_value_residual_weights_learn_and_init_resets_them():
    model = tiny_model(value_residual=True, n_layers=3).train()
    model(torch.randint(0, 61, (2, 6))).square().mean().backward()
    lams = [b.attn.value_residual.weight for b in model.decoder.blocks[1:]]
    assert all(lam.grad is not None and lam.grad.abs().item() > 0 for lam in lams)
    _perturb(model)
    model.init_weights()
    assert [lam.item() for lam in lams] == [0.5, 0.5]


def test_value_residual_under_activation_checkpointing_gives_the_same_gradients():
    grads = []
    for policy in ("none", "all"):
        model = tiny_model(value_residual=True, n_layers=3, activation_checkpointing=policy).train()
        model(torch.arange(12).view(2, 6)).square().mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, msg=name)


# ---- every option, in every form ------------------------------------------------------------------------
@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_cached_decoding_equals_full_recompute(option, arch):
    model = _perturb(tiny_model(arch=arch, n_kv_heads=2, tie_embeddings=False, **OPTIONS[option]))
    prompt = torch.randint(0, 61, (3, 6))
    cached = model.generate(prompt, max_new_tokens=10, eos_token_id=None)
    uncached = model.generate(prompt, max_new_tokens=10, eos_token_id=None, use_cache=False)
    assert cached[:, -10:].unique().numel() > 2
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("option", OPTIONS)
def test_a_decoder_does_not_look_ahead(option):
    model = _perturb(tiny_model(**OPTIONS[option]))
    x = torch.randint(0, 61, (2, 9))
    changed = x.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 61
    with torch.no_grad():
        a, b = model(x), model(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


@pytest.mark.parametrize("option", OPTIONS)
def test_an_encoder_and_a_saved_model_keep_them(option, tmp_path):
    encoder = tiny_model(arch="encoder", **OPTIONS[option])
    assert torch.isfinite(encoder(torch.randint(0, 61, (2, 5)))).all()
    model = _perturb(tiny_model(**OPTIONS[option]))
    zoo.save_pretrained(model, tmp_path)
    loaded = zoo.load_pretrained(tmp_path).eval()
    x = torch.randint(0, 61, (1, 6))
    torch.testing.assert_close(loaded(x), model(x))


# ---- configs and formats --------------------------------------------------------------------------
def test_the_config_group_and_fields_choose_them():
    overrides = ["model/qk_norm=rmsnorm", "model/attention=math", "model.attn_softcap=50", "model.value_residual=true"]
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, "model.final_softcap=30"])
    model = model_config(cfg.model).validate()
    assert (model.qk_norm, model.attn_softcap, model.final_softcap, model.value_residual) == ("rmsnorm", 50, 30, True)
    with pytest.raises(zoo.ConfigError, match=r"^qk_norm='rms' is not a registered norm; valid: none, "):
        tiny_config(qk_norm="rms").validate()


@pytest.mark.parametrize(
    "choice",
    [dict(qk_norm="layernorm"), dict(attn_softcap=50.0), dict(final_softcap=30.0), dict(value_residual=True)],
)
@pytest.mark.parametrize("preset", ["gpt-tiny", "llama-tiny", "bert-tiny", "t5-tiny"])
def test_no_hf_family_claims_what_it_does_not_compute(preset, choice):
    name, value = next(iter(choice.items()))
    attention = {"attention": "math"} if name == "attn_softcap" else {}
    with pytest.raises(zoo.ConfigError) as error:
        zoo.hf_exportable(zoo.get_config(preset, **choice, **attention))
    assert "\n" not in str(error.value) and f"{name}={value}" in str(error.value)


# ---- qk_norm_scope=all (OLMo 2) ----------------------------------------------------------------------
def test_qk_norm_over_all_heads_normalises_the_whole_projection_before_the_split():
    cfg = tiny_config(qk_norm="rmsnorm", qk_norm_scope="all", n_kv_heads=2)
    attn = _perturb(SelfAttention.from_config(cfg))
    assert attn.q_norm.weight.shape == (32,) and attn.k_norm.weight.shape == (16,)
    x = torch.randn(2, 5, 32)
    q, k, v = attn.qkv(x).split((32, 16, 16), dim=-1)

    def normed(t: torch.Tensor, weight: torch.Tensor, n: int) -> torch.Tensor:  # over the whole width
        t = t / torch.sqrt(t.square().mean(-1, keepdim=True) + cfg.norm_eps) * weight
        return t.view(2, 5, n, 8).transpose(1, 2)

    q, k = normed(q, attn.q_norm.weight, 4), normed(k, attn.k_norm.weight, 2)
    v = v.view(2, 5, 2, 8).transpose(1, 2)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    expected = attn.out(expected.transpose(1, 2).reshape(2, 5, 32))
    torch.testing.assert_close(attn(x, AttentionInputs(is_causal=True)), expected)
    model = tiny_model(qk_norm="rmsnorm", qk_norm_scope="all", n_kv_heads=2)
    prompt = torch.randint(0, 61, (2, 5))
    assert torch.equal(
        model.generate(prompt, max_new_tokens=8), model.generate(prompt, max_new_tokens=8, use_cache=False)
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (dict(qk_norm_scope="everything"), r"^qk_norm_scope='everything' must be 'head' \(each head\) or 'all'"),
        (dict(qk_norm_scope="all"), r"^qk_norm_scope='all' scopes qk_norm, which is none: set model/qk_norm"),
    ],
)
def test_a_bad_qk_norm_scope_is_refused_in_one_line(values, message):
    with pytest.raises(zoo.ConfigError, match=message):
        tiny_config(**values).validate()


def test_res_post_normalises_each_sublayers_output_and_never_the_stream():
    model = tiny_model(norm_placement="res_post")
    placement = model.decoder.blocks[0].attn_res
    assert [n for n, _ in placement.named_children()] == ["norm_out"] and model.decoder.final_norm is not None
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        placement.norm_out.weight.uniform_(0.5, 1.5)
        torch.testing.assert_close(placement(x, torch.tanh), x + placement.norm_out(torch.tanh(x)))
