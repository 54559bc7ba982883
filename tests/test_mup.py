"""muP as a model setting (issue 47, items 1 and 2): ``mup_base_d_model`` is a typed, validated model
field that zoo-train composes; a muP model at its base width is the standard one; hidden matrices are
drawn and trained by the width ratio, the logits multiplied by base/width, the attention scale 1/hd
where the head grows; the library's optimizer and zoo-train's have the same groups; a saved model
reloads as muP; HF and GGUF exports fold the multipliers and transformers computes the same logits;
and the coordinate check: activations move as far at width 512 as at 64 under muP, and not under the
standard parametrization."""

from __future__ import annotations

import importlib.util
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import tiny_config

import zoo
from tasks import GeneratorTask
from tasks.optim import build_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/ as a checkout runs it
from scripts.mup.coord_check import growth, movement  # noqa: E402

ADAMW = {"name": "adamw", "lr": 1e-2, "weight_decay": 0.1, "betas": [0.9, 0.95]}
FORMS = {
    "decoder": {},
    "encoder_decoder": {"arch": "encoder_decoder"},
    "encoder": {"arch": "encoder", "mlm_head": True, "pooler": True, "norm_placement": "post", "norm": "layernorm"},
    "decoder_moe": {"ffn": "moe", "n_experts": 4},
}


