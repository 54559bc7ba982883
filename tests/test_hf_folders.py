"""Hugging Face model folders, both ways: ``zoo.from_hf(folder)`` reads what ``save_pretrained``
writes, ``zoo.to_hf`` writes what transformers' Auto classes load (no trust_remote_code), and
compositions no transformers class computes are refused before anything is written.

Everything is tiny and fp32 on CPU. Random weights use a large std (0.2; T5: initializer_factor 4.0
for generation, see tests/test_hf.py::_t5) so that greedy paths are not one token repeated (each
generation test checks that its paths vary, so it can fail), and biases and norm weights are moved
off their 0/1 init, so a bias or norm put in the wrong place changes the outputs.

The cases a review found wrong once are at the end of the file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import Tensor, nn

import zoo
from zoo.hf import FAMILIES

transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402  (after the importorskip)
from test_hf import NEW, VOCAB, _bert_config, _close, _gpt2_config, _llama_config, _t5_config  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402


def _tokens(*shape: int, seed: int = 1) -> Tensor:
    return torch.randint(3, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def _right_padded(batch: int = 2, length: int = 12) -> tuple[Tensor, Tensor]:
    ids = _tokens(batch, length)
    mask = torch.ones_like(ids)
    mask[1, length - 5 :] = 0  # the second row is 5 tokens shorter
    ids[mask == 0] = 0  # padding tokens (pad_token_id=0), as a tokenizer writes them
    return ids, mask


def _assert_varied(continuation: Tensor) -> None:
    for row in continuation.tolist():
        assert len(set(row)) > 1, f"degenerate greedy path {continuation.tolist()}"


# ---- tiny HF models --------------------------------------------------------------------------------
# _gpt2_config, _bert_config, _t5_config, _llama_config: tests/test_hf.py's (imported above)


def _build(cls: type, config, seed: int = 0) -> nn.Module:
    """A HF model with random weights; biases and norm weights (HF initialises them to 0 and 1) are
    moved off their init too, so that one put in the wrong place changes the outputs."""
    torch.manual_seed(seed)
    model = cls(config).eval()
    _perturb_vectors(model, seed)
    return model


def _perturb_vectors(model: nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for parameter in model.parameters():  # a tied tensor once
            if parameter.dim() == 1:
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator).to(parameter.dtype))


def _t5(version: str, init: float = 1.0) -> nn.Module:
    """As tests/test_hf.py::_t5: logits compared at init 1.0, generations at 4.0 (T5 does not scale
    its attention scores, so at 4.0 fp32 summation order alone moves logits by ~1e-3)."""
    if version == "v1.0":
        return _build(
            transformers.T5ForConditionalGeneration, _t5_config(feed_forward_proj="relu", initializer_factor=init)
        )
    hf = _build(
        transformers.T5ForConditionalGeneration,
        _t5_config(feed_forward_proj="gated-gelu", tie_word_embeddings=False, initializer_factor=init),
    )
    # transformers 5 builds the head tied even so (a checkpoint with its own lm_head unties it on load)
    hf.lm_head.weight = nn.Parameter(torch.randn(VOCAB, 64, generator=torch.Generator().manual_seed(3)))
    return hf


@dataclasses.dataclass(frozen=True)
class Spec:
    """A tiny HF model: how to build it, the Auto class that loads its folder, its kind of outputs."""

    build: Callable[[float], nn.Module]  # the argument is T5's initializer_factor (others ignore it)
    auto: str
    kind: str  # "causal", "mlm", "base" (BertModel), "seq2seq"


HF = {
    "gpt2": Spec(lambda init: _build(transformers.GPT2LMHeadModel, _gpt2_config()), "AutoModelForCausalLM", "causal"),
    "bert_mlm": Spec(lambda init: _build(transformers.BertForMaskedLM, _bert_config()), "AutoModelForMaskedLM", "mlm"),
    "bert_base": Spec(lambda init: _build(transformers.BertModel, _bert_config()), "AutoModel", "base"),
    "t5_v1.0": Spec(lambda init: _t5("v1.0", init), "AutoModelForSeq2SeqLM", "seq2seq"),
    "t5_v1.1": Spec(lambda init: _t5("v1.1", init), "AutoModelForSeq2SeqLM", "seq2seq"),
    "llama_gqa": Spec(
        lambda init: _build(transformers.LlamaForCausalLM, _llama_config()), "AutoModelForCausalLM", "causal"
    ),
    "qwen2_untied": Spec(
        lambda init: _build(transformers.Qwen2ForCausalLM, _llama_config(transformers.Qwen2Config)),
        "AutoModelForCausalLM",
        "causal",
    ),
    "qwen2_tied": Spec(
        lambda init: _build(
            transformers.Qwen2ForCausalLM, _llama_config(transformers.Qwen2Config, tie_word_embeddings=True)
        ),
        "AutoModelForCausalLM",
        "causal",
    ),
}


def _compare(kind: str, model: zoo.ZooModel, hf: nn.Module) -> None:
    """zoo's outputs equal HF's on a right-padded batch, at the positions that hold tokens."""
    ids, mask = _right_padded()
    keep = mask.bool()
    with torch.no_grad():
        if kind == "causal":
            _close(model(ids, mask)[keep], hf(ids, attention_mask=mask).logits[keep])
        elif kind == "mlm":
            _close(model.mlm_logits(model(ids, mask))[keep], hf(ids, attention_mask=mask).logits[keep])
        elif kind == "base":
            out = hf(ids, attention_mask=mask)
            hidden = model(ids, mask)
            _close(hidden[keep], out.last_hidden_state[keep])
            _close(model.pool(hidden), out.pooler_output)
        else:  # seq2seq: a padded source, a target prefix
            tgt = _tokens(2, 7, seed=2)
            expected = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=tgt).logits
            _close(model(ids, tgt, attention_mask=mask), expected)


def _silent_from_hf(source) -> zoo.ZooModel:
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="zoo")  # an LM or base model converts without a word
        return zoo.from_hf(source)


def _same_state(a: zoo.ZooModel, b: zoo.ZooModel) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].dtype == sb[key].dtype, key
        assert torch.equal(sa[key], sb[key]), key


# ---- 1. reading folders ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(HF))
def test_folder_reads_as_the_loaded_model(name, tmp_path):
    spec = HF[name]
    hf = spec.build(1.0)
    hf.save_pretrained(tmp_path)
    model = _silent_from_hf(tmp_path)
    assert not model.training
    _compare(spec.kind, model, hf)
    from_module = _silent_from_hf(hf)
    assert model.config == from_module.config
    _same_state(model, from_module)


def test_folder_with_pytorch_model_bin(tmp_path):
    """transformers 5's save_pretrained writes safetensors only (safe_serialization is gone), so the
    weights are written as 4.x did with safe_serialization=False: torch.save of the state dict, where
    the tied head shares the embedding's storage."""
    hf = HF["gpt2"].build(1.0)
    hf.config.save_pretrained(tmp_path)
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "pytorch_model.bin"]
    model = _silent_from_hf(tmp_path)
    assert model.config.tie_embeddings
    _compare("causal", model, hf)
    _same_state(model, zoo.from_hf(hf))


