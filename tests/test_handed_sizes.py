"""Sizes from a handed file or a setting are checked before anything is built: a GGUF header whose
counts (blocks, experts, heads, widths, vocabulary) disagree with its tensor table, a vocabulary token
of a megabyte, a model too large for the memory free to train it and a beam count no search needs are
each refused fast, in one line that names the key or setting."""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

import zoo
from tasks.cli.schemas import conf_dir
from tasks.cli.train.checks import check_composition, check_fits, parameter_estimate
from tasks.translator import TranslatorTask
from zoo.beam_search import MAX_BEAMS, check_beams

gguf = pytest.importorskip("gguf")

D, LAYERS, HEADS, KV_HEADS, FF, VOCAB, EXPERTS = 16, 2, 4, 2, 32, 40, 4
FAST = 5.0  # seconds: a refusal reads the header and the tensor table, nothing more


def tiny_gguf(path: Path, keys: dict | None = None, *, experts: int = 0, tokens: list[str] | None = None) -> Path:
    """A llama.cpp ``llama`` file of a tiny random model (Mixtral's expert tensors with ``experts``),
    its metadata ``keys`` replaced or added (an int as uint32, or uint64 past it; a float as float32),
    and with ``tokens`` a SentencePiece (``llama``) vocabulary."""
    meta: dict = {
        "llama.context_length": 64,
        "llama.embedding_length": D,
        "llama.block_count": LAYERS,
        "llama.feed_forward_length": FF,
        "llama.attention.head_count": HEADS,
        "llama.attention.head_count_kv": KV_HEADS,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.freq_base": 10000.0,
    }
    if experts:
        meta |= {"llama.expert_count": experts, "llama.expert_used_count": 2}
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in (meta | (keys or {})).items():
        if isinstance(value, float):
            w.add_float32(key, value)
        else:
            (w.add_uint64 if value >= 2**32 else w.add_uint32)(key, value)
    if tokens is not None:
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores([0.0] * len(tokens))
        w.add_token_types([1] * len(tokens))
        w.add_add_bos_token(False)
    rng = np.random.default_rng(0)

    def t(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    hd = D // HEADS
    w.add_tensor("token_embd.weight", t(VOCAB, D))
    for i in range(LAYERS):
        block = {
            "attn_norm": np.ones(D, np.float32),
            "attn_q": t(HEADS * hd, D),
            "attn_k": t(KV_HEADS * hd, D),
            "attn_v": t(KV_HEADS * hd, D),
            "attn_output": t(D, HEADS * hd),
            "ffn_norm": np.ones(D, np.float32),
        }
        if experts:
            block |= {
                "ffn_gate_inp": t(experts, D),
                "ffn_gate_exps": t(experts, FF, D),
                "ffn_up_exps": t(experts, FF, D),
                "ffn_down_exps": t(experts, D, FF),
            }
        else:
            block |= {"ffn_gate": t(FF, D), "ffn_up": t(FF, D), "ffn_down": t(D, FF)}
        for name, value in block.items():
            w.add_tensor(f"blk.{i}.{name}.weight", value)
    w.add_tensor("output_norm.weight", np.ones(D, np.float32))
    w.add_tensor("output.weight", t(VOCAB, D))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


@contextmanager
def fast(limit: float = FAST):
    started = time.perf_counter()
    yield
    assert time.perf_counter() - started < limit, f"took {time.perf_counter() - started:.1f} s"


def _refused(path: Path, *words: str) -> str:
    with fast(), pytest.raises(zoo.CheckpointError) as error:
        zoo.read_gguf(path)
    message = str(error.value)
    assert "\n" not in message and str(path) in message and all(w in message for w in words), message
    return message


# ---- GGUF headers whose counts lie ----------------------------------------------------------------------
def test_the_tiny_files_read(tmp_path):
    dense = zoo.read_gguf(tiny_gguf(tmp_path / "dense.gguf"))
    assert dense.config.n_layers == LAYERS and dense.config.vocab_size == VOCAB
    moe = zoo.read_gguf(tiny_gguf(tmp_path / "moe.gguf", experts=EXPERTS))
    assert moe.config.n_experts == EXPERTS and moe.config.moe_top_k == 2


@pytest.mark.parametrize(
    ("key", "value", "experts", "words"),
    [
        ("llama.block_count", 10**8, 0, ["llama.block_count=100000000", "holds blocks [0, 1]"]),
        ("llama.block_count", 2**40, 0, ["llama.block_count=1099511627776"]),
        ("llama.block_count", 3, 0, ["llama.block_count=3"]),
        ("llama.block_count", 1, 0, ["llama.block_count=1"]),
        ("llama.expert_count", 10**8, EXPERTS, ["llama.expert_count=100000000", "stacks 4"]),
        ("llama.expert_count", 5, EXPERTS, ["llama.expert_count=5"]),
        ("llama.expert_used_count", 10**8, EXPERTS, ["moe_top_k=100000000"]),
        ("llama.attention.head_count", 10**8, 0, ["llama.attention.head_count=100000000"]),
        ("llama.attention.head_count", 2**40, 0, ["llama.attention.head_count"]),
        ("llama.attention.head_count_kv", 10**8, 0, ["llama.attention.head_count_kv=100000000"]),
        ("llama.attention.key_length", 10**8, 0, ["llama.attention.key_length=100000000"]),
        ("llama.embedding_length", 10**8, 0, ["llama.embedding_length=100000000", "token_embd.weight"]),
        ("llama.embedding_length", 10**12 + 39, 0, ["llama.embedding_length"]),
        ("llama.feed_forward_length", 10**9, 0, ["llama.feed_forward_length=1000000000"]),
        ("llama.feed_forward_length", 33, 0, ["blk.0.ffn_gate.weight"]),
        ("llama.vocab_size", 10**8, 0, ["llama.vocab_size=100000000", "40 rows"]),
    ],
)
def test_a_header_count_that_disagrees_with_the_tensor_table_is_refused_fast(tmp_path, key, value, experts, words):
    _refused(tiny_gguf(tmp_path / "m.gguf", {key: value}, experts=experts), *words)


def test_a_dense_file_claiming_experts_is_refused(tmp_path):
    keys = {"llama.expert_count": 10**8, "llama.expert_used_count": 2}
    _refused(tiny_gguf(tmp_path / "m.gguf", keys), "llama.expert_count=100000000", "no blk.0.ffn_gate_exps.weight")


def test_a_context_length_is_informative_for_rope(tmp_path):
    """RoPE numbers any position: a long context_length lays out nothing (generation checks its memory)."""
    with fast():
        got = zoo.read_gguf(tiny_gguf(tmp_path / "m.gguf", {"llama.context_length": 10**12}))
    assert got.config.max_seq_len == 10**12


def test_a_megabyte_token_is_refused_before_the_tokenizer_is_built(tmp_path):
    tokens = ["<unk>", "a", "b", "a" * 1_000_000, *(f"t{i}" for i in range(VOCAB - 4))]
    _refused(tiny_gguf(tmp_path / "m.gguf", tokens=tokens), "tokenizer.ggml.tokens[3]", "1000000 characters")
    tokens[3] = "a" * 200  # long, but a vocabulary may hold it
    assert zoo.read_gguf(tiny_gguf(tmp_path / "ok.gguf", tokens=tokens)).tokenizer.get_vocab_size() == VOCAB


def test_divisors_of_a_huge_width_are_named_in_no_time():
    with fast(1.0), pytest.raises(zoo.ConfigError, match=r"n_heads=7 does not divide d_model=1000000000000"):
        zoo.ModelConfig(d_model=10**12, n_heads=7).validate()


# ---- a model too large for the memory free to train it -------------------------------------------------
def compose_train(*overrides: str, experiment: str = "gpt_generator"):
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose("train", overrides=[f"experiment={experiment}", *overrides])


@pytest.mark.parametrize(
    "override",
    [
        "model.n_experts=100000",
        "model.d_model=1048576",
        "model.n_layers=1000000",
        "model.vocab_size=4000000",
    ],
)
def test_a_model_that_cannot_fit_is_refused_at_composition_with_the_estimate(override, monkeypatch):
    monkeypatch.setattr("tasks.cli.train.checks.free_bytes", lambda device: 16 * 2**30)
    overrides = [override, "model.ffn=moe"] if "n_experts" in override else [override]
    if "vocab_size" in override:
        overrides.append("model.d_model=1024")
    cfg = compose_train(*overrides, "model.n_heads=8")
    with fast(15.0), pytest.raises(zoo.ConfigError) as error:
        check_composition(cfg)
    message = str(error.value)
    assert "\n" not in message and "GiB" in message and "free" in message and "parameters" in message, message
    assert override.split("=")[0] + "=" in message, message


def test_the_estimate_counts_a_deep_model_as_a_full_build_does():
    for cfg in (
        zoo.get_config("gpt-tiny", n_layers=12),
        zoo.get_config("t5-small", d_model=64, d_ff=128, n_heads=2, n_encoder_layers=10, n_decoder_layers=13),
        zoo.get_config("gpt-tiny", ffn="moe", n_experts=4, n_layers=9),
    ):
        assert parameter_estimate(cfg) == zoo.count_parameters(zoo.build_model(cfg))


def test_a_model_that_fits_passes_and_a_frozen_one_needs_its_weights_alone(monkeypatch):
    cfg = compose_train()
    check_composition(cfg)  # gpt-tiny fits anywhere
    model = zoo.get_config("gpt-tiny")
    params = parameter_estimate(model)
    monkeypatch.setattr("tasks.cli.train.checks.free_bytes", lambda device: params * 4 * 2)  # weights fit, training not
    with pytest.raises(zoo.ConfigError, match="16 bytes a parameter"):
        check_fits(cfg, model)
    lora = compose_train("adapter=lora", "init_from=somewhere")
    check_fits(lora, model)


# ---- beams ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("beams", [MAX_BEAMS + 1, 100_000, 2**70])
def test_num_beams_past_the_limit_is_refused(beams):
    with pytest.raises(zoo.ConfigError, match=f"num_beams={beams} is more than the {MAX_BEAMS} beams"):
        check_beams(beams, 32000, 64)
    model = zoo.get_config("t5-small")
    with pytest.raises(zoo.ConfigError, match=f"task.num_beams={beams}"):
        TranslatorTask.check_settings({"num_beams": beams, "max_new_tokens": 64}, model)


@pytest.mark.parametrize("setting", [{"num_beams": 0}, {"num_beams": 2.5}, {"num_beams": True}, {"max_new_tokens": -1}])
def test_translator_counts_are_whole_numbers(setting):
    with pytest.raises(zoo.ConfigError, match=f"task.{next(iter(setting))}="):
        TranslatorTask.check_settings(setting, zoo.get_config("t5-small"))


def test_translator_composition_refuses_huge_beams():
    cfg = compose_train("task.num_beams=100000", experiment="t5_translator")
    with fast(), pytest.raises(zoo.ConfigError, match="task.num_beams=100000"):
        check_composition(cfg)


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_generate_refuses_huge_beams_before_decoding(arch):
    model = zoo.build_model(zoo.ModelConfig(arch=arch, vocab_size=64, d_model=32, n_layers=1, n_heads=2))
    ids = zoo.models.torch.ones(1, 4, dtype=zoo.models.torch.long)
    with fast(), pytest.raises(zoo.ConfigError, match="num_beams=100000"):
        model.generate(ids, 8, num_beams=100_000)
    assert math.isfinite(model.generate(ids, 2, num_beams=4).float().sum().item())
