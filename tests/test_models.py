"""Whole-model properties: every combination builds and trains, causality, padding, caching, devices."""

import copy
import itertools
import pickle

import pytest
import torch
from conftest import tiny_config, tiny_model
from rounding import assert_rounding_close

import zoo
from zoo.decoding import steps_of
from zoo.inspect import attention_kind

C = zoo.list_components()
COMBINATIONS = list(itertools.product(C["arch"], C["position"], C["norm"], C["norm_placement"], C["ffn"]))


@pytest.mark.parametrize("arch,position,norm,placement,ffn", COMBINATIONS)
def test_every_component_combination_builds_runs_and_backpropagates(arch, position, norm, placement, ffn):
    model = zoo.build_model(
        tiny_config(
            arch=arch,
            position=position,
            norm=norm,
            norm_placement=placement,
            ffn=ffn,
            dropout=0.1,
            type_vocab_size=2 if arch == "encoder" else 0,
        ),
        seed=0,
    ).train()
    x = torch.randint(0, 61, (2, 7))
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    if arch == "encoder":
        out = model(x, mask)
        assert out.shape == (2, 7, 32)
    elif arch == "decoder":
        out = model(x, mask)
        assert out.shape == (2, 7, 61)
    else:
        out = model(x, x[:, :4], mask)
        assert out.shape == (2, 4, 61)
    out.float().pow(2).mean().backward()
    assert torch.isfinite(out).all()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("arch", C["arch"])
def test_each_form_declares_what_its_model_does(arch):
    cfg = tiny_config(arch=arch)
    form = cfg.form
    model = zoo.build_model(cfg, seed=0).eval()
    assert type(model) is form is zoo.registry.ARCH.get(arch)
    assert cfg.resolved_mask == form.natural_mask and type(model.stacks()[0].mask) is zoo.registry.MASK.get(
        form.natural_mask
    )
    inputs = form.example_inputs(cfg, batch=3, length=8)
    assert list(inputs) == list(form.input_names) and all(t.shape[0] == 3 for t in inputs.values())
    assert inputs["attention_mask"][0].tolist() == [1] * 4 + [0] * 4  # padding is exercised
    with zoo.capture_attention(model) as maps:
        model(**inputs)  # forward takes exactly these inputs, by keyword
    assert sorted({attention_kind(name) for name in maps}) == sorted(form.attention_kinds)
    assert (model.new_cache().cross_attn is not None) == form.cross_attention == ("cross" in form.attention_kinds)
    assert form.has_vocab_head(cfg) == (arch != "encoder") and form.attention_layers(cfg) >= cfg.n_layers
    if form.decoding is None:
        assert form.cached_layers(cfg) == 0
        with pytest.raises(TypeError, match=f"an {arch} does not generate; use arch='decoder' or 'encoder_decoder'"):
            model.generate(inputs["input_ids"], 2)
    else:
        out = model.generate(inputs["input_ids"][1:], 2)
        assert out.shape == (2, steps_of(form).held(8) + 2) and form.cached_layers(cfg) > 0


@pytest.mark.parametrize("position", C["position"])
def test_changing_a_future_token_leaves_past_logits_unchanged(position):
    model = tiny_model(position=position)
    x = torch.randint(0, 61, (1, 10))
    y = x.clone()
    y[0, 6] = (y[0, 6] + 1) % 61
    a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_prefix_mask_is_bidirectional_over_the_prefix_and_causal_after():
    model = tiny_model(mask="prefix")
    x = torch.randint(0, 61, (1, 10))
    y = x.clone()
    y[0, 2] = (y[0, 2] + 1) % 61  # inside the prefix: every position sees it
    assert not torch.allclose(model(x, prefix_len=4)[:, :2], model(y, prefix_len=4)[:, :2])
    z = x.clone()
    z[0, 7] = (z[0, 7] + 1) % 61  # after the prefix: the past does not
    torch.testing.assert_close(model(x, prefix_len=4)[:, :7], model(z, prefix_len=4)[:, :7])
    per_row = model(x.expand(2, -1), prefix_len=torch.tensor([4, 4]))
    torch.testing.assert_close(per_row[1:], model(x, prefix_len=4))


