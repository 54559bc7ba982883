"""Mathematical properties of each component, at tiny sizes."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config, tiny_model

import zoo
from zoo.attention import Attention, AttentionInputs, CrossAttention, SelfAttention
from zoo.kernels import Scoring
from zoo.norm import LayerNorm, RMSNorm
from zoo.position import ALiBi, RoPE, Sinusoidal, T5Relative, alibi_slopes, apply_rotary, t5_relative_bucket
from zoo.registry import MASK, ConfigError

POSITIONS = zoo.list_components()["position"]


# ---- position encodings ------------------------------------------------------------------------
def test_rope_scores_depend_only_on_relative_position():
    rope = RoPE(head_dim=16)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m: int, n: int) -> float:
        qm = apply_rotary(q, *rope.rotary(torch.tensor([m])))
        kn = apply_rotary(k, *rope.rotary(torch.tensor([n])))
        return (qm * kn).sum().item()

    assert score(7, 3) == pytest.approx(score(104, 100), abs=1e-4)
    assert score(0, 5) == pytest.approx(score(50, 55), abs=1e-4)
    by_distance = [score(10, 10 - d) for d in range(8)]
    assert max(by_distance) - min(by_distance) > 0.5  # yet it does depend on the distance


def test_rope_rotation_preserves_norm_and_is_identity_at_zero():
    rope = RoPE(head_dim=8)
    x = torch.randn(2, 3, 5, 8)
    rotated = apply_rotary(x, *rope.rotary(torch.arange(5)))
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(rotated[:, :, 0], x[:, :, 0])


def test_rope_linear_scaling_interpolates_positions():
    plain, scaled = RoPE(16), RoPE(16, scaling="linear", factor=4.0)
    for a, b in zip(plain.rotary(torch.tensor([3.0])), scaled.rotary(torch.tensor([12.0])), strict=True):
        torch.testing.assert_close(a, b)


def test_rope_ntk_scaling_raises_base_and_keeps_highest_frequency():
    plain, ntk = RoPE(16), RoPE(16, scaling="ntk", factor=8.0)
    assert ntk.base == pytest.approx(10000 * 8 ** (16 / 14))
    assert ntk.inv_freq()[0] == plain.inv_freq()[0] == 1.0  # the fastest pair still turns 1 rad/token
    assert ntk.inv_freq()[-1] < plain.inv_freq()[-1]


def test_sinusoidal_matches_the_formula():
    d = 10
    pe = Sinusoidal(d).embed(torch.arange(6))
    for p in range(6):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_alibi_slopes_for_eight_heads_are_powers_of_one_half():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0**-i for i in range(1, 9)]))


def test_alibi_slopes_for_head_counts_not_a_power_of_two():
    slopes = alibi_slopes(12)  # 8 slopes of 8 heads, then the odd ones of 16 heads
    assert len(slopes) == 12
    torch.testing.assert_close(slopes[:8], alibi_slopes(8))
    torch.testing.assert_close(slopes[8:], alibi_slopes(16)[0::2][:4])


def test_alibi_bias_is_linear_in_distance():
    bias = ALiBi(4).bias(torch.arange(6), torch.arange(6))  # (H, Tq, Tk)
    slopes = alibi_slopes(4)
    for h in range(4):
        assert bias[h, 5, 2].item() == pytest.approx(-3 * slopes[h].item())
        assert bias[h, 4, 4].item() == 0.0


def test_t5_buckets_exact_near_logarithmic_far_and_direction_aware():
    rel = torch.arange(-200, 201)
    causal = t5_relative_bucket(rel, bidirectional=False, num_buckets=32, max_distance=128)
    both = t5_relative_bucket(rel, bidirectional=True, num_buckets=32, max_distance=128)
    assert (causal[rel >= 0] == 0).all()  # a causal query sees no key after it: one bucket for all
    assert causal[200 - 5].item() == 5  # exact for small distances
    assert causal.max().item() == 31 and causal[0].item() == 31  # far keys share the last bucket
    assert both.max().item() == 31 and both.min().item() == 0
    assert both[200 + 3].item() == 16 + 3 and both[200 - 3].item() == 3  # later keys use the upper half
    assert (causal[:-1] >= causal[1:]).all()  # monotone in distance


def test_t5_relative_bias_is_shift_invariant():
    rel = T5Relative(n_heads=2, bidirectional=True)
    a = rel.bias(torch.arange(0, 4), torch.arange(0, 4))
    b = rel.bias(torch.arange(10, 14), torch.arange(10, 14))
    torch.testing.assert_close(a, b)


def test_t5_relative_table_is_shared_by_all_layers_of_a_stack():
    model = tiny_model(arch="encoder_decoder", position="t5_relative")
    tables = [n for n, _ in model.named_parameters() if "position.table" in n]
    assert tables == ["encoder.position.table.weight", "decoder.position.table.weight"]
    assert model.encoder.position.bidirectional and not model.decoder.position.bidirectional


def test_without_positions_a_bidirectional_encoder_is_permutation_equivariant():
    model = tiny_model(arch="encoder", position="none", mask="bidirectional")
    x = torch.randint(0, 61, (1, 7))
    perm = torch.randperm(7)
    torch.testing.assert_close(model(x[:, perm]), model(x)[:, perm], atol=1e-5, rtol=1e-5)


def test_without_positions_a_causal_decoder_sees_order_through_its_mask_alone():
    model = tiny_model(arch="decoder", position="none")
    x = torch.randint(0, 61, (1, 7))
    out = model.features(x)
    shuffled = torch.cat([x[:, :4], x[:, 4:].flip(1)], dim=1)  # the same prefix, its future reordered
    torch.testing.assert_close(model.features(shuffled)[:, :4], out[:, :4])  # the prefix never sees it
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    assert not torch.allclose(model.features(x[:, perm]), out[:, perm], atol=1e-3)  # not equivariant: order matters


@pytest.mark.parametrize("position", ["sinusoidal", "learned", "rope", "alibi", "t5_relative"])
def test_every_position_encoding_breaks_permutation_symmetry(position):
    model = tiny_model(arch="encoder", position=position)
    x = torch.randint(0, 61, (1, 7))
    perm = torch.tensor([1, 0, 2, 3, 4, 5, 6])
    assert not torch.allclose(model(x[:, perm]), model(x)[:, perm], atol=1e-4)


def test_learned_positions_refuse_sequences_longer_than_the_table():
    model = tiny_model(position="learned", max_seq_len=8)
    with pytest.raises(ValueError, match="max_seq_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


# ---- norms and FFNs ------------------------------------------------------------------------------
def test_rmsnorm_output_has_unit_rms():
    x = torch.randn(4, 9, 32) * 5 + 3
    y = RMSNorm(32, eps=1e-8)(x)
    torch.testing.assert_close(y.pow(2).mean(-1).sqrt(), torch.ones(4, 9), atol=1e-4, rtol=0)


def test_layernorm_output_has_zero_mean_unit_variance():
    y = LayerNorm(32, eps=1e-8)(torch.randn(4, 32) * 5 + 3)
    torch.testing.assert_close(y.mean(-1), torch.zeros(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(4), atol=1e-4, rtol=0)


@pytest.mark.parametrize("placement", ["pre", "post", "sandwich"])
def test_norm_placement_formulas(placement):
    cfg = tiny_config(norm="rmsnorm", norm_placement=placement)
    wrapper = zoo.registry.NORM_PLACEMENT.get(placement).from_config(cfg)
    x = torch.randn(2, 3, 32)
    f = lambda h: 2 * h + 1
    norm = lambda h: F.rms_norm(h, (32,), eps=cfg.norm_eps)
    expected = {"pre": x + f(norm(x)), "post": norm(x + f(x)), "sandwich": x + norm(f(norm(x)))}[placement]
    torch.testing.assert_close(wrapper(x, f), expected)


def test_ffn_hidden_sizes():
    assert tiny_config(ffn="gelu", d_ff=None, d_model=64).resolved_d_ff == 256
    assert zoo.ModelConfig(ffn="swiglu", d_model=4096).resolved_d_ff == 11008  # Llama's 2/3 * 4d rule
    assert zoo.ModelConfig(ffn="geglu", d_model=512, ffn_multiple_of=64).resolved_d_ff == 1408


def test_swiglu_is_silu_gate_times_up():
    ffn = zoo.registry.FFN.get("swiglu").from_config(tiny_config(ffn="swiglu"))
    x = torch.randn(3, 32)
    gate, up = ffn.fc.weight.chunk(2)
    torch.testing.assert_close(ffn(x), (F.silu(x @ gate.T) * (x @ up.T)) @ ffn.proj.weight.T)


# ---- attention -------------------------------------------------------------------------------------
def _qkv(B=2, H=4, KV=4, T=6, S=6, hd=8):
    return torch.randn(B, H, T, hd), torch.randn(B, KV, S, hd), torch.randn(B, KV, S, hd)


def test_math_kernel_is_the_textbook_formula():
    q, k, v = _qkv(B=1, H=1, KV=1)
    how = Scoring(mask=None, is_causal=False, scale=8**-0.5, dropout_p=0.0, probe=torch.nn.Identity())
    y = zoo.registry.ATTENTION.get("math").attend(q, k, v, how)
    torch.testing.assert_close(y, torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8), -1) @ v)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool", "float"])
def test_sdpa_kernel_equals_math_kernel(kv_heads, mask_kind):
    q, k, v = _qkv(KV=kv_heads)
    mask = {"none": None, "causal": None, "bool": torch.rand(2, 1, 6, 6) > 0.3, "float": torch.randn(1, 4, 6, 6)}[
        mask_kind
    ]
    if mask_kind == "bool":
        mask |= torch.eye(6, dtype=torch.bool)
    how = Scoring(mask=mask, is_causal=mask_kind == "causal", scale=0.3, dropout_p=0.0, probe=torch.nn.Identity())
    sdpa = zoo.registry.ATTENTION.get("sdpa").attend(q, k, v, how)
    math_ = zoo.registry.ATTENTION.get("math").attend(q, k, v, how)
    torch.testing.assert_close(sdpa, math_, atol=1e-5, rtol=1e-5)


def test_gqa_with_as_many_kv_heads_as_heads_equals_mha_with_repeated_kv():
    torch.manual_seed(0)
    gqa = SelfAttention(32, 4, 2, 8, qkv_bias=True, out_bias=True)
    mha = SelfAttention(32, 4, 4, 8, qkv_bias=True, out_bias=True)
    with torch.no_grad():  # MHA whose heads 2i, 2i+1 share the K/V weights of GQA's head i
        wq, wk, wv = gqa.qkv.weight.split((32, 16, 16))
        bq, bk, bv = gqa.qkv.bias.split((32, 16, 16))
        rep = lambda w: w.view(2, 8, -1).repeat_interleave(2, 0).reshape(32, *w.shape[1:])
        mha.qkv.weight.copy_(torch.cat([wq, rep(wk), rep(wv)]))
        mha.qkv.bias.copy_(torch.cat([bq, rep(bk[:, None])[:, 0], rep(bv[:, None])[:, 0]]))
        mha.out.load_state_dict(gqa.out.state_dict())
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(gqa(x, AttentionInputs(is_causal=True)), mha(x, AttentionInputs(is_causal=True)))


def test_gqa_config_equal_heads_is_mha():
    a = tiny_model(n_kv_heads=4)
    b = tiny_model(n_kv_heads=None)
    x = torch.randint(0, 61, (2, 9))
    torch.testing.assert_close(a(x), b(x))


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize(
    "arch,mask",
    [("decoder", "causal"), ("decoder", "prefix"), ("encoder", "bidirectional"), ("encoder_decoder", "bidirectional")],
)
def test_sdpa_path_equals_math_path_in_whole_models(position, arch, mask):
    sdpa = tiny_model(arch=arch, position=position, mask=mask, attention="sdpa")
    math_ = tiny_model(arch=arch, position=position, mask=mask, attention="math")
    x = torch.randint(0, 61, (2, 9))
    pad = torch.ones(2, 9, dtype=torch.long)
    pad[1, 6:] = 0
    kw = {"prefix_len": 4} if MASK.get(mask).needs_prefix_len else {}
    if arch == "encoder_decoder":
        y = torch.randint(0, 61, (2, 5))
        torch.testing.assert_close(sdpa(x, y, pad), math_(x, y, pad), atol=1e-4, rtol=1e-4)
    else:
        torch.testing.assert_close(sdpa(x, pad, **kw), math_(x, pad, **kw), atol=1e-4, rtol=1e-4)


def test_capture_attention_returns_probabilities_and_restores_kernels():
    model = tiny_model(arch="encoder_decoder")
    with zoo.capture_attention(model) as probs:
        model(torch.randint(0, 61, (1, 7)), torch.randint(0, 61, (1, 4)))
    assert set(probs) == {
        f"{s}.blocks.{i}.{a}"
        for s, a in [("encoder", "attn"), ("decoder", "attn"), ("decoder", "cross_attn")]
        for i in range(2)
    }
    assert probs["decoder.blocks.0.cross_attn"].shape == (1, 4, 4, 7)
    torch.testing.assert_close(probs["encoder.blocks.1.attn"].sum(-1), torch.ones(1, 4, 7))
    assert probs["decoder.blocks.0.attn"][0, :, 0, 1:].abs().max() == 0  # causal: nothing from the future
    assert all(m.kernel == "sdpa" for m in model.modules() if isinstance(m, Attention))


def test_the_model_sets_its_attention_kernel_and_gives_back_what_it_had():
    """``set_attention_kernel`` reaches every attention layer (self and cross), computes what the
    default kernel computes, returns the kernels by layer so that passing them back restores them,
    and refuses a name that is no kernel before any layer changes; the config keeps its own."""
    model = tiny_model(arch="encoder_decoder").eval()
    x, y = torch.randint(0, 61, (2, 7)), torch.randint(0, 61, (2, 4))
    with torch.no_grad():
        sdpa = model(x, y)
    before = model.set_attention_kernel("math")
    layers = {name: m for name, m in model.named_modules() if isinstance(m, Attention)}
    assert set(before) == set(layers) and len(layers) == 6 and set(before.values()) == {"sdpa"}
    assert {m.kernel for m in layers.values()} == {"math"} and model.config.attention == "sdpa"
    with torch.no_grad():
        torch.testing.assert_close(model(x, y), sdpa, atol=1e-4, rtol=1e-4)
    with pytest.raises(ConfigError, match="attention"):
        model.set_attention_kernel({**before, "decoder.blocks.1.cross_attn": "no_such_kernel"})
    assert {m.kernel for m in layers.values()} == {"math"}  # refused whole: no layer changed
    assert model.set_attention_kernel(before) == dict.fromkeys(layers, "math")
    assert {m.kernel for m in layers.values()} == {"sdpa"}


def test_the_model_sets_its_kv_dtype_in_every_attention_layer():
    model = tiny_model(arch="encoder_decoder")
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    model.set_kv_dtype("int8")
    assert model.kv_dtype == "int8" and {m.kv_dtype for m in layers} == {"int8"}
    with pytest.raises(ConfigError):
        model.set_kv_dtype("int3")
    assert model.kv_dtype == "int8" and {m.kv_dtype for m in layers} == {"int8"}
    model.kv_dtype = None  # the property sets it the same way
    assert {m.kv_dtype for m in layers} == {None}


def test_self_and_cross_attention_keep_their_parameter_names():
    self_attn = SelfAttention(32, 4, 2, 8, qkv_bias=True, out_bias=False)
    cross_attn = CrossAttention(32, 4, 2, 8, qkv_bias=True, out_bias=False)
    assert list(self_attn.state_dict()) == ["qkv.weight", "qkv.bias", "out.weight"]
    assert list(cross_attn.state_dict()) == ["q.weight", "q.bias", "kv.weight", "kv.bias", "out.weight"]
    assert self_attn.query_weight().shape == cross_attn.query_weight().shape == (32, 32)


def test_cross_attention_attends_over_memory_and_its_cache():
    torch.manual_seed(0)
    layer = CrossAttention(32, 4, 2, 8, qkv_bias=False, out_bias=False)
    x, memory = torch.randn(2, 3, 32), torch.randn(2, 5, 32)
    cache = zoo.KVCache()
    first = layer(x, AttentionInputs(), cache=cache, memory=memory)
    assert first.shape == (2, 3, 32) and cache.length == 5
    torch.testing.assert_close(layer(x, AttentionInputs(), cache=cache), first)  # keys and values from the cache


def test_init_scales_the_residual_projections_each_component_marks():
    model = tiny_model(arch="encoder_decoder", n_layers=8, d_model=64, d_ff=256, init_std=0.5)
    marked = [p for m in model.modules() if hasattr(m, "residual_projections") for p in m.residual_projections()]
    enc, dec = model.encoder.blocks[0], model.decoder.blocks[0]
    assert len(marked) == 2 * 8 + 3 * 8  # encoder blocks: attention and FFN; decoder blocks: cross-attention too
    assert marked[:2] == [enc.attn.out, enc.ffn.proj]
    assert marked[16:19] == [dec.attn.out, dec.cross_attn.out, dec.ffn.proj]
    scaled = torch.cat([p.weight.flatten() for p in marked]).std().item()
    assert scaled == pytest.approx(0.5 / math.sqrt(2 * 16), rel=0.05)  # 1/sqrt(2 * layers), 16 layers in all
    assert dec.ffn.fc.weight.std().item() == pytest.approx(0.5, rel=0.05)  # an input projection is not scaled