def test_sharded_folder(tmp_path):
    hf = HF["llama_gqa"].build(1.0)
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) >= 2 and (tmp_path / "model.safetensors.index.json").is_file()
    assert not (tmp_path / "model.safetensors").exists()
    model = _silent_from_hf(tmp_path)
    _compare("causal", model, hf)
    _same_state(model, zoo.from_hf(hf))


def test_bf16_folder_reads_as_float32_unless_told(tmp_path):
    hf = HF["llama_gqa"].build(1.0).to(torch.bfloat16)
    hf.save_pretrained(tmp_path)
    assert zoo.hf.stored_dtypes(tmp_path) == {torch.bfloat16}
    model = _silent_from_hf(tmp_path)
    assert {t.dtype for t in model.state_dict().values() if t.is_floating_point()} == {torch.float32}
    kept = zoo.from_hf(tmp_path, dtype=None)
    assert {t.dtype for t in kept.state_dict().values() if t.is_floating_point()} == {torch.bfloat16}
    _same_state(kept, zoo.from_hf(hf, dtype=None))
    _same_state(model, kept.float())  # the cast is exact: bf16 values are float32 values
    from tasks.cli.pretrained import pretrained_source

    assert pretrained_source(str(tmp_path)).loaded() == ", bfloat16 weights read as float32"  # init_from's line


# ---- 2. config defaults -------------------------------------------------------------------------------
CONFIG_CLASSES = {
    "bert": "BertConfig",
    "gpt2": "GPT2Config",
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "qwen2": "Qwen2Config",
    "t5": "T5Config",
}


def _hf_default(cls: type, key: str):
    """The HF config class's default for ``key``, as a config.json that leaves it out means it.

    - transformers 5 keeps RoPE's base in ``rope_parameters["rope_theta"]`` (4.x: a ``rope_theta``
      attribute); compare with whichever the class has.
    - A few fields are derived in ``__post_init__`` from a ``None`` default (Llama's
      ``num_key_value_heads`` becomes ``num_attention_heads``, T5's ``num_decoder_layers`` becomes
      ``num_layers``): the meaningful default is the declared field default, which zoo derives the
      same way; the instance's derived value is the one of the default sizes only.
    - Raises AttributeError where the class has no such setting."""
    instance = cls()
    if key == "rope_theta" and getattr(instance, "rope_parameters", None):
        return instance.rope_parameters["rope_theta"]
    fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    if key in fields and fields[key].default is not dataclasses.MISSING:
        return fields[key].default
    return getattr(instance, key)


