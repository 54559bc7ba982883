"""Component settings (issue 21, item 3): each registered component declares the ModelConfig fields
it reads beyond those every model reads (``reads``); one set away from its default that no chosen
component reads is refused in one line, never ignored. The walks go over the registries, so a new
component or a new setting is covered by declaring it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest
import torch
from conftest import tiny_config
from test_reliability import one_line_error, run

import zoo
from zoo.registry import MODELS, REGISTRIES, readers

GOVERNED = readers()
# a value away from the default for each setting (the walks below find who reads it)
VARIED = {
    "rope_base": 500.0,
    "rope_scaling": "linear",
    "rope_scaling_factor": 2.0,
    "rope_original_max_len": 32,
    "rel_buckets": 16,
    "rel_max_distance": 20,
    "gelu_approximate": "tanh",
    "window": 4,
    "dyt_alpha": 0.8,
    "window_pattern": "LG",
    "n_experts": 4,
    "moe_top_k": 1,
    "moe_renormalize": False,
    "moe_shared_expert": True,
    "moe_aux_loss_coef": 0.1,
    "moe_z_loss_coef": 0.01,
    "rope_base_global": 500.0,
    "embedding_norm": True,
}
SIZES = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "max_seq_len")


def test_every_setting_has_a_varied_value_and_is_a_field_and_no_size_is_governed():
    names = {f.name for f in dataclasses.fields(zoo.ModelConfig)}
    assert set(GOVERNED) == set(VARIED)
    assert set(GOVERNED) <= names
    assert not set(GOVERNED) & set(SIZES)
    assert GOVERNED["rope_base"] == [("position", "rope")]
    assert ("mask", "sliding_window") in GOVERNED["window"] and ("mask", "document") in GOVERNED["window"]


def _others(field: str, family: str) -> dict[str, list[str]]:
    """For each other family where some component reads ``field``: the names that do not."""
    families = {fam for fam, _ in GOVERNED[field]} - {family}
    return {fam: [n for n in REGISTRIES[fam].names() if (fam, n) not in GOVERNED[field]] for fam in families}


def _non_readers() -> Iterator[tuple[str, str, str]]:
    """(field, family, name) for each governed field and each component of a reading family that ignores it."""
    for field, who in GOVERNED.items():
        for family in dict.fromkeys(fam for fam, _ in who):
            for name in REGISTRIES[family].names():
                if (family, name) not in who:
                    yield field, family, name


def _choices(field: str, family: str, name: str) -> dict[str, str]:
    """``family=name``, and in every other family where a component reads ``field``, one that does not."""
    return {family: name, **{fam: names[0] for fam, names in _others(field, family).items()}}


@pytest.mark.parametrize(("field", "family", "name"), list(_non_readers()))
def test_a_setting_the_chosen_components_ignore_is_refused_in_one_line(field, family, name):
    value = VARIED[field]
    with pytest.raises(zoo.ConfigError) as error:
        tiny_config(**_choices(field, family, name), **{field: value}).validate()
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{field}={value!r} is read by ")
    assert f"{family}={name}" in message and "ignore" in message
    for reader_family, reader in GOVERNED[field]:
        assert f"{reader_family}={reader}" in message


def test_a_users_component_reads_what_it_declares_and_refuses_the_rest():
    zoo.register("position", "my_rope")(type("MyRoPE", (zoo.position.RoPE,), {}))  # inherits RoPE's reads
    zoo.register("position", "my_none")(type("MyNone", (zoo.position.Position,), {}))
    try:
        assert tiny_config(position="my_rope", rope_base=500.0).validate().rope_base == 500.0
        with pytest.raises(zoo.ConfigError, match=r"read by position=my_rope or position=rope only; position=my_none"):
            tiny_config(position="my_none", rope_base=500.0).validate()
        zoo.register("position", "typo")(type("Typo", (zoo.position.Position,), {"reads": frozenset({"rope_bse"})}))
        with pytest.raises(TypeError, match="position=typo declares it reads 'rope_bse', which is not a ModelConfig"):
            tiny_config().validate()
    finally:
        for name in ("my_rope", "my_none", "typo"):
            if name in REGISTRIES["position"]:
                REGISTRIES["position"].unregister(name)


# ---- the declared fields are the ones read --------------------------------------------------------
class Watched(zoo.ModelConfig):
    """A ModelConfig that notes the component settings read while a model is built and runs, but for
    those ``validate`` reads (it looks at every setting to refuse the ignored ones)."""

    read: set[str] = set()
    quiet = 0

    def __getattribute__(self, name: str):
        if name in GOVERNED and not Watched.quiet:
            Watched.read.add(name)
        return super().__getattribute__(name)

    def validate(self) -> zoo.ModelConfig:
        Watched.quiet += 1
        try:
            return super().validate()
        finally:
            Watched.quiet -= 1


def _settings_read(cfg: zoo.ModelConfig) -> set[str]:
    """The component settings a model of ``cfg`` reads while built and run forward, with every head
    its form allows (an encoder's masked-LM head and pooler), so that nothing goes unbuilt."""
    for heads in (dict(mlm_head=True, pooler=True), {}):
        watched = Watched(**{**cfg.to_dict(), **heads})
        try:
            watched.validate()
        except zoo.ConfigError:
            continue
        Watched.read = set()
        model = zoo.build_model(watched, seed=0).eval()
        inputs = watched.form.example_inputs(watched, length=40)
        if REGISTRIES["mask"].get(watched.resolved_mask).needs_prefix_len:
            inputs["prefix_len"] = 4
        with torch.no_grad():
            model(**inputs)
        return Watched.read
    raise AssertionError(f"no model of {cfg} builds")


def _readers() -> list[tuple[str, str, str]]:
    return [(field, family, name) for field, who in GOVERNED.items() for family, name in who]


COMPANIONS = {
    "window_pattern": {"window": 4},
    "rope_base_global": {"mask": "sliding_window", "window": 4, "window_pattern": "LG"},
}  # a setting that means something only beside another


@pytest.mark.parametrize(("field", "family", "name"), _readers())
def test_a_component_reads_the_settings_it_declares(field, family, name):
    cfg = tiny_config(**_choices(field, family, name), **{field: VARIED[field]}, **COMPANIONS.get(field, {}))
    assert field in _settings_read(cfg)


def _buildable(choices: dict[str, str]) -> zoo.ModelConfig:
    """A valid tiny config with ``choices``, trying each form where ``arch`` is not among them."""
    arches = [choices["arch"]] if "arch" in choices else REGISTRIES["arch"].names()
    for arch in arches:
        cfg = tiny_config(**{**choices, "arch": arch})
        try:
            return cfg.validate()
        except zoo.ConfigError:
            continue
    raise AssertionError(f"no form takes {choices}")


@pytest.mark.parametrize(("field", "family", "name"), list(_non_readers()))
def test_a_component_that_does_not_declare_a_setting_does_not_read_it(field, family, name):
    """What no chosen component declares is read by no code path of the model: the governed set is
    what the components actually read."""
    assert field not in _settings_read(_buildable(_choices(field, family, name)))


# ---- presets, stored configs, importers ----------------------------------------------------------
@pytest.mark.parametrize("name", zoo.list_models())
def test_every_preset_sets_only_what_its_components_read_and_builds(name):
    cfg = MODELS.get(name)()
    assert cfg.ignored_settings() == {}
    with torch.device("meta"):
        zoo.build_model(cfg)


@pytest.mark.parametrize("name", zoo.list_models())
def test_a_preset_under_another_component_drops_the_settings_that_one_ignores(name):
    """``model=gpt2 model/ffn=swiglu``: the preset's gelu_approximate falls away, not refused."""
    for family, registry in REGISTRIES.items():
        for component in registry.names():
            assert zoo.get_config(name, **{family: component}).ignored_settings() == {}


def test_an_override_the_components_ignore_stays_to_be_refused():
    with pytest.raises(zoo.ConfigError, match=r"rope_base=500000.0 is read by position=rope only; position=alibi"):
        zoo.get_config("llama-tiny", position="alibi", rope_base=5e5).validate()


def test_a_stored_config_drops_what_its_components_ignore():
    stored = {**zoo.get_config("gpt-tiny").to_dict(), "position": "alibi", "rope_base": 5e5, "window": 8}
    cfg = zoo.ModelConfig.from_dict(stored).validate()
    assert (cfg.rope_base, cfg.window) == (10000.0, None)
    with pytest.raises(zoo.ConfigError, match="rope_base=500000.0"):
        zoo.ModelConfig(**stored).validate()


def test_a_saved_folder_whose_config_holds_an_ignored_setting_still_loads(tmp_path):
    model = zoo.create_model("gpt-tiny", position="alibi", seed=0)
    zoo.save_pretrained(model, tmp_path)
    record = json.loads((tmp_path / "config.json").read_text())
    record["model"]["rope_base"] = 5e5  # written before the rule: the alibi model never read it
    (tmp_path / "config.json").write_text(json.dumps(record))
    loaded = zoo.load_pretrained(tmp_path)
    assert loaded.config.rope_base == 10000.0
    for a, b in zip(model.state_dict().values(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_every_hf_family_default_config_validates():
    transformers = pytest.importorskip("transformers")
    for model_type in zoo.hf.FAMILIES.names():
        cfg = zoo.from_hf_config(transformers.AutoConfig.for_model(model_type))
        assert cfg.ignored_settings() == {}, model_type


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [("gpt-tiny", {}), ("llama-tiny", {}), ("llama-tiny", dict(rope_scaling="linear", rope_scaling_factor=2.0))],
)
def test_a_gguf_file_reads_back_a_config_that_validates(preset, overrides, tmp_path):
    pytest.importorskip("gguf")
    model = zoo.create_model(preset, seed=0, **overrides)
    zoo.to_gguf(model, tmp_path / "m.gguf")
    cfg = zoo.from_gguf(tmp_path / "m.gguf").config
    assert cfg.ignored_settings() == {} and cfg.validate()
    assert {k: getattr(cfg, k) for k in overrides} == overrides


# ---- the verb ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_readme_example_is_one_line_through_zoo_train(tmp_path):
    done = run("train", "model/position=alibi", "model.rope_base=5e5", "trainer.max_steps=1", cwd=tmp_path)
    one_line_error(
        done,
        "ConfigError",
        "rope_base=500000.0 is read by position=rope only",
        "position=alibi ignores it: drop the override or choose position=rope",
    )
