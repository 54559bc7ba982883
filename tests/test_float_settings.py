"""Non-finite and out-of-range values are refused where they enter: every float field of ModelConfig
(walked from the dataclass, so a new one needs its range), every float a GGUF file is read for, the
translator's float settings and the seed, each in one line naming the field or key and its range."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_handed_sizes import tiny_gguf

import zoo
from tasks.cli.schemas import conf_dir
from tasks.cli.train.checks import check_composition
from tasks.cli.values import MAX_SEED, check_seed, check_values
from tasks.translator import TranslatorTask
from zoo.config import FLOAT_RANGES
from zoo.gguf.names import ARCHS
from zoo.gguf.reader import GGUFFile
from zoo.ranges import FloatRange

NON_FINITE = [math.nan, math.inf, -math.inf]


def float_fields() -> list[str]:
    hints = typing.get_type_hints(zoo.ModelConfig)
    return [
        f.name
        for f in dataclasses.fields(zoo.ModelConfig)
        if float in (typing.get_args(hints[f.name]) or (hints[f.name],))
    ]


def outside(allowed: FloatRange) -> list[float]:
    """Values just outside ``allowed``: its open ends, and a step beyond each end."""
    values = [allowed.low - 1.0]
    if allowed.low_open:
        values.append(allowed.low)
    if allowed.high != math.inf:
        values += [allowed.high + 1.0] + ([allowed.high] if allowed.high_open else [])
    return values


def _one_line(error: pytest.ExceptionInfo, *words: str) -> str:
    message = str(error.value)
    assert "\n" not in message and all(w in message for w in words), message
    return message


def test_every_float_field_has_a_range():
    assert sorted(FLOAT_RANGES) == sorted(float_fields())


@pytest.mark.parametrize("value", NON_FINITE, ids=str)
@pytest.mark.parametrize("field", float_fields())
def test_a_non_finite_float_field_is_refused(field, value):
    with pytest.raises(zoo.ConfigError) as error:
        zoo.ModelConfig(**{field: value}).validate()
    _one_line(error, f"{field}={value}", f"must {FLOAT_RANGES[field]}")


@pytest.mark.parametrize(
    ("field", "value"), [(field, value) for field in float_fields() for value in outside(FLOAT_RANGES[field])]
)
def test_an_out_of_range_float_field_is_refused(field, value):
    with pytest.raises(zoo.ConfigError) as error:
        zoo.ModelConfig(**{field: value}).validate()
    _one_line(error, f"{field}={value}", f"must {FLOAT_RANGES[field]}")


@pytest.mark.parametrize("field", float_fields())
def test_a_float_field_from_stored_data_is_refused_too(field):
    cfg = zoo.ModelConfig.from_dict({field: math.nan})  # a checkpoint's or a config.json's
    if getattr(cfg, field) is not None and not math.isnan(getattr(cfg, field)):
        return  # a setting no chosen component reads is reset to its default when read
    with pytest.raises(zoo.ConfigError, match=field):
        cfg.validate()


@pytest.mark.parametrize(
    ("field", "value"),
    [("dropout", 0.0), ("moe_aux_loss_coef", 0.0), ("moe_z_loss_coef", 0.0), ("rope_scaling_factor", 1.0)],
)
def test_the_closed_ends_of_a_range_are_taken(field, value):
    zoo.ModelConfig(**{field: value}, **({"ffn": "moe"} if field.startswith("moe") else {})).validate()


@pytest.mark.parametrize(
    "override",
    [
        "model.attn_softcap=inf",
        "model.final_softcap=inf",
        "model.rope_scaling_factor=nan",
        "model.moe_aux_loss_coef=inf",
        "model.norm_eps=-inf",
    ],
)
def test_zoo_train_refuses_them_at_composition(override):
    """Not at step 1 as a divergence that advises a lower learning rate: at composition, by name."""
    extra = {"moe": ["model.ffn=moe"], "rope_scaling": ["model.rope_scaling=linear"]}
    more = [o for key, os in extra.items() if key in override for o in os]
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=gpt_generator", override, *more])
    field, value = override.removeprefix("model.").split("=")
    with pytest.raises(zoo.ConfigError) as error:
        check_composition(cfg)
    _one_line(error, f"{field}={value} must {FLOAT_RANGES[field]}")


# ---- the seed and the translator's settings -------------------------------------------------------------
@pytest.mark.parametrize("seed", [2**70, 2**32, -1, 1.5, True, "seven"])
def test_a_seed_lightning_cannot_take_is_refused(seed):
    with pytest.raises(zoo.ConfigError) as error:
        check_values(OmegaConf.create({"seed": seed}))
    _one_line(error, f"seed={seed!r}", f"[0, {MAX_SEED}]")


@pytest.mark.parametrize("seed", [0, MAX_SEED, None])
def test_a_seed_in_range_passes(seed):
    check_seed(seed)


@pytest.mark.parametrize("value", NON_FINITE, ids=str)
@pytest.mark.parametrize("name", ["label_smoothing", "length_penalty"])
def test_the_translators_float_settings_are_finite(name, value):
    with pytest.raises(zoo.ConfigError) as error:
        TranslatorTask.check_settings({name: value}, zoo.get_config("t5-small"))
    _one_line(error, f"task.{name}={value} must")


# ---- GGUF: every float key read -------------------------------------------------------------------------
GGUF_FLOATS = {
    "llama.attention.layer_norm_rms_epsilon": [0.0, -1e-5],
    "llama.rope.freq_base": [0.0, -10000.0],
    "llama.rope.scale_linear": [0.5, 0.0, -2.0],
    "llama.rope.scaling.factor": [0.5, 0.0],
}


@pytest.mark.parametrize(
    ("key", "value"), [(k, v) for k, bad in GGUF_FLOATS.items() for v in [*NON_FINITE, *bad]], ids=str
)
def test_a_gguf_float_that_is_not_finite_or_in_range_is_refused(key, value, tmp_path):
    path = tiny_gguf(tmp_path / "m.gguf", {key: value})
    with pytest.raises(zoo.CheckpointError) as error:
        zoo.read_gguf(path)
    _one_line(error, str(path), f"{key}={value} must", "and finite")


def test_a_linear_rope_scale_in_range_is_read(tmp_path):
    got = zoo.read_gguf(tiny_gguf(tmp_path / "m.gguf", {"llama.rope.scale_linear": 2.0}))
    assert got.config.rope_scaling == "linear" and got.config.rope_scaling_factor == 2.0


def test_every_float_key_of_every_architecture_has_a_range():
    for name in ARCHS.names():
        for key in ARCHS.get(name).keys:
            assert key.kind != "float" or key.within is not None, (name, key)


@pytest.mark.parametrize("value", NON_FINITE, ids=str)
def test_the_reader_refuses_any_non_finite_float_and_score(value, tmp_path):
    """Gemma 2's soft-caps, GPT-2's epsilon and a vocabulary's scores go through the same getter."""
    path = tiny_gguf(tmp_path / "m.gguf", {"gemma2.attn_logit_softcapping": value})
    with GGUFFile(path) as f, pytest.raises(zoo.CheckpointError) as error:
        f.get("gemma2.attn_logit_softcapping", "float", None)
    _one_line(error, f"gemma2.attn_logit_softcapping={value} must be finite")
    tokens = ["<unk>", "a", *(f"t{i}" for i in range(38))]
    path = tiny_gguf(tmp_path / "v.gguf", tokens=tokens)
    import gguf

    reader = gguf.GGUFReader(path)
    field = reader.fields["tokenizer.ggml.scores"]
    data = bytearray(path.read_bytes())
    offset = int(field.parts[field.data[1]].ctypes.data - reader.data.ctypes.data)
    data[offset : offset + 4] = gguf.np.float32(value).tobytes()
    del reader, field
    path.write_bytes(bytes(data))
    with pytest.raises(zoo.CheckpointError) as error:
        zoo.read_gguf(path)
    _one_line(error, "tokenizer.ggml.scores[1]", "not a finite number")
