"""zoo.quantize: every form generates (greedy, sampling, beam) with quantized weights; a trained model's
int8 greedy tokens follow float32's; cached equals uncached decoding; refusals name the field.
The benchmark script runs at a tiny size (no timing asserted)."""

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

import zoo
from zoo.moe import ExpertLinear
from zoo.quantize import Int8ExpertLinear, Int8Linear

FORMS = {
    "decoder": {},
    "encoder_decoder": {},
    "decoder_untied": {"tie_embeddings": False},
    "llama_like": {"position": "rope", "norm": "rmsnorm", "ffn": "swiglu", "n_kv_heads": 2},
    "moe": {"ffn": "moe", "n_experts": 4, "moe_shared_expert": True, "bias": True},
}
BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "quantize.py"


def _model(overrides: dict, **more) -> zoo.ZooModel:
    arch = "encoder_decoder" if overrides is FORMS["encoder_decoder"] else "decoder"
    return zoo.build_model(tiny_config(arch=arch, **overrides, **more), seed=0).eval()


@pytest.fixture(scope="module")
def trained() -> tuple[zoo.ZooModel, torch.Tensor]:
    """A tiny decoder trained (80 AdamW steps, a few seconds) on a 24-token pattern repeated, and 8
    prompts cut from it at different phases."""
    g = torch.Generator().manual_seed(0)
    model = zoo.build_model(tiny_config(d_model=64, d_ff=128), seed=0).train()
    stream = torch.randint(5, 61, (24,), generator=g).repeat(20)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(80):
        starts = torch.randint(0, len(stream) - 25, (8,), generator=g).tolist()
        batch = torch.stack([stream[s : s + 25] for s in starts])  # (8, 25)
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5  # it learnt the pattern
    return model.eval(), torch.stack([stream[s : s + 8] for s in range(0, 24, 3)])


@pytest.mark.parametrize("weights", ["int8", "bf16"])
@pytest.mark.parametrize("form", list(FORMS))
def test_quantized_model_generates_every_way(form, weights):
    model = _model(FORMS[form])
    prompt = torch.randint(5, 61, (2, 6), generator=torch.Generator().manual_seed(1))
    assert zoo.quantize(model, weights) is model and not model.training  # in place, eval mode
    assert model.quantized_weights == weights
    greedy = model.generate(prompt, 5, eos_token_id=None)
    sampled = model.generate(
        prompt, 5, eos_token_id=None, do_sample=True, top_k=10, generator=torch.Generator().manual_seed(0)
    )
    beam = model.generate(prompt, 5, eos_token_id=None, num_beams=3)
    start = 1 if form == "encoder_decoder" else prompt.shape[1]  # an encoder_decoder returns start + target
    for out in (greedy, sampled, beam):
        assert out.shape == (2, start + 5)
        assert out.min() >= 0 and out.max() < 61


def test_int8_replaces_every_linear_and_keeps_the_embedding_float():
    model = _model(FORMS["decoder"])
    table = model.embed.weight.detach().clone()
    zoo.quantize(model, "int8")
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert model.lm_head is not None  # the tied head became a packed copy of the embedding
    assert model.embed.weight.dtype == torch.float32 and torch.equal(model.embed.weight, table)


def test_int8_stores_the_stacked_experts_in_int8_and_their_logits_stay_close():
    model = _model(FORMS["moe"])
    ids = torch.randint(5, 61, (2, 8), generator=torch.Generator().manual_seed(0))

    def expert_bytes() -> int:
        return sum(t.nbytes for name, t in model.state_dict().items() if ".experts." in name)

    float_bytes = expert_bytes()
    with torch.no_grad():
        before = model(ids)
        zoo.quantize(model, "int8")
        after = model(ids)
    experts = model.decoder.blocks[0].ffn.experts
    assert experts.fc.weight.dtype == experts.proj.weight.dtype == torch.int8
    assert expert_bytes() < 0.3 * float_bytes  # 1 byte a weight (from 4), a 2-byte scale a row, float biases
    assert (after - before).abs().max() < 0.1 * before.abs().max()  # the encoder's bound, below