@pytest.mark.parametrize("name", FAMILIES.names())
def test_family_defaults_are_transformers_defaults(name):
    assert name in CONFIG_CLASSES, f"HF family {name!r} is registered but has no config class here"
    cls = getattr(transformers, CONFIG_CLASSES[name])
    defaults = dict(FAMILIES.get(name).defaults)
    assert defaults, f"{name} declares no defaults, so a config.json that leaves them out cannot be read"
    absent, wrong = [], []
    for key, value in defaults.items():
        try:
            expected = _hf_default(cls, key)
        except AttributeError:
            absent.append(key)
            continue
        if expected != value:
            wrong.append(f"{key}: zoo {value!r}, {cls.__name__} {expected!r}")
    assert not wrong, f"{name}: defaults differ from transformers': {wrong}"
    # A key the HF class does not have (transformers 5's T5Config has no decoder_start_token_id,
    # Qwen2Config no attention_bias/mlp_bias) must not change what zoo reads.
    full = zoo.from_hf_config(SimpleNamespace(model_type=name, **defaults))
    without = {k: v for k, v in defaults.items() if k not in absent}
    assert zoo.from_hf_config(SimpleNamespace(model_type=name, **without)) == full, absent
    # The defaults alone read into the same model as the HF class's default config.
    assert full == zoo.from_hf_config(cls())


# config.json files written by hand, leaving every other setting to the class's defaults
SPARSE = {
    "gpt2": (
        "GPT2Config",
        {
            "n_layer": 2,
            "n_embd": 64,
            "n_head": 4,
            "vocab_size": VOCAB,
            "n_positions": 64,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    "bert": (
        "BertConfig",
        {
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "vocab_size": VOCAB,
            "max_position_embeddings": 64,
        },
    ),
    "t5": ("T5Config", {"num_layers": 2, "d_model": 64, "num_heads": 4, "d_kv": 32, "d_ff": 128, "vocab_size": VOCAB}),
    # transformers 4.x wrote v1.1 as tie_word_embeddings=false (no scale_decoder_outputs)
    "t5_v1.1_4x": (
        "T5Config",
        {
            "num_layers": 2,
            "num_decoder_layers": 1,
            "d_model": 64,
            "num_heads": 4,
            "d_kv": 16,
            "d_ff": 96,
            "vocab_size": VOCAB,
            "feed_forward_proj": "gated-gelu",
            "tie_word_embeddings": False,
        },
    ),
    "llama": (
        "LlamaConfig",
        {
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 96,
            "vocab_size": VOCAB,
        },
    ),
    # transformers 4.x wrote RoPE's base as a top-level rope_theta
    "llama_4x_rope_theta": (
        "LlamaConfig",
        {
            "num_hidden_layers": 1,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "intermediate_size": 96,
            "vocab_size": VOCAB,
            "rope_theta": 500.0,
        },
    ),
    "qwen2": (
        "Qwen2Config",
        {
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 96,
            "vocab_size": VOCAB,
            "tie_word_embeddings": True,
        },
    ),
}


@pytest.mark.parametrize("case", list(SPARSE))
def test_sparse_config_json_reads_as_transformers_does(case, tmp_path):
    class_name, keys = SPARSE[case]
    cls = getattr(transformers, class_name)
    model_type = cls.model_type
    hf_config = cls(**keys)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, **keys}))
    read = zoo.hf.folder.read_config(tmp_path)
    assert zoo.from_hf_config(read) == zoo.from_hf_config(hf_config)
    if case == "llama_4x_rope_theta":
        assert zoo.from_hf_config(read).rope_base == 500.0  # not the default 10000
    if case == "t5_v1.1_4x":
        cfg = zoo.from_hf_config(read)
        assert (cfg.tie_embeddings, cfg.logit_scale, cfg.ffn) == (False, 1.0, "geglu")


# ---- 3. writing ---------------------------------------------------------------------------------------
_WEIGHT_PROBLEM = re.compile(r"MISSING|UNEXPECTED|MISMATCH|newly initiali[sz]ed|were not used|not initiali[sz]ed")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _load_clean(auto: str, folder: Path) -> nn.Module:
    """``Auto*.from_pretrained(folder)`` (no trust_remote_code), failing on any transformers report
    of a missing, unexpected, mismatched or newly initialised weight. transformers logs through its
    own "transformers" logger, which does not propagate to the root (caplog would miss it), so a
    handler is attached there at WARNING verbosity.

    Other warnings pass: transformers 5 warns that a T5 v1.1 folder (untied head) has an
    lm_head different from ``shared``, also for the folders it writes itself."""
    records = _Records()
    logger = logging.getLogger("transformers")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    logger.addHandler(records)
    try:
        hf, info = getattr(transformers, auto).from_pretrained(folder, output_loading_info=True)
    finally:
        logger.removeHandler(records)
        hf_logging.set_verbosity(verbosity)
    problems = [m for m in records.messages if _WEIGHT_PROBLEM.search(m)]
    problems += [f"{key}: {sorted(value)}" for key, value in info.items() if value]
    assert not problems, f"{auto}.from_pretrained({folder}) reported weight problems: {problems}"
    return hf.eval()


def _hf_generate(hf: nn.Module, ids: Tensor, mask: Tensor | None = None) -> Tensor:
    hf.generation_config.eos_token_id = None  # run all NEW steps, as zoo does with eos_token_id=None
    hf.generation_config.pad_token_id = 0
    with torch.no_grad():
        return hf.generate(
            ids,
            attention_mask=torch.ones_like(ids) if mask is None else mask,
            do_sample=False,
            num_beams=1,
            max_new_tokens=NEW,
        )