def _logits(model: zoo.ZooModel, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    out = model(**inputs)
    return model.mlm_logits(out) if model.config.arch == "encoder" else out


# ---- the setting ---------------------------------------------------------------------------------
def test_zoo_train_composes_it_as_a_typed_model_key_and_a_bad_value_is_one_line():
    from hydra import compose, initialize_config_dir

    from tasks.cli.schemas import conf_dir, model_config, register_configs

    register_configs()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("train", overrides=["model.mup_base_d_model=32", "model.d_model=128"])
        assert model_config(cfg.model).validate().mup_base_d_model == 32
        with pytest.raises(Exception, match="mup_base_d_model"):
            compose("train", overrides=["model.mup_base_d_model=wide"])
    for bad in (0, -64):
        with pytest.raises(zoo.ConfigError, match=rf"^mup_base_d_model={bad} must be a positive integer$"):
            tiny_config(mup_base_d_model=bad).validate()
    with pytest.raises(zoo.ConfigError, match="mup_base_d_model=64.0 is a float"):
        zoo.ModelConfig.from_dict({"mup_base_d_model": 64.0})


@pytest.mark.parametrize("form", FORMS)
def test_at_its_base_width_a_mup_model_is_the_standard_one(form):
    standard = zoo.build_model(tiny_config(**FORMS[form]), seed=0).eval()
    mup = zoo.build_model(tiny_config(**FORMS[form], mup_base_d_model=32), seed=0).eval()
    for (name, a), b in zip(standard.state_dict().items(), mup.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    inputs = standard.config.form.example_inputs(standard.config)
    with torch.no_grad():
        assert torch.equal(_logits(standard, inputs), _logits(mup, inputs))


@pytest.mark.parametrize("form", FORMS)
def test_hidden_matrices_are_drawn_by_the_width_ratio_and_the_logits_multiplied(form):
    cfg = tiny_config(**FORMS[form], d_model=128, n_heads=4, init_std=0.02)
    standard = zoo.build_model(cfg, seed=0).eval()
    mup = zoo.build_model(cfg.replace(mup_base_d_model=32), seed=0).eval()
    groups = mup.mup_groups()
    assert mup.mup_width == 4.0 and groups["hidden"]
    assert bool(groups["readout"]) == (form == "decoder_moe")
    state, scaled = dict(standard.named_parameters()), {id(p): n for n, p in mup.named_parameters()}
    factors = {**{id(p): 0.5 for p in groups["hidden"]}, **{id(p): 0.25 for p in groups["readout"]}}
    for name, p in mup.named_parameters():  # the same draws, times sqrt(1/m) (hidden) or 1/m (readout)
        torch.testing.assert_close(p, state[name] * factors.get(id(p), 1.0), msg=name)
    assert {scaled[id(p)] for p in groups["readout"]} <= {n for n in scaled.values() if "router" in n}
    # the logits: base/width times what the standard model computes from the same final hidden state
    hidden = torch.randn(2, 5, 128)
    if form == "encoder":
        standard.load_state_dict(mup.state_dict())
        torch.testing.assert_close(
            mup.mlm_logits(hidden) - mup.mlm_head.bias, (standard.mlm_logits(hidden) - mup.mlm_head.bias) / 4
        )
    else:
        torch.testing.assert_close(mup.logits(hidden), standard.logits(hidden) / 4)


def test_the_attention_scale_is_one_over_hd_where_the_head_grows_and_one_over_sqrt_where_heads_multiply():
    grows = zoo.build_model(tiny_config(d_model=128, n_heads=4, mup_base_d_model=32))  # hd 32, 8 at the base
    fixed = zoo.build_model(tiny_config(d_model=128, n_heads=8, head_dim=16, mup_base_d_model=32))
    t5 = zoo.build_model(tiny_config(d_model=128, n_heads=4, attn_scale=1.0, mup_base_d_model=32))
    assert grows.decoder.blocks[0].attn.scale == pytest.approx(math.sqrt(8) / 32)
    assert fixed.decoder.blocks[0].attn.scale == pytest.approx(1 / 4)
    assert t5.decoder.blocks[0].attn.scale == pytest.approx(0.5)  # attn_scale times sqrt(hd_base / hd)


# ---- the optimizer: one set of groups for the library and zoo-train ------------------------------
def _groups(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> list[tuple[str | None, float, set[str]]]:
    names = {id(p): n.removeprefix("model.") for n, p in model.named_parameters()}
    return [(g.get("name"), g["lr"], {names[id(p)] for p in g["params"]}) for g in optimizer.param_groups]


@pytest.mark.parametrize("settings", [ADAMW, {**ADAMW, "name": "muon"}], ids=["adamw", "muon"])
def test_the_library_and_zoo_train_give_the_same_groups_with_the_lrs_muP_asks(settings):
    cfg = zoo.get_config("llama-tiny", d_model=256, n_heads=4, mup_base_d_model=64, ffn="moe", n_experts=4)
    model = zoo.create_model("llama-tiny", d_model=256, n_heads=4, mup_base_d_model=64, ffn="moe", n_experts=4)
    library = _groups(build_optimizer(model, settings), model)
    task = GeneratorTask(model=cfg.to_dict(), optimizer=settings)
    trained = _groups(build_optimizer(task, task.optimizer_settings), task)  # as configure_optimizers does
    assert library == trained
    lrs = {name: lr for name, lr, _ in library}
    if settings["name"] == "adamw":  # m = 4: hidden and router at lr / 4
        assert lrs["adamw_mup_hidden"] == lrs["adamw_mup_readout"] == pytest.approx(1e-2 / 4)
    else:  # match_rms_adamw: lr / sqrt(m) for hidden Muon matrices, lr / m for the router; experts AdamW's
        assert lrs["muon_mup_hidden"] == pytest.approx(1e-2 / 2) and lrs["muon_mup_readout"] == pytest.approx(1e-2 / 4)
        assert lrs["adamw_mup_hidden"] == pytest.approx(1e-2 / 4)
    unscaled = {n for name, lr, params in library if lr == settings["lr"] for n in params}
    assert {"embed.weight", "lm_head.weight", "decoder.final_norm.weight"} <= unscaled
    assert not any(".blocks." in n and n.endswith(("qkv.weight", "fc.weight", "router.weight")) for n in unscaled)


def test_without_mup_the_groups_are_those_of_before():
    model = zoo.create_model("llama-tiny")
    assert len(build_optimizer(model, ADAMW).param_groups) == 2
    assert model.mup_groups() == {}


# ---- checkpoints and exports ---------------------------------------------------------------------
def test_a_saved_mup_model_reloads_as_mup(tmp_path):
    model = zoo.create_model("llama-tiny", d_model=128, mup_base_d_model=64, seed=0).eval()
    zoo.save_pretrained(model, tmp_path / "m")
    loaded = zoo.load_pretrained(tmp_path / "m").eval()
    assert loaded.config.mup_base_d_model == 64 and loaded.mup_width == 2.0
    assert zoo.ModelConfig.from_dict(model.config.to_dict()) == model.config  # what a task's checkpoint holds
    ids = torch.randint(0, 100, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(ids), loaded(ids))


EXPORTED = {  # preset -> overrides: tied with a LayerNorm before the head, untied, tied with q/k/v biases
    "gpt2": ("gpt-tiny", {}),
    "llama": ("llama-tiny", {"tie_embeddings": False}),
    "qwen2": ("llama-tiny", {"qkv_bias": True}),
}


@pytest.mark.parametrize("family", EXPORTED)
def test_an_hf_export_folds_the_multipliers_and_transformers_computes_the_same_logits(family, tmp_path):
    transformers = pytest.importorskip("transformers")
    preset, overrides = EXPORTED[family]
    model = zoo.create_model(preset, d_model=128, n_heads=4, mup_base_d_model=32, init_std=0.2, seed=0, **overrides)
    _train_a_little(model)
    zoo.to_hf(model, tmp_path / "hf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.model_type == family
    ids = torch.randint(5, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model.eval()(ids), hf(ids).logits
    assert (ours - theirs).abs().max().item() < 1e-4
    assert zoo.from_hf(tmp_path / "hf").config.mup_base_d_model is None  # a standard model computing the same


def test_a_gguf_export_folds_the_multipliers_and_transformers_reads_the_same_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")  # transformers' GGUF loading needs it
    model = zoo.create_model("llama-tiny", d_model=128, n_heads=4, mup_base_d_model=32, init_std=0.2, seed=0)
    _train_a_little(model)
    zoo.to_gguf(model, tmp_path / "m.gguf")
    ids = torch.randint(5, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf", dtype=torch.float32)
    with torch.no_grad():
        ours, theirs, read = model.eval()(ids), hf.eval()(ids).logits, zoo.read_gguf(tmp_path / "m.gguf").model(ids)
    assert (ours - theirs).abs().max().item() < 1e-4 and (ours - read).abs().max().item() < 1e-4


@pytest.mark.slow
def test_zoo_export_gguf_of_a_mup_run_is_checked_by_the_runtimes_that_read_it(tmp_path):
    """The real commands: a muP run (width 128, base 32) trained by zoo-train and exported by zoo-export
    format=gguf, whose checks run the file in transformers and, where llama-cpp-python is installed, in
    llama.cpp itself: both give the checkpoint's logits (within the export's tolerances) and its greedy tokens."""
    pytest.importorskip("gguf")
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from test_reliability import run
    from test_tasks import STEPS, TINY

    steps = [s for s in STEPS if not s.startswith("trainer.max_steps")]
    mup = ["model.d_model=128", "model.n_heads=4", "model.mup_base_d_model=32", "model.init_std=0.2"]
    run_dir = tmp_path / "run"
    done = run(
        "train", "experiment=gpt_generator", "model=llama-tiny", *TINY["gpt_generator"], *steps,
        "trainer.max_steps=4", "test=false", *mup, f"hydra.run.dir={run_dir}", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "gguf"
    done = run(
        "export", f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}", f"out={out}", "format=gguf", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "transformers' GGUF reload vs zoo: max abs diff" in done.stdout and "same greedy tokens" in done.stdout
    if importlib.util.find_spec("llama_cpp") is not None:  # installed here: llama.cpp ran the file too
        assert "llama.cpp runs it: max abs diff" in done.stdout, done.stdout
        assert done.stdout.count("same greedy tokens") == 2, done.stdout


def test_a_tied_head_with_no_norm_before_it_cannot_fold_and_says_so_in_one_line():
    model = zoo.build_model(tiny_config(norm_placement="post", norm="layernorm", d_model=64, mup_base_d_model=32))
    with pytest.raises(zoo.ConfigError, match="^this muP model's head is tied .* tie_embeddings=false$"):
        model.without_mup()


@pytest.mark.parametrize("form", FORMS)
def test_without_mup_computes_the_same_logits_in_every_form(form):
    model = zoo.build_model(tiny_config(**FORMS[form], d_model=64, n_heads=4, mup_base_d_model=16), seed=0).eval()
    folded = model.without_mup()
    assert folded.config.mup_base_d_model is None and model.config.mup_base_d_model == 16
    inputs = model.config.form.example_inputs(model.config)
    with torch.no_grad():
        torch.testing.assert_close(_logits(folded, inputs), _logits(model, inputs), rtol=1e-5, atol=1e-5)
    rebuilt = zoo.build_model(folded.config)  # the folded config builds a model that loads its weights
    rebuilt.load_state_dict(folded.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(_logits(rebuilt.eval(), inputs), _logits(model, inputs), rtol=1e-5, atol=1e-5)


def _train_a_little(model: zoo.ZooModel) -> None:
    """Three AdamW steps, so that q and k are no longer as drawn and a fold that misses one shows."""
    optimizer = build_optimizer(model, {**ADAMW, "lr": 3e-3})
    ids = torch.randint(5, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


# ---- the coordinate check ------------------------------------------------------------------------
def test_the_coordinate_check_is_flat_under_mup_and_grows_under_the_standard_parametrization():
    """Mean |Δ activation| after 5 AdamW steps at lr 1e-2, width 512 against width 64 (head size 16,
    2 layers): within 2.5x under muP for the logits and each block; over 2.5x under the standard one."""
    found = {
        name: {w: movement(w, mup=mup, batch=2, seq_len=8) for w in (64, 512)}
        for name, mup in (("standard", False), ("mup", True))
    }
    for activation in ("logits", "block0", "block1"):
        assert 1 / 2.5 < growth(found["mup"], activation) < 2.5, (activation, found)
        assert growth(found["standard"], activation) > 2.5, (activation, found)


# ---- a search on the narrow model ----------------------------------------------------------------
def test_the_mup_search_runs_on_the_narrow_model_at_its_base_and_searches_only_what_carries_to_the_wide():
    """hparams_search=gpt_generator_mup_optuna: the trials are muP models at their base width (the
    standard gpt-tiny of width 64), the search leaves the width, depth and head size alone, and the
    values it samples compose onto the wide model the guide trains with them."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from hydra_plugins.zoo_optuna_sweeper._space import SearchSpace
    from tasks.cli.schemas import conf_dir, model_config, register_configs

    register_configs()
    search = ["experiment=gpt_generator", "hparams_search=gpt_generator_mup_optuna"]
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("train", overrides=search, return_hydra_config=True)
        narrow = model_config(cfg.model).validate()
        assert narrow.mup_base_d_model == narrow.d_model == 64 and narrow.resolved_head_dim == 16
        assert cfg.hydra.sweeper._target_.endswith("ZooOptunaSweeper")
        space = SearchSpace.parse(cfg.hydra.sweeper.params, [])
        assert space.params["optimizer.lr"].distribution.log
        shape = {"model.d_model", "model.n_heads", "model.head_dim", "model.n_layers", "model.mup_base_d_model"}
        assert not shape & set(space.params) and len(space.params) >= 2
        values = {"optimizer.lr": 4e-3, "model.init_std": 0.03, "scheduler.warmup_steps": 25}
        wide_at = ["model.d_model=512", "model.n_heads=32", "model.head_dim=16", "model.mup_base_d_model=64"]
        wide_cfg = compose("train", overrides=["experiment=gpt_generator", *wide_at, *space.overrides(values)])
    wide = model_config(wide_cfg.model).validate()
    assert (wide.d_model, wide.mup_base_d_model, wide.init_std) == (512, 64, 0.03)
    assert (wide_cfg.optimizer.lr, wide_cfg.scheduler.warmup_steps) == (4e-3, 25)
    model = zoo.build_model(wide.replace(vocab_size=256), seed=0)
    optimizer = build_optimizer(model, OmegaConf.to_container(wide_cfg.optimizer))
    lrs = {g.get("name"): g["lr"] for g in optimizer.param_groups}
    assert lrs["adamw_mup_hidden"] == pytest.approx(4e-3 * 64 / 512)  # the found rate, scaled for width 512
