"""ModernBERT as a zoo.hf family, both ways: masked-LM logits equal transformers' (ModernBertForMaskedLM)
for every kind of ``layer_types``, biases and activation, read from a model, a saved folder or a config.json
of before transformers 5; what zoo writes reads back in transformers with equal logits; what no zoo
setting computes is refused in one line. And the two settings it needed, on zoo's own models:
``rope_base_global`` (a window_pattern's global layers rotate by their own base) and ``embedding_norm``
(pre-norm whose first attention norm moves onto the embeddings)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from conftest import tiny_config, tiny_model
from torch import nn

import zoo
from zoo.io import CheckpointError
from zoo.position import RoPE

transformers = pytest.importorskip("transformers")

from hf_folder_models import _build, _load_clean, _native  # noqa: E402  (after the importorskip)

VOCAB, LENGTH = 100, 24


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)


def _config(**kw) -> transformers.ModernBertConfig:
    """4 layers (every third global: G L L G), a window of |i - j| <= 4 at 24 positions."""
    values = dict(
        num_hidden_layers=4,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=96,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        local_attention=8,
        initializer_range=0.2,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=1,
        cls_token_id=1,
        sep_token_id=2,
    )
    return transformers.ModernBertConfig(**{**values, **kw})


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, VOCAB, (2, LENGTH), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, LENGTH - 7 :] = 0  # the second row is 7 tokens shorter
    ids[mask == 0] = 0
    return ids, mask


def _same_mlm(model: zoo.ZooModel, hf: nn.Module) -> None:
    ids, mask = _inputs()
    keep = mask.bool()
    with torch.no_grad():
        _close(model.mlm_logits(model(ids, mask))[keep], hf(ids, attention_mask=mask).logits[keep])


def _silent(source) -> zoo.ZooModel:
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="zoo")  # an MLM or bare model converts without a word
        return zoo.from_hf(source)


# ---- reading --------------------------------------------------------------------------------------
THETAS = {"full_attention": {"rope_theta": 160000.0}, "sliding_attention": {"rope_theta": 10000.0}}
VARIANTS = {  # name -> (HF settings, what zoo reads: mask, window, window_pattern, rope_base, rope_base_global)
    "every_third_global": ({}, ("sliding_window", 5, "GLL", 10000.0, 160000.0)),
    "every_second_global": (dict(global_attn_every_n_layers=2), ("sliding_window", 5, "GL", 10000.0, 160000.0)),
    "all_global": (dict(layer_types=["full_attention"] * 4), (None, None, None, 160000.0, None)),
    "all_windowed": (dict(layer_types=["sliding_attention"] * 4), ("sliding_window", 5, None, 10000.0, None)),
    "one_base": (
        dict(rope_parameters={k: {"rope_theta": 500.0} for k in THETAS}),
        ("sliding_window", 5, "GLL", 500.0, None),
    ),
    "linear_rope": (
        dict(rope_parameters={k: {**v, "rope_type": "linear", "factor": 2.0} for k, v in THETAS.items()}),
        ("sliding_window", 5, "GLL", 10000.0, 160000.0),
    ),
    "biases_tanh_eager": (
        dict(
            attention_bias=True,
            mlp_bias=True,
            norm_bias=True,
            classifier_bias=True,
            hidden_activation="gelu_pytorch_tanh",
            classifier_activation="gelu_pytorch_tanh",
            attn_implementation="eager",
        ),
        ("sliding_window", 5, "GLL", 10000.0, 160000.0),
    ),
    "swiglu_no_decoder_bias": (
        dict(hidden_activation="silu", decoder_bias=False, local_attention=5),
        ("sliding_window", 3, "GLL", 10000.0, 160000.0),
    ),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_mlm_logits_equal_transformers(name):
    settings, read = VARIANTS[name]
    hf = _build(transformers.ModernBertForMaskedLM, _config(**settings))
    model = _silent(hf)
    cfg = model.config
    assert (cfg.mask, cfg.window, cfg.window_pattern, cfg.rope_base, cfg.rope_base_global) == read
    assert (cfg.arch, cfg.norm_placement, cfg.embedding_norm, cfg.mlm_head) == ("encoder", "pre", True, True)
    # zoo's head always has the dense and decoder biases (read as zeros where HF has none)
    extra = (0 if settings.get("classifier_bias") else 64) + (0 if settings.get("decoder_bias", True) else VOCAB)
    assert zoo.count_parameters(model) == sum(p.numel() for p in hf.parameters()) + extra
    _same_mlm(model, hf)


def test_the_global_base_the_window_and_the_pattern_are_each_needed():
    hf = _build(transformers.ModernBertForMaskedLM, _config())
    model = zoo.from_hf(hf)
    ids, mask = _inputs()
    expected = hf(ids, attention_mask=mask).logits[mask.bool()]
    for change in (dict(rope_base_global=None), dict(window=9), dict(window_pattern="LGL")):
        other = zoo.build_model(model.config.replace(**change)).eval()
        other.load_state_dict(model.state_dict())
        with torch.no_grad():
            assert not torch.allclose(other.mlm_logits(other(ids, mask))[mask.bool()], expected, atol=1e-3), change


def test_a_bare_model_gives_equal_hidden_states_and_a_task_model_its_backbone():
    hf = _build(transformers.ModernBertModel, _config())
    model = _silent(hf)
    assert not model.config.mlm_head
    ids, mask = _inputs()
    with torch.no_grad():
        _close(model(ids, mask)[mask.bool()], hf(ids, attention_mask=mask).last_hidden_state[mask.bool()])
    classifier = _build(transformers.ModernBertForSequenceClassification, _config(num_labels=3))
    with pytest.warns(UserWarning, match=r"task head \(classifier, head\.dense, head\.norm\) is not part"):
        backbone = zoo.from_hf(classifier)
    assert not backbone.config.mlm_head


def test_a_saved_folder_and_a_config_json_of_before_transformers_5_read_alike(tmp_path):
    hf = _build(transformers.ModernBertForMaskedLM, _config())
    hf.save_pretrained(tmp_path / "new")
    model = _silent(tmp_path / "new")
    _same_mlm(model, hf)
    record = json.loads((tmp_path / "new" / "config.json").read_text())
    assert record["layer_types"] and record["rope_parameters"]
    for key in ("layer_types", "rope_parameters"):  # 4.x wrote the pattern and the bases as plain numbers
        del record[key]
    record |= dict(global_attn_every_n_layers=3, global_rope_theta=160000.0, local_rope_theta=10000.0)
    (tmp_path / "new" / "config.json").write_text(json.dumps(record))
    assert zoo.from_hf(tmp_path / "new").config == model.config


# ---- writing --------------------------------------------------------------------------------------
NATIVE = dict(
    vocab_size=VOCAB,
    d_model=64,
    n_layers=4,
    n_heads=4,
    d_ff=96,
    max_seq_len=64,
    init_std=0.2,
    arch="encoder",
    position="rope",
    norm="layernorm",
    norm_placement="pre",
    embedding_norm=True,
    ffn="geglu",
    mask="sliding_window",
    window=4,
    window_pattern="LGL",
    rope_base_global=2000.0,
    mlm_head=True,
    attn_dropout=0.0,  # as config.json writes it back
)


@pytest.mark.parametrize(
    "change", [{}, dict(bias=True, gelu_approximate="tanh", window_pattern=None, rope_base_global=None)]
)
def test_what_zoo_writes_reads_back_in_transformers_with_equal_logits(change, tmp_path):
    model = _native({**NATIVE, **change})
    assert zoo.hf_exportable(model.config) == "modernbert"
    assert zoo.to_hf(model, tmp_path / "mlm") == "ModernBertForMaskedLM"
    hf = _load_clean("AutoModelForMaskedLM", tmp_path / "mlm")
    assert hf.config.local_attention // 2 + 1 == 4
    _same_mlm(model, hf)
    back = zoo.from_hf(tmp_path / "mlm")
    assert back.config == model.config
    bare = _native({**NATIVE, **change, "mlm_head": False})
    assert zoo.to_hf(bare, tmp_path / "bare") == "ModernBertModel"
    ids, mask = _inputs()
    with torch.no_grad():
        expected = _load_clean("AutoModel", tmp_path / "bare")(ids, attention_mask=mask).last_hidden_state
        _close(bare(ids, mask)[mask.bool()], expected[mask.bool()])


def test_a_transformers_model_round_trips_through_zoo(tmp_path):
    hf = _build(transformers.ModernBertForMaskedLM, _config(decoder_bias=False))
    zoo.to_hf(zoo.from_hf(hf), tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["layer_types"] == list(hf.config.layer_types)
    assert written["rope_parameters"]["full_attention"]["rope_theta"] == 160000.0
    assert (written["decoder_bias"], written["classifier_bias"]) == (True, True)  # written as zeros
    _same_mlm(zoo.from_hf(tmp_path), hf)
    _same_mlm(zoo.from_hf(hf), _load_clean("AutoModelForMaskedLM", tmp_path))


# ---- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(attention_bias=True), r"attention_bias=True, mlp_bias=False, norm_bias=False is not supported"),
        (dict(classifier_activation="gelu_pytorch_tanh"), r"classifier_activation='gelu_pytorch_tanh' with hidden_"),
        (dict(hidden_activation="relu"), r"hidden_activation: activation 'relu' \(gated\) has no zoo FFN"),
        (dict(layer_types=["full_attention", "chunked_attention"] * 2), r"layer_types=\['full_attention', 'chunked_"),
        (
            dict(rope_parameters={**THETAS, "full_attention": {"rope_type": "linear", "factor": 2.0}}),
            r"rope_parameters scale the full_attention and sliding_attention layers differently",
        ),
        (
            dict(rope_parameters={k: {"rope_type": "dynamic", "factor": 2.0} for k in THETAS}),
            r"rope_type='dynamic' is not supported",
        ),
    ],
)
def test_what_zoo_cannot_read_is_refused_in_one_line(settings, message):
    with pytest.raises(ValueError, match=message) as error:
        zoo.from_hf_config(_config(**settings))
    assert "\n" not in str(error.value)


def test_an_untied_decoder_is_refused():
    hf = _build(transformers.ModernBertForMaskedLM, _config(tie_word_embeddings=False))
    hf.decoder.weight = nn.Parameter(torch.randn(VOCAB, 64))
    with pytest.raises(CheckpointError, match="masked-LM decoder is not tied to the word embeddings"):
        zoo.from_hf(hf)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (dict(embedding_norm=False), "embedding_norm"),
        (dict(pooler=True), "pooler"),
        (dict(n_kv_heads=2), "n_kv_heads"),
        (dict(norm="rmsnorm"), "norm"),
        (dict(mask="prefix", window=None, window_pattern=None, rope_base_global=None), "mask"),
        (dict(value_residual=True), "value_residual"),
    ],
)
def test_what_modernbert_cannot_compute_is_refused_in_one_line(change, field, tmp_path):
    cfg = zoo.ModelConfig(**NATIVE)
    unfit = zoo.hf.FAMILIES.get("modernbert").unfit
    assert unfit(cfg) == []
    assert [p.split("=")[0] for p in unfit(cfg.replace(**change))] == [field]
    with pytest.raises(zoo.ConfigError, match="Export it with format=safetensors") as error:
        zoo.hf_exportable(cfg.replace(**change))
    assert "\n" not in str(error.value)
    with pytest.raises(zoo.ConfigError, match="no sequence-classification class"):
        zoo.to_hf(_native(NATIVE), tmp_path, classifier=nn.Linear(64, 2))
    assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize(
    ("family", "change"), [("llama", dict(embedding_norm=True)), ("gemma2", dict(rope_base_global=5e5))]
)
def test_no_other_family_claims_the_new_settings(family, change):
    cfg = zoo.from_hf_config(transformers.AutoConfig.for_model(family))
    assert zoo.hf_exportable(cfg) == family
    field = next(iter(change))
    with pytest.raises(zoo.ConfigError, match=f"{field}={change[field]}"):
        zoo.hf_exportable(cfg.replace(**change).validate())


# ---- rope_base_global ----------------------------------------------------------------------------------
def test_global_layers_rotate_by_their_own_base():
    positions = torch.arange(9)
    rope = RoPE(16, 10000.0, global_base=500.0)
    local = rope.rotary(positions)
    wide = rope.global_rotary(positions, local)
    for a, b, c in zip(wide, RoPE(16, 500.0).rotary(positions), local, strict=True):
        torch.testing.assert_close(a, b)
        assert not torch.allclose(a, c)
    assert RoPE(16).global_rotary(positions, local) is local  # no base of its own: the others' rotary


@pytest.mark.parametrize("arch", ["encoder", "decoder"])
def test_a_global_layer_equals_a_stack_with_that_base(arch):
    """One global layer (pattern GL over one layer) with rope_base_global=500 computes what the same
    weights compute with rope_base=500, and not what they compute with the local base."""
    common = dict(arch=arch, n_layers=1, mask="sliding_window", window=16)
    x = torch.randint(0, 61, (2, 12))
    with torch.no_grad():
        patterned = tiny_model(**common, window_pattern="GL", rope_base_global=500.0)(x)
        same_base = tiny_model(**common, rope_base=500.0)(x)
        local_base = tiny_model(**common)(x)
    torch.testing.assert_close(patterned, same_base)
    assert not torch.allclose(patterned, local_base, atol=1e-4)


def test_cached_decoding_under_a_global_base_equals_full_recompute():
    model = tiny_model(n_layers=4, mask="sliding_window", window=3, window_pattern="LG", rope_base_global=500.0)
    prompt = torch.randint(0, 61, (3, 5))
    cached = model.generate(prompt, max_new_tokens=12, eos_token_id=None)
    assert torch.equal(cached, model.generate(prompt, max_new_tokens=12, eos_token_id=None, use_cache=False))


@pytest.mark.parametrize("kernel", ["math", "flex"])
def test_every_kernel_agrees_with_sdpa_on_a_modernbert_composition(kernel):
    values = {**NATIVE, "vocab_size": 61}
    ids, mask = torch.randint(0, 61, (2, 11)), torch.ones(2, 11, dtype=torch.long)
    mask[0, 7:] = 0
    with torch.no_grad():
        expected = _native(values)(ids, mask)
        torch.testing.assert_close(_native({**values, "attention": kernel})(ids, mask), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (dict(position="alibi"), r"^rope_base_global=500.0 is read by position=rope only; position=alibi ignores"),
        (dict(), r"^rope_base_global=500.0 is the base of a window_pattern's global \(G\) layers and window_pattern="),
        (dict(mask="sliding_window", window=3, window_pattern="L"), r"^rope_base_global=500.0 .* window_pattern='L'"),
        (dict(rope_base_global=-1.0, mask="sliding_window", window=3, window_pattern="LG"), r"^rope_base_global=-1.0"),
    ],
)
def test_a_global_base_where_it_does_not_apply_is_refused_in_one_line(values, message):
    with pytest.raises(zoo.ConfigError, match=message) as error:
        tiny_config(**{"rope_base_global": 500.0, **values}).validate()
    assert "\n" not in str(error.value)


# ---- embedding_norm --------------------------------------------------------------------------------
def test_the_residual_stream_carries_the_normalised_embeddings_into_an_unnormalised_first_attention():
    model = tiny_model(arch="encoder", n_layers=3, norm="layernorm", embedding_norm=True)
    plain = tiny_model(arch="encoder", n_layers=3, norm="layernorm")
    stack = model.encoder
    assert isinstance(stack.blocks[0].attn_res.norm, nn.Identity) and plain.encoder.embed_norm is None
    assert [type(b.attn_res.norm).__name__ for b in stack.blocks[1:]] == ["LayerNorm", "LayerNorm"]
    assert zoo.count_parameters(model) == zoo.count_parameters(plain)  # the first attention norm moved
    seen = {}
    stack.blocks[0].register_forward_pre_hook(lambda m, args: seen.update(stream=args[0]))
    stack.blocks[0].attn.register_forward_pre_hook(lambda m, args: seen.update(attention=args[0]))
    x = torch.randint(0, 61, (2, 9))
    with torch.no_grad():
        stack.embed_norm.weight.uniform_(0.5, 1.5)
        model(x)
        normalised = stack.embed_norm(model.embed_tokens(x))
    torch.testing.assert_close(seen["stream"], normalised)
    torch.testing.assert_close(seen["attention"], normalised)


@pytest.mark.parametrize("placement", ["post", "sandwich", "res_post"])
def test_embedding_norm_beside_another_placement_is_refused_in_one_line(placement):
    with pytest.raises(zoo.ConfigError) as error:
        tiny_config(norm_placement=placement, embedding_norm=True).validate()
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"embedding_norm=True is read by norm_placement=pre only; norm_placement={placement}")