def _compare_generation(model: zoo.ZooModel, hf: nn.Module) -> None:
    """Greedy continuations agree: a decoder on a left-padded batch (HF derives positions from the
    attention mask while generating), an encoder-decoder on a right-padded source."""
    if model.config.form.cross_attention:
        src, mask = _right_padded(2, 9)
        expected = _hf_generate(hf, src, mask)
        got = model.generate(src, attention_mask=mask, max_new_tokens=NEW, eos_token_id=None)
        assert got[:, 0].tolist() == [model.config.decoder_start_token_id] * 2
        assert got.tolist() == expected.tolist()
        _assert_varied(got[:, 1:])
        return
    ids = _tokens(2, 7, seed=4)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    ids[mask == 0] = 0
    expected = _hf_generate(hf, ids, mask)
    got = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=None)
    assert got.tolist() == expected.tolist()
    _assert_varied(got[:, ids.shape[1] :])


def _check_written(model: zoo.ZooModel, folder: Path, architecture: str) -> None:
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == [architecture]
    assert config["model_type"] == zoo.hf.hf_exportable(model.config)
    generates = type(model).decoding is not None
    assert (folder / "generation_config.json").is_file() is generates
    if generates:
        written = transformers.GenerationConfig.from_pretrained(folder)
        assert written.eos_token_id == model.config.eos_token_id
        assert written.pad_token_id == model.config.pad_token_id
        if model.config.form.cross_attention:
            assert written.decoder_start_token_id == model.config.decoder_start_token_id


@pytest.mark.parametrize("name", list(HF))
def test_converted_model_writes_a_folder_transformers_loads(name, tmp_path):
    spec = HF[name]
    model = zoo.from_hf(spec.build(1.0))
    architecture = zoo.hf.to_hf(model, tmp_path / "out")
    _check_written(model, tmp_path / "out", architecture)
    hf = _load_clean(spec.auto, tmp_path / "out")
    assert type(hf).__name__ == architecture
    _compare(spec.kind, model, hf)
    if spec.kind in ("causal", "seq2seq"):
        model = zoo.from_hf(spec.build(4.0)) if spec.kind == "seq2seq" else model
        zoo.hf.to_hf(model, tmp_path / "gen")
        _compare_generation(model, _load_clean(spec.auto, tmp_path / "gen"))


_TINY = dict(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq_len=64, init_std=0.2)
_GPT = dict(_TINY, arch="decoder", position="learned", norm="layernorm", norm_placement="pre", ffn="gelu", bias=True)
_LLAMA = dict(
    _TINY,
    arch="decoder",
    position="rope",
    norm="rmsnorm",
    norm_placement="pre",
    ffn="swiglu",
    n_kv_heads=2,
    d_ff=96,
    tie_embeddings=False,
    eos_token_id=2,
)
_BERT = dict(
    _TINY,
    arch="encoder",
    position="learned",
    norm="layernorm",
    norm_placement="post",
    ffn="gelu",
    bias=True,
    norm_eps=1e-12,
)
_T5 = dict(
    _TINY,
    arch="encoder_decoder",
    position="t5_relative",
    norm="rmsnorm",
    norm_placement="pre",
    bias=False,
    attn_scale=1.0,
    max_seq_len=None,
    norm_eps=1e-6,
    init_std=0.5,
    head_dim=32,
    eos_token_id=1,
)

NATIVE = {  # zoo-native compositions that fit a family: name -> (config, Auto class, kind, family)
    "gpt2_gelu_erf": (dict(_GPT, gelu_approximate="none"), "AutoModelForCausalLM", "causal", "gpt2"),
    "gpt2_relu_untied": (
        dict(_GPT, ffn="relu", tie_embeddings=False, attn_scale=1.0),
        "AutoModelForCausalLM",
        "causal",
        "gpt2",
    ),
    "llama_gqa": (_LLAMA, "AutoModelForCausalLM", "causal", "llama"),
    "llama_bias_tied_linear_rope": (
        dict(
            _LLAMA,
            bias=True,
            tie_embeddings=True,
            rope_base=500.0,
            rope_scaling="linear",
            rope_scaling_factor=2.0,
            head_dim=32,
        ),
        "AutoModelForCausalLM",
        "causal",
        "llama",
    ),
    "qwen2": (dict(_LLAMA, qkv_bias=True), "AutoModelForCausalLM", "causal", "qwen2"),
    # post-LayerNorm, learned positions, no segments: HF gets a zero token-type table
    "bert_pooler": (dict(_BERT, type_vocab_size=0, pooler=True), "AutoModel", "base", "bert"),
    "bert_mlm": (
        dict(_BERT, type_vocab_size=2, mlm_head=True, gelu_approximate="tanh"),
        "AutoModelForMaskedLM",
        "mlm",
        "bert",
    ),
    "t5_v1.0": (
        dict(_T5, ffn="relu", tie_embeddings=True, logit_scale=64**-0.5),
        "AutoModelForSeq2SeqLM",
        "seq2seq",
        "t5",
    ),
    "t5_gated_silu": (dict(_T5, ffn="swiglu", tie_embeddings=False), "AutoModelForSeq2SeqLM", "seq2seq", "t5"),
    "t5_v1.1_split_depth": (
        dict(
            _T5,
            ffn="geglu",
            gelu_approximate="tanh",
            tie_embeddings=False,
            n_encoder_layers=2,
            n_decoder_layers=1,
            rel_buckets=16,
            rel_max_distance=20,
        ),
        "AutoModelForSeq2SeqLM",
        "seq2seq",
        "t5",
    ),
}