@pytest.mark.parametrize("arch", C["arch"])
@pytest.mark.parametrize("position", C["position"])
def test_padding_does_not_change_the_outputs_of_real_tokens(arch, position):
    model = tiny_model(arch=arch, position=position)
    x = torch.randint(1, 61, (1, 6))
    padded = torch.cat([x, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    mask = torch.tensor([[1] * 6 + [0] * 3])
    if arch == "encoder_decoder":
        y = torch.randint(0, 61, (1, 4))
        assert_rounding_close(model(padded, y, mask), model(x, y), model)
    else:
        assert_rounding_close(model(padded, mask)[:, :6], model(x), model)


@pytest.mark.parametrize("position", C["position"])
@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_cached_step_by_step_logits_equal_full_recompute(position, arch):
    model = tiny_model(arch=arch, position=position, n_kv_heads=2)
    tokens = torch.randint(0, 61, (2, 9))
    cache = model.new_cache(capacity=4)  # small on purpose: the cache must grow
    if arch == "decoder":
        full = model(tokens)
        steps = [model(tokens[:, :3], cache=cache)] + [model(tokens[:, t : t + 1], cache=cache) for t in range(3, 9)]
    else:
        src = torch.randint(0, 61, (2, 5))
        memory = model.encode(src)
        full = model.decode(tokens, memory)
        steps = [model.decode(tokens[:, :3], memory, cache=cache)]
        steps += [model.decode(tokens[:, t : t + 1], memory, cache=cache) for t in range(3, 9)]
    assert_rounding_close(torch.cat(steps, dim=1), full, model)
    assert cache.length == 9
    assert not any("cache" in k for k in model.state_dict())


def test_cross_attention_keys_are_computed_once_per_source():
    model = tiny_model(arch="encoder_decoder")
    calls = []
    for block in model.decoder.blocks:
        block.cross_attn.kv.register_forward_hook(lambda *a: calls.append(1))
    model.generate(torch.randint(0, 61, (2, 5)), max_new_tokens=6, eos_token_id=None)
    assert len(calls) == len(model.decoder.blocks)


def test_kv_cache_size_matches_the_formula():
    model = tiny_model(n_kv_heads=2)
    cache = model.new_cache()
    model(torch.randint(0, 61, (3, 11)), cache=cache)
    # 2 (K, V) x layers x kv_heads x head_dim x length x bytes x batch
    assert cache.nbytes() == 2 * 2 * 2 * 8 * 11 * 4 * 3


def test_meta_device_builds_without_memory_and_materialises_on_demand():
    with torch.device("meta"):
        model = zoo.create_model("llama-tiny")
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    model.init_weights()
    assert torch.isfinite(model(torch.randint(0, 1024, (1, 5)))).all()


def test_seeded_builds_are_identical_and_leave_global_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a, b = zoo.build_model(tiny_config(), seed=7), zoo.build_model(tiny_config(), seed=7)
    assert torch.equal(torch.random.get_rng_state(), before)
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(p, q), n


def test_models_pickle_and_deepcopy():
    model = tiny_model(ffn="geglu", gelu_approximate="tanh")
    x = torch.randint(0, 61, (1, 5))
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        torch.testing.assert_close(clone(x), model(x))


def test_tied_and_untied_heads():
    tied, untied = tiny_model(tie_embeddings=True), tiny_model(tie_embeddings=False)
    assert zoo.count_parameters(untied) - zoo.count_parameters(tied) == 61 * 32
    assert tied.lm_head is None and untied.lm_head.weight is not untied.embed.weight


def test_encoder_heads():
    model = tiny_model(arch="encoder", pooler=True, mlm_head=True, type_vocab_size=2)
    x = torch.randint(0, 61, (2, 6))
    hidden = model(x, token_type_ids=torch.tensor([[0, 0, 0, 1, 1, 1]] * 2))
    assert model.pool(hidden).shape == (2, 32) and model.pool(hidden).abs().max() <= 1
    assert model.mlm_logits(hidden).shape == (2, 6, 61)
    with pytest.raises(zoo.ConfigError, match="pooler=True"):
        tiny_model(arch="encoder").pool(hidden)


def test_encoder_decoder_layer_counts():
    model = tiny_model(arch="encoder_decoder", n_layers=3, n_decoder_layers=1)
    assert len(model.encoder.blocks) == 3 and len(model.decoder.blocks) == 1


@pytest.mark.parametrize("arch", ["encoder", "decoder", "encoder_decoder"])
def test_embed_scale_equals_scaling_the_embedding_table(arch):
    cfg = zoo.ModelConfig(
        arch=arch, vocab_size=50, d_model=16, n_layers=1, n_heads=2, position="sinusoidal", tie_embeddings=False
    )
    scaled = zoo.build_model(cfg.replace(embed_scale=4.0), seed=0).eval()
    plain = zoo.build_model(cfg, seed=0).eval()
    with torch.no_grad():
        plain.embed.weight.mul_(4.0)
    inputs = cfg.form.example_inputs(cfg, batch=2, length=5)
    torch.testing.assert_close(scaled(**inputs), plain(**inputs))
    with pytest.raises(zoo.ConfigError, match="embed_scale"):
        zoo.build_model(cfg.replace(embed_scale=0.0))