def test_int8_experts_compute_each_experts_rounded_weights():
    stack = ExpertLinear(3, 40, 24, bias=True, std=0.5)
    int8 = Int8ExpertLinear(stack)
    x = torch.randn(5, 40)
    for e in range(3):
        rounded = int8.weight[e].float() * int8.scale[e].float()[:, None]  # (24, 40) what it holds
        w = stack.weight[e].detach()
        assert (rounded - w).abs().max() <= w.abs().max() * (1 / 254 + 1 / 256)  # as Int8Linear's
        torch.testing.assert_close(int8(x, e), F.linear(x, rounded, stack.bias[e].detach()))


def test_encoder_quantizes_and_stays_close():
    model = zoo.build_model(tiny_config(arch="encoder", type_vocab_size=2, pooler=True, mlm_head=True), seed=0).eval()
    ids = torch.randint(5, 61, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model.mlm_logits(model(ids))
        zoo.quantize(model, "int8")
        after = model.mlm_logits(model(ids))
    assert (after - before).abs().max() < 0.1 * before.abs().max()


def test_int8_greedy_tokens_follow_float32_on_a_trained_model(trained):
    """Measured: 318 of 320 greedy tokens agree (8 prompts x 40 steps; logits max-abs-diff 0.14, the
    largest logit 11.7), with the int8 KV cache too. The bound 0.9 leaves room for another CPU's rounding."""
    model, prompts = trained
    quantized = zoo.quantize(copy.deepcopy(model), "int8")
    with torch.no_grad():
        ref = model.generate(prompts, 40, eos_token_id=None)[:, 8:]
        out = quantized.generate(prompts, 40, eos_token_id=None)[:, 8:]
    assert (out == ref).float().mean().item() >= 0.9


def test_cached_equals_uncached_with_int8_weights(trained):
    model, prompts = trained
    quantized = zoo.quantize(copy.deepcopy(model), "int8")
    cached = quantized.generate(prompts, 24, eos_token_id=None)
    assert torch.equal(cached, quantized.generate(prompts, 24, eos_token_id=None, use_cache=False))


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"weights": "int3"}, ["weights='int3'", "int8", "int4"]),
        ({"weights": "int4"}, ["weights='int4'", "CUDA", "int8"]),
        ({"weights": "int8", "kv_cache": "fp8"}, ["kv_cache='fp8'", "int8"]),
    ],
)
def test_refusals_name_the_field(kwargs, words):
    with pytest.raises(zoo.ConfigError) as err:
        zoo.quantize(_model(FORMS["decoder"]), **kwargs)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_refuses_a_training_an_adapted_or_an_already_quantized_model():
    with pytest.raises(zoo.ConfigError, match=r"weights='int8'.*training mode.*model\.eval\(\)"):
        zoo.quantize(_model(FORMS["decoder"]).train(), "int8")
    adapted = _model(FORMS["decoder"])
    zoo.adapters.apply(adapted, "lora", rank=2, targets=("q", "v"))
    with pytest.raises(zoo.ConfigError, match=r"adapters\.merge"):
        zoo.quantize(adapted.eval(), "int8")
    twice = zoo.quantize(_model(FORMS["decoder"]), "bf16")
    with pytest.raises(zoo.ConfigError, match=r"already quantized \(weights='bf16'\)"):
        zoo.quantize(twice, "int8")


def test_int8_weights_decode_compiled_as_they_do_eagerly(trained):
    """Int8Linear is plain tensors and an aten kernel: it traces under torch.compile (for real here)."""
    model, prompts = trained
    quantized = zoo.quantize(copy.deepcopy(model), "int8")
    assert torch.equal(
        quantized.generate(prompts, 12, eos_token_id=None, compile=True),
        quantized.generate(prompts, 12, eos_token_id=None),
    )