def _native(values: dict, seed: int = 0) -> zoo.ZooModel:
    """A zoo model built from a config, every bias and norm weight then moved off its 0/1 init."""
    model = zoo.build_model(zoo.ModelConfig(**values), seed=seed).eval()
    _perturb_vectors(model, seed)
    return model


PRESETS = {  # zoo.create_model(preset, **overrides) -> (family, transformers class, Auto class, kind)
    "gpt-tiny": (
        dict(d_model=64, vocab_size=VOCAB, max_seq_len=64, init_std=0.2),
        "GPT2LMHeadModel",
        "AutoModelForCausalLM",
        "causal",
    ),
    "llama-tiny": (
        dict(d_model=64, d_ff=96, vocab_size=VOCAB, max_seq_len=64, init_std=0.2),
        "LlamaForCausalLM",
        "AutoModelForCausalLM",
        "causal",
    ),
    "bert-tiny": (
        dict(d_model=64, d_ff=128, vocab_size=VOCAB, max_seq_len=64, init_std=0.2),
        "BertModel",
        "AutoModel",
        "base",
    ),
    "t5-tiny": (
        dict(vocab_size=VOCAB, d_ff=256, init_std=0.5),
        "T5ForConditionalGeneration",
        "AutoModelForSeq2SeqLM",
        "seq2seq",
    ),
}


@pytest.mark.parametrize("preset", list(PRESETS))
def test_preset_exports_as_is(preset, tmp_path):
    """A preset's composition (GPT-2's GELU tanh -> gelu_new, T5's scaled tied head, ...) exports unchanged."""
    overrides, architecture, auto, kind = PRESETS[preset]
    model = zoo.create_model(preset, seed=0, **overrides).eval()
    _perturb_vectors(model, 0)
    assert zoo.hf.to_hf(model, tmp_path / "out") == architecture == zoo.hf.family_class(model.config)
    hf = _load_clean(auto, tmp_path / "out")
    _compare(kind, model, hf)
    if kind != "base":
        _compare_generation(model, hf)


@pytest.mark.parametrize("name", list(NATIVE))
def test_native_model_writes_a_folder_transformers_loads(name, tmp_path):
    values, auto, kind, family = NATIVE[name]
    model = _native(values)
    assert zoo.hf.hf_exportable(model.config) == family
    architecture = zoo.hf.to_hf(model, tmp_path / "out", files={"README.md": "# tiny\n"})
    assert (tmp_path / "out" / "README.md").read_text() == "# tiny\n"
    _check_written(model, tmp_path / "out", architecture)
    hf = _load_clean(auto, tmp_path / "out")
    assert type(hf).__name__ == architecture
    _compare(kind, model, hf)
    if kind in ("causal", "seq2seq"):
        _compare_generation(model, hf)
    # and back: the same config and weights (BERT without segments reads its zero token-type table)
    back = _silent_from_hf(tmp_path / "out")
    expected = _resolved(model.config)
    if model.config.arch == "encoder" and not model.config.type_vocab_size:
        expected = expected.replace(type_vocab_size=1)
        assert torch.equal(back.segment.weight, torch.zeros(1, 64))
        back.segment = None
    assert _resolved(back.config) == expected
    _same_state(model, back)


def _resolved(cfg: zoo.ModelConfig) -> zoo.ModelConfig:
    """attn_dropout=None means "= dropout"; HF configs store the number."""
    return cfg.replace(attn_dropout=cfg.dropout if cfg.attn_dropout is None else cfg.attn_dropout)


def test_a_missing_weight_is_detected(tmp_path):
    """The load check above fails when the written file lacks a weight (transformers then initialises it)."""
    model = _native(NATIVE["llama_gqa"][0])
    zoo.hf.to_hf(model, tmp_path / "out")
    file = tmp_path / "out" / "model.safetensors"
    tensors = load_file(file)
    del tensors["model.layers.1.post_attention_layernorm.weight"]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(AssertionError, match="post_attention_layernorm"):
        _load_clean("AutoModelForCausalLM", tmp_path / "out")


def test_an_unexpected_weight_is_detected(tmp_path):
    model = _native(NATIVE["gpt2_gelu_erf"][0])
    zoo.hf.to_hf(model, tmp_path / "out")
    file = tmp_path / "out" / "model.safetensors"
    save_file({**load_file(file), "transformer.extra.weight": torch.zeros(3)}, file, metadata={"format": "pt"})
    with pytest.raises(AssertionError, match="transformer.extra.weight"):
        _load_clean("AutoModelForCausalLM", tmp_path / "out")


def test_classifier_exports_as_bert_for_sequence_classification(tmp_path):
    model = _native(dict(_BERT, type_vocab_size=2, pooler=True))
    head = nn.Linear(64, 3)
    with torch.no_grad():
        head.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(7))
        head.bias.normal_(0, 0.5, generator=torch.Generator().manual_seed(8))
    written = zoo.hf.to_hf(model, tmp_path / "out", classifier=head, label_names=["a", "b", "c"])
    assert written == "BertForSequenceClassification"
    hf = _load_clean("AutoModelForSequenceClassification", tmp_path / "out")
    assert type(hf).__name__ == written
    assert hf.config.id2label == {0: "a", 1: "b", 2: "c"}
    assert hf.config.label2id == {"a": 0, "b": 1, "c": 2}
    ids, mask = _right_padded()
    segments = torch.zeros_like(ids)
    segments[:, 6:] = 1
    with torch.no_grad():
        expected = head(model.pool(model(ids, mask, segments)))
        _close(hf(ids, attention_mask=mask, token_type_ids=segments).logits, expected)
    assert expected.std() > 0.1  # the logits depend on the input: the comparison can fail


def test_bf16_model_writes_bf16(tmp_path):
    model = _native(NATIVE["llama_gqa"][0]).to(torch.bfloat16)
    zoo.hf.to_hf(model, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert {t.dtype for t in load_file(tmp_path / "out" / "model.safetensors").values()} == {torch.bfloat16}
    _same_state(model, zoo.from_hf(tmp_path / "out", dtype=None))


# ---- 4. round trip ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(HF))
def test_round_trip_keeps_every_tensor(name, tmp_path):
    """HF folder -> zoo -> HF folder: the same tensors under the same names, tied weights saved once
    in both files, and the reloaded HF model equal to the original."""
    spec = HF[name]
    hf = spec.build(1.0)
    hf.save_pretrained(tmp_path / "hf")
    zoo.hf.to_hf(zoo.from_hf(tmp_path / "hf"), tmp_path / "zoo")
    original = load_file(tmp_path / "hf" / "model.safetensors")
    written = load_file(tmp_path / "zoo" / "model.safetensors")
    assert written.keys() == original.keys()
    for key in original:
        assert torch.equal(written[key], original[key]), key
    again = _load_clean(spec.auto, tmp_path / "zoo")
    state, expected = again.state_dict(), hf.state_dict()
    assert state.keys() == expected.keys()
    for key in expected:
        assert torch.equal(state[key], expected[key]), key


# ---- 5. refusals --------------------------------------------------------------------------------------
REFUSED = {  # a composition no transformers class computes -> the setting the message must name
    "alibi": (dict(_LLAMA, position="alibi"), "position=alibi"),
    "post_norm_llama": (dict(_LLAMA, norm_placement="post"), "norm_placement=post"),
    "learned_rmsnorm_decoder": (dict(_GPT, norm="rmsnorm"), "norm=rmsnorm"),
    "prefix_mask": (dict(_GPT, mask="prefix"), "mask=prefix"),
    "sandwich_norm": (dict(_LLAMA, norm_placement="sandwich"), "norm_placement=sandwich"),
    "encoder_decoder_rope": (
        dict(_T5, position="rope", attn_scale=None, logit_scale=1.0, tie_embeddings=False, ffn="relu"),
        "position=rope",
    ),
    "sinusoidal_encoder": (dict(_BERT, position="sinusoidal", max_seq_len=None), "position=sinusoidal"),
    "ntk_rope": (dict(_LLAMA, rope_scaling="ntk", rope_scaling_factor=2.0), "rope_scaling=ntk"),
    "scaled_embeddings": (dict(_GPT, embed_scale=8.0), "embed_scale=8.0"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_unexportable_composition_is_refused_before_writing(name, tmp_path):
    values, field = REFUSED[name]
    registered = zoo.list_components()
    for key in ("position", "norm_placement", "mask"):
        if key in values:
            assert values[key] in registered[key], f"{key}={values[key]} is no longer registered; update the test"
    model = zoo.build_model(zoo.ModelConfig(**values), seed=0)
    with pytest.raises(zoo.ConfigError) as refused:
        zoo.hf.hf_exportable(model.config)
    message = str(refused.value)
    assert field in message and "format=safetensors" in message and "onnx" in message, message
    with pytest.raises(zoo.ConfigError, match=re.escape(field)):
        zoo.hf.to_hf(model, tmp_path / "out")
    with pytest.raises(zoo.ConfigError, match=re.escape(field)):
        zoo.hf.family_class(model.config)
    assert list(tmp_path.iterdir()) == []  # no folder, no temporary sibling


def test_existing_folder_is_not_overwritten(tmp_path):
    model = _native(NATIVE["gpt2_gelu_erf"][0])
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="out"):
        zoo.hf.to_hf(model, out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary sibling left
    (tmp_path / "file").write_text("a file")
    with pytest.raises(FileExistsError):
        zoo.hf.to_hf(model, tmp_path / "file")
    assert (tmp_path / "file").read_text() == "a file"


def test_existing_empty_folder_is_filled(tmp_path):
    model = _native(NATIVE["gpt2_gelu_erf"][0])
    (tmp_path / "out").mkdir()
    zoo.hf.to_hf(model, tmp_path / "out")
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    """A failure while the folder is being written (here: the disk fills up at the weights) removes
    the temporary folder: no target folder appears."""
    import safetensors.torch

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    model = _native(NATIVE["gpt2_gelu_erf"][0])
    with pytest.raises(OSError):
        zoo.hf.to_hf(model, tmp_path / "out", files={"README.md": "x"})
    assert list(tmp_path.iterdir()) == []


def test_check_sees_the_finished_folder_and_can_veto_it(tmp_path):
    model = _native(NATIVE["llama_gqa"][0])
    seen: list[list[str]] = []

    def veto(folder: Path) -> None:
        seen.append(sorted(p.name for p in folder.iterdir()))
        _compare("causal", model, _load_clean("AutoModelForCausalLM", folder))  # the folder loads as it will
        raise RuntimeError("vetoed")

    with pytest.raises(RuntimeError, match="vetoed"):
        zoo.hf.to_hf(model, tmp_path / "out", check=veto)
    assert seen == [["config.json", "generation_config.json", "model.safetensors"]]
    assert list(tmp_path.iterdir()) == []
    written = zoo.hf.to_hf(model, tmp_path / "out", check=lambda folder: None)
    assert written == zoo.hf.family_class(model.config) == "LlamaForCausalLM"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_classifier_needs_the_pooler(tmp_path):
    model = _native(dict(_BERT, type_vocab_size=2, pooler=False, mlm_head=True))
    with pytest.raises(zoo.ConfigError, match="pooler"):
        zoo.hf.to_hf(model, tmp_path / "out", classifier=nn.Linear(64, 3), label_names=["a", "b", "c"])
    assert list(tmp_path.iterdir()) == []


def test_classifier_on_a_decoder_is_refused(tmp_path):
    model = _native(NATIVE["gpt2_gelu_erf"][0])
    with pytest.raises(zoo.ConfigError):
        zoo.hf.to_hf(model, tmp_path / "out", classifier=nn.Linear(64, 3))
    assert list(tmp_path.iterdir()) == []


# ---- 6. errors reading --------------------------------------------------------------------------------
@pytest.fixture
def gpt2_folder(tmp_path) -> Path:
    HF["gpt2"].build(1.0).save_pretrained(tmp_path / "hf")
    return tmp_path / "hf"


def test_folder_without_config(gpt2_folder):
    (gpt2_folder / "config.json").unlink()
    with pytest.raises(zoo.CheckpointError, match="config.json"):
        zoo.from_hf(gpt2_folder)


def test_folder_with_damaged_config(gpt2_folder):
    (gpt2_folder / "config.json").write_text('{"model_type": "gpt2", ')
    with pytest.raises(zoo.CheckpointError, match="config.json"):
        zoo.from_hf(gpt2_folder)


@pytest.mark.parametrize("model_type", ["bart", None])
def test_folder_with_unknown_model_type(gpt2_folder, model_type):
    config = json.loads((gpt2_folder / "config.json").read_text())
    config.pop("model_type")
    if model_type:
        config["model_type"] = model_type
    (gpt2_folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(zoo.CheckpointError, match=rf"config\.json.*model_type={model_type!r}.*bert, gpt2"):
        zoo.from_hf(gpt2_folder)


def test_folder_without_weights(gpt2_folder):
    (gpt2_folder / "model.safetensors").unlink()
    with pytest.raises(zoo.CheckpointError, match="model.safetensors"):
        zoo.from_hf(gpt2_folder)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_folder_with_damaged_safetensors(gpt2_folder, damage):
    file = gpt2_folder / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(
        {"garbage": b"\x00not safetensors" * 64, "truncated": data[: len(data) // 2], "empty": b""}[damage]
    )
    with pytest.raises(zoo.CheckpointError, match=re.escape(str(file))):
        zoo.from_hf(gpt2_folder)


def test_folder_with_damaged_pytorch_model_bin(gpt2_folder):
    (gpt2_folder / "model.safetensors").unlink()
    file = gpt2_folder / "pytorch_model.bin"
    torch.save(HF["gpt2"].build(1.0).state_dict(), file)
    file.write_bytes(file.read_bytes()[:1000])  # cut short
    with pytest.raises(zoo.CheckpointError, match="pytorch_model.bin"):
        zoo.from_hf(gpt2_folder)


def test_sharded_folder_with_a_missing_shard(tmp_path):
    HF["llama_gqa"].build(1.0).save_pretrained(tmp_path, max_shard_size="40KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(zoo.CheckpointError, match=re.escape(shard.name)):
        zoo.from_hf(tmp_path)


def test_folder_missing_a_backbone_tensor_names_it(gpt2_folder):
    file = gpt2_folder / "model.safetensors"
    tensors = load_file(file)
    del tensors["transformer.h.1.mlp.c_fc.weight"]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=re.escape("transformer.h.1.mlp.c_fc.weight")):
        zoo.from_hf(gpt2_folder)


def test_is_hf_folder(gpt2_folder, tmp_path):
    assert zoo.hf.is_hf_folder(gpt2_folder)
    assert not zoo.hf.is_hf_folder(tmp_path)  # no config.json
    (tmp_path / "config.json").write_text('{"arch": "decoder"}')  # zoo's own config: no model_type
    assert not zoo.hf.is_hf_folder(tmp_path)


def test_hub_id_offline_fails_fast_with_a_checkpoint_error(monkeypatch):
    pytest.importorskip("huggingface_hub")
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # the hub reads HF_HUB_OFFLINE when it is imported (transformers imported it already)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)
    with pytest.raises(zoo.CheckpointError, match=r"hf:zoo-test-org/no-such-model.*online"):
        zoo.from_hf("hf:zoo-test-org/no-such-model")


# ---- what a review found wrong in zoo/hf once, fixed -------------------------------------------------
def _refused_or_loads_clean(write: Callable[[], str], tmp_path: Path, auto: str) -> nn.Module | None:
    """Either a ConfigError/ValueError with nothing written, or a folder transformers loads with no
    missing or unexpected weight; the loaded model, or None when refused."""
    try:
        write()
    except ValueError:  # ConfigError is a ValueError
        assert list(tmp_path.iterdir()) == []
        return None
    return _load_clean(auto, tmp_path / "out")


def test_bert_without_pooler_or_mlm_head(tmp_path):
    model = _native(dict(_BERT, type_vocab_size=2))
    hf = _refused_or_loads_clean(lambda: zoo.hf.to_hf(model, tmp_path / "out"), tmp_path, "AutoModel")
    if hf is not None:
        ids, mask = _right_padded()
        keep = mask.bool()
        with torch.no_grad():
            _close(model(ids, mask)[keep], hf(ids, attention_mask=mask).last_hidden_state[keep])


def test_bert_with_pooler_and_mlm_head(tmp_path):
    model = _native(dict(_BERT, type_vocab_size=2, pooler=True, mlm_head=True))
    hf = _refused_or_loads_clean(lambda: zoo.hf.to_hf(model, tmp_path / "out"), tmp_path, "AutoModelForMaskedLM")
    if hf is not None:
        _compare("mlm", model, hf)


def test_classifier_over_an_encoder_with_mlm_head(tmp_path):
    model = _native(dict(_BERT, type_vocab_size=2, pooler=True, mlm_head=True))
    head = nn.Linear(64, 3)
    hf = _refused_or_loads_clean(
        lambda: zoo.hf.to_hf(model, tmp_path / "out", classifier=head), tmp_path, "AutoModelForSequenceClassification"
    )
    if hf is not None:
        ids, mask = _right_padded()
        with torch.no_grad():
            _close(hf(ids, attention_mask=mask).logits, head(model.pool(model(ids, mask))))


def test_qwen2_with_its_own_head_dim(tmp_path):
    model = _native(dict(NATIVE["qwen2"][0], head_dim=32))
    hf = _refused_or_loads_clean(lambda: zoo.hf.to_hf(model, tmp_path / "out"), tmp_path, "AutoModelForCausalLM")
    if hf is not None:
        _compare("causal", model, hf)


def test_label_names_must_match_the_classifier(tmp_path):
    model = _native(dict(_BERT, type_vocab_size=2, pooler=True))
    with pytest.raises(ValueError, match="label"):
        zoo.hf.to_hf(model, tmp_path / "out", classifier=nn.Linear(64, 3), label_names=["a", "b"])
    assert list(tmp_path.iterdir()) == []


def test_classifier_width_must_be_d_model(tmp_path):
    model = _native(dict(_BERT, type_vocab_size=2, pooler=True))
    with pytest.raises(ValueError, match="classifier|in_features|d_model"):
        zoo.hf.to_hf(model, tmp_path / "out", classifier=nn.Linear(32, 3))
    assert list(tmp_path.iterdir()) == []


def test_classifier_without_bias(tmp_path):
    model = _native(dict(_BERT, type_vocab_size=2, pooler=True))
    with pytest.raises(ValueError, match="bias"):  # BertForSequenceClassification's classifier has one
        zoo.hf.to_hf(model, tmp_path / "out", classifier=nn.Linear(64, 3, bias=False))
    assert list(tmp_path.iterdir()) == []


def test_extra_files_stay_inside_the_folder(tmp_path):
    model = _native(NATIVE["gpt2_gelu_erf"][0])
    with pytest.raises(ValueError):
        zoo.hf.to_hf(model, tmp_path / "out", files={"../escape.txt": "x"})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage", ["config_is_a_list", "index_map_is_a_list", "bin_is_a_list"])
def test_folder_files_of_the_wrong_shape(gpt2_folder, damage):
    if damage == "config_is_a_list":
        file = gpt2_folder / "config.json"
        file.write_text("[1, 2]")
    elif damage == "index_map_is_a_list":
        (gpt2_folder / "model.safetensors").unlink()
        file = gpt2_folder / "model.safetensors.index.json"
        file.write_text(json.dumps({"weight_map": ["model.safetensors"]}))
    else:
        (gpt2_folder / "model.safetensors").unlink()
        file = gpt2_folder / "pytorch_model.bin"
        torch.save([torch.zeros(1)], file)
    with pytest.raises(zoo.CheckpointError, match=re.escape(file.name)):
        zoo.from_hf(gpt2_folder)


@pytest.mark.parametrize("source", ["./no-such-folder", Path("runs/no-such-folder")])
def test_missing_local_path_is_not_a_hub_id(source, tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    import huggingface_hub.constants

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)
    with pytest.raises(zoo.CheckpointError) as error:
        zoo.from_hf(source)
    assert "hub" not in str(error.value), str(error.value)