@pytest.mark.parametrize("in_features", [48, 40])  # the kernel's widths (multiples of 16), and another
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_linear_computes_the_rounded_weights(in_features, dtype):
    linear = torch.nn.Linear(in_features, 24).to(dtype)
    int8 = Int8Linear.from_linear(linear)
    assert int8.packed == (in_features % 16 == 0) and int8.weight.dtype == torch.int8
    x = torch.randn(3, 5, in_features, dtype=dtype)
    rounded = int8.weight.float() * int8.scale.float()[:, None]  # what the layer holds
    # half a step of the row's absmax / 127, and the scale's own bfloat16 rounding (up to 2^-8 relative)
    assert (rounded - linear.weight.float()).abs().max() <= linear.weight.float().abs().max() * (1 / 254 + 1 / 256)
    expected = torch.nn.functional.linear(x.float(), rounded, linear.bias.float())
    with torch.no_grad():
        out = int8(x)
    assert out.dtype == dtype and out.shape == (3, 5, 24)
    torch.testing.assert_close(out.float(), expected, atol=0.05, rtol=0.02)  # bf16 activations in the kernel


def test_int8_of_a_bfloat16_model_generates():
    model = zoo.quantize(_model(FORMS["llama_like"]).to(torch.bfloat16), "int8")
    assert model.generate([[5, 6, 7]], 4, eos_token_id=None).shape == (1, 7)


def test_kv_cache_int8_sets_the_models_kv_dtype_and_none_changes_nothing():
    model = _model(FORMS["decoder"])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert zoo.quantize(model.train(), None) is model and not model.training and model.kv_dtype is None
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    zoo.quantize(model, None, kv_cache="int8")
    assert model.kv_dtype == "int8" and model.new_cache().self_attn[0].kv_dtype == "int8"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_int8_weights_and_kv_cache_keep_a_trained_models_tokens(trained):
    model, prompts = trained
    full = model.generate(prompts, 24, eos_token_id=None)
    both = zoo.quantize(copy.deepcopy(model), "int8", kv_cache="int8").generate(prompts, 24, eos_token_id=None)
    agree = (both == full).float().mean().item()
    assert agree >= 0.9, f"int8 weights and KV cache agreed with fp32 on {agree:.0%} of tokens"


def test_bench_script_tiny(tmp_path, trained):
    spec = importlib.util.spec_from_file_location("bench_quantize", BENCH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    ids = tmp_path / "ids.pt"
    torch.save(torch.randint(5, 128, (4, 12), generator=torch.Generator().manual_seed(0)), ids)
    out = tmp_path / "q.json"
    bench.main(
        [
            "--no-hf",
            "--layers",
            "1",
            "--d-model",
            "32",
            "--heads",
            "2",
            "--vocab",
            "128",
            "--batches",
            "1",
            "2",
            "--new-tokens",
            "3",
            "--rounds",
            "1",
            "--quality-tokens",
            "3",
            "--eval-ids",
            str(ids),
            "--json",
            str(out),
            "--compiled",
        ]
    )  # no compiled rows: test_int8_weights_decode_compiled… compiles
    saved = json.loads(out.read_text())
    names = [f"{p}{kv}" for p in ("fp32", "bf16", "int8") for kv in ("", " kv int8")]
    assert {(r["batch"], r["name"]) for r in saved["speed"]} == {(b, f"zoo {n}") for b in (1, 2) for n in names}
    assert "CUDA" in saved["skipped"]["int4"]  # this CPU build refuses int4, and the bench says why
    sizes = saved["kv_cache_bytes"]  # head_dim 16: int8 takes 16 + 4 bytes per head and position
    assert sizes["fp32 kv int8"] / sizes["fp32"] == 20 / 64 and sizes["bf16 kv int8"] / sizes["bf16"] == 20 / 32
    assert saved["quality"]["fp32"]["logits_max_abs_diff"] == 0 and saved["quality"]["int8"]["perplexity"] > 1
    model, prompts = trained  # the perplexity hook on its own: a trained model finds its pattern likely
    fp32, int8 = bench.perplexity(model, [prompts]), bench.perplexity(zoo.quantize(copy.deepcopy(model)), [prompts])
    assert fp32 < 3 and abs(int8 - fp32) < 0.1 * fp32
