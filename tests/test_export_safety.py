"""Nothing lost, nobody in, for portable folders: zoo-export never replaces a file it did not
write, writes every file atomically with the normal mode; load_pretrained and ModelConfig.from_dict
refuse a damaged or mistyped folder in one line, before allocating the model; zoo-sweep-report
never creates a storage."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch
from conftest import tiny_model
from hydra import compose, initialize_config_dir
from test_launchers import TINY as LAUNCHER_TINY

import zoo
from hydra_plugins.zoo_optuna_sweeper import report as sweep_report
from tasks.cli import verbs
from tasks.cli.export.destination import check_destination
from tasks.cli.export.formats import export_onnx, export_safetensors, files_of
from tasks.cli.export.onnx import require_onnx
from tasks.cli.loading import load_task
from tasks.cli.schemas import conf_dir
from tasks.cli.train.training import train
from tasks.errors import UserError
from zoo.pretrained import check_weights, safetensors_shapes

TINY = [o.replace("trainer.max_steps=4", "trainer.max_steps=2") for o in LAUNCHER_TINY]  # two steps suffice


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory) -> Path:
    """A tiny trained generator checkpoint."""
    run = tmp_path_factory.mktemp("export_run")
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        train(compose("train", overrides=[*TINY, f"paths.output_dir={run}"]))
    return run / "checkpoints" / "last.ckpt"


def zoo_export(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "tasks.cli.export", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def export_in_process(monkeypatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["zoo-export", *args])
    verbs.export()


def assert_one_line_error(stderr: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zoo: ") and "Traceback" not in stderr, stderr[-2000:]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file of a folder (hidden ones too) with its bytes."""
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def normal_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def modes(folder: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}


def user_folder(folder: Path) -> Path:
    """A folder of someone else's files, among them names zoo-export writes."""
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    (folder / "model.safetensors").write_bytes(b"my own weights")
    return folder


# ---- zoo-export: the real command ---------------------------------------------------------------
@pytest.mark.slow
def test_export_refuses_a_folder_it_did_not_write(ckpt, tmp_path):
    mine = user_folder(tmp_path / "mine")
    before = snapshot(mine)
    result = zoo_export(tmp_path, f"ckpt_path={ckpt}", f"out={mine}")
    assert_one_line_error(result.stderr)
    assert result.returncode == 2 and "overwrite=true" in result.stderr and "notes.txt" in result.stderr
    assert snapshot(mine) == before  # byte for byte, and no file added


@pytest.mark.slow
def test_export_replaces_its_own_files_and_keeps_the_users(ckpt, tmp_path):
    out = tmp_path / "exports" / "gpt"  # created by the export
    first = zoo_export(tmp_path, f"ckpt_path={ckpt}", f"out={out}")
    assert first.returncode == 0, first.stderr[-3000:]
    assert set(modes(out).values()) == {normal_mode()}  # model.safetensors too, not mkstemp's 0600
    exported = snapshot(out)
    (out / "notes.md").write_text("what this model is\n")  # the user's file beside the export
    (out / "tokenizer.json").write_text("stale")  # one of ours, replaced by the next export
    (out / "README.md").write_text("stale")  # the model card: ours too

    again = zoo_export(tmp_path, f"ckpt_path={ckpt}", f"out={out}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert snapshot(out) == {**exported, "notes.md": b"what this model is\n"}
    assert set(modes(out).values()) == {normal_mode()}
    record = json.loads((out / "config.json").read_text())["zoo_export"]
    assert set(record["files"]) == {"config.json", "config.yaml", "model.safetensors", "tokenizer.json", "README.md"}


@pytest.mark.slow
def test_overwrite_true_replaces_only_the_files_the_export_writes(ckpt, tmp_path):
    mine = user_folder(tmp_path / "mine")
    result = zoo_export(tmp_path, f"ckpt_path={ckpt}", f"out={mine}", "overwrite=true")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (mine / "notes.txt").read_text() == "my notes\n"
    task, _ = load_task(ckpt)
    x = torch.randint(0, task.model.config.vocab_size, (2, 7))
    torch.testing.assert_close(zoo.load_pretrained(mine)(x), task.model(x))


# ---- zoo-export: refusals in process ------------------------------------------------------------
@pytest.mark.parametrize(
    "args,words",
    [
        (["format=pt"], "format='pt'"),
        (["overwrite=yes"], "overwrite='yes'"),
        ([], "is a file"),
    ],
)
def test_export_mistakes_end_in_one_line(ckpt, tmp_path, monkeypatch, capsys, args, words):
    target = tmp_path / "a_file.txt"
    target.write_text("keep me")
    with pytest.raises(SystemExit) as exit_:
        export_in_process(monkeypatch, f"ckpt_path={ckpt}", f"out={target}", *args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and words in err
    assert_one_line_error(err)
    assert target.read_text() == "keep me"


def test_a_previous_export_may_not_hide_a_users_file(ckpt, tmp_path):
    task, info = load_task(ckpt)
    export_safetensors(task, info, tmp_path)
    check_destination(tmp_path, files_of(task, "safetensors"), overwrite=False)  # ours: fine
    (tmp_path / "model.onnx").write_bytes(b"the user's own graph")
    with pytest.raises(UserError, match="model.onnx"):
        check_destination(tmp_path, files_of(task, "onnx"), overwrite=False)


def test_a_failed_write_leaves_the_previous_export(ckpt, tmp_path, monkeypatch):
    """A kill at any point of a write is the same as a failure before its rename: os.replace
    raising for model.safetensors must leave the previous file whole and no temporary file."""
    task, info = load_task(ckpt)
    with torch.no_grad():
        task.model.embed.weight.add_(1.0)  # the previous export's weights differ from the next one's
    export_safetensors(task, info, tmp_path)
    before = snapshot(tmp_path)
    task, info = load_task(ckpt)
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst).name == "model.safetensors":
            raise OSError("killed")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="killed"):
        export_safetensors(task, info, tmp_path)
    after = snapshot(tmp_path)
    assert after.keys() == before.keys()  # no temporary file left behind
    assert after["model.safetensors"] == before["model.safetensors"]


def test_missing_onnx_packages_name_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # find_spec reports a None entry as not installed
    with pytest.raises(UserError, match=r'onnxscript.*pip install -e "\.\[export\]"'):
        require_onnx()


@pytest.mark.slow
def test_onnx_export_into_a_safetensors_export(ckpt, tmp_path):
    pytest.importorskip("onnxruntime")
    task, info = load_task(ckpt)
    export_safetensors(task, info, tmp_path)
    check_destination(tmp_path, files_of(task, "onnx"), overwrite=False)
    assert export_onnx(task, info, tmp_path, opset=18) < 1e-4
    files = set(json.loads((tmp_path / "config.json").read_text())["zoo_export"]["files"])
    assert files == {p.name for p in tmp_path.iterdir()} and {"model.onnx", "model.safetensors"} <= files
    assert set(modes(tmp_path).values()) == {normal_mode()}


# ---- save_pretrained / load_pretrained ------------------------------------------------------------
def test_save_pretrained_gives_its_files_the_normal_mode(tmp_path):
    old = os.umask(0o022)
    try:
        zoo.save_pretrained(tiny_model(), tmp_path)
    finally:
        os.umask(old)
    assert modes(tmp_path) == {"config.json": 0o644, "model.safetensors": 0o644}


def _damage(folder: Path, how: str) -> tuple[Path, Path]:
    """Break a saved folder one way: (the folder to load, the file the error must name)."""
    config, weights = folder / "config.json", folder / "model.safetensors"
    if how == "no folder":
        return folder / "missing", folder / "missing"
    if how == "no config.json":
        config.unlink()
        return folder, config
    if how == "config.json not JSON":
        config.write_text('{"model": {"d_model": 32,')
        return folder, config
    if how == "config.json mistyped":
        record = json.loads(config.read_text())
        record["model"]["d_model"] = "32"
        config.write_text(json.dumps(record))
        return folder, config
    if how == "no model.safetensors":
        weights.unlink()
        return folder, weights
    if how == "truncated model.safetensors":
        weights.write_bytes(weights.read_bytes()[:-100])
        return folder, weights
    if how == "model.safetensors is text":
        weights.write_text("version https://git-lfs.github.com/spec/v1\n")
        return folder, weights
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    [
        "no folder",
        "no config.json",
        "config.json not JSON",
        "config.json mistyped",
        "no model.safetensors",
        "truncated model.safetensors",
        "model.safetensors is text",
    ],
)
def test_load_pretrained_names_the_broken_file(tmp_path, how):
    zoo.save_pretrained(tiny_model(), tmp_path)
    folder, broken = _damage(tmp_path, how)
    with pytest.raises(zoo.CheckpointError) as error:
        zoo.load_pretrained(folder)
    message = str(error.value)
    assert str(broken) in message and "\n" not in message and ";" in message  # the file, then the fix
    if how == "config.json mistyped":
        assert "d_model='32'" in message and "integer" in message


def test_load_pretrained_compares_shapes_before_allocating(tmp_path, monkeypatch):
    zoo.save_pretrained(tiny_model(), tmp_path)  # d_model=32
    record = json.loads((tmp_path / "config.json").read_text())
    record["model"].update(d_model=4096, n_heads=4)
    (tmp_path / "config.json").write_text(json.dumps(record))
    monkeypatch.setattr(torch.nn.Module, "to_empty", lambda *a, **k: pytest.fail("allocated the model"))
    with pytest.raises(zoo.CheckpointError, match=r"model\.safetensors: the config wants .* of shape"):
        zoo.load_pretrained(tmp_path)


def test_load_pretrained_counts_layers_before_building_them(tmp_path, monkeypatch):
    zoo.save_pretrained(tiny_model(), tmp_path)  # n_layers=2
    record = json.loads((tmp_path / "config.json").read_text())
    record["model"]["n_layers"] = 20000
    (tmp_path / "config.json").write_text(json.dumps(record))
    built = []
    real_build = zoo.pretrained.build_model
    monkeypatch.setattr(
        zoo.pretrained, "build_model", lambda cfg, **kw: built.append(cfg.n_layers) or real_build(cfg, **kw)
    )
    with pytest.raises(zoo.CheckpointError, match="n_layers=20000"):
        zoo.load_pretrained(tmp_path)
    assert built and max(built) <= 2  # only shallow models were built, on the meta device


def test_check_weights_takes_a_state_dict_or_a_safetensors_header(tmp_path):
    model = tiny_model()
    zoo.save_pretrained(model, tmp_path)
    check_weights(model.config, {k: tuple(v.shape) for k, v in model.state_dict().items()})
    check_weights(model.config, safetensors_shapes(tmp_path / "model.safetensors"))
    fewer = {k: tuple(v.shape) for k, v in model.state_dict().items() if ".blocks.1." not in k}
    with pytest.raises(zoo.CheckpointError, match="describes"):
        check_weights(model.config, fewer)


# ---- ModelConfig.from_dict ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field,value,wanted",
    [
        ("d_model", "512", "an integer"),
        ("n_layers", 3.5, "an integer"),
        ("n_layers", 4.0, "an integer"),  # a size written as a float is a mistake to show, not to round
        ("n_layers", True, "an integer"),
        ("bias", 1, "true or false"),
        ("position", ["rope"], "a string"),
        ("d_model", None, "an integer"),
        ("n_kv_heads", "2", "an integer or null"),
        ("norm_eps", "1e-5", "a number"),
    ],
)
def test_from_dict_refuses_a_value_of_the_wrong_type(field, value, wanted):
    with pytest.raises(zoo.ConfigError) as error:
        zoo.ModelConfig.from_dict({field: value})
    message = str(error.value)
    assert f"{field}={value!r}" in message and f"must be {wanted}" in message


def test_from_dict_takes_ints_for_floats_and_null_where_allowed():
    cfg = zoo.ModelConfig.from_dict({"rope_base": 10000, "n_kv_heads": None, "attn_scale": None})
    assert cfg.rope_base == 10000.0 and isinstance(cfg.rope_base, float) and cfg.n_kv_heads is None
    assert zoo.ModelConfig.from_dict(cfg.to_dict()) == cfg


# ---- zoo-sweep-report's storage -------------------------------------------------------------------
def _results(sweep: Path, storage: str, study: str = "s") -> Path:
    sweep.mkdir(parents=True, exist_ok=True)
    (sweep / "optimization_results.yaml").write_text(f"name: zoo_optuna\nstudy_name: {study}\nstorage: {storage}\n")
    return sweep


@pytest.mark.parametrize("kind", ["missing", "not a database"])
def test_sweep_report_never_creates_a_storage(tmp_path, capsys, kind):
    db = tmp_path / "elsewhere" / "optuna.db"
    if kind == "not a database":
        db.parent.mkdir()
        db.write_text("the user's notes")
    sweep = _results(tmp_path / "sweep", f"sqlite:///{db}")
    with pytest.raises(SystemExit) as exit_:
        sweep_report.main([str(sweep), "--no-plots"])
    assert exit_.value.code == 2
    assert_one_line_error(capsys.readouterr().err)
    if kind == "missing":
        assert not db.parent.exists()
    else:
        assert db.read_text() == "the user's notes" and [p.name for p in db.parent.iterdir()] == ["optuna.db"]


def test_sweep_report_reads_an_existing_study_and_writes_nothing_there(tmp_path, capsys):
    db = tmp_path / "optuna.db"
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{db}")
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=2)
    before = db.read_bytes()
    sweep_report.main([str(_results(tmp_path / "sweep", f"sqlite:///{db}")), "--no-plots"])
    assert "2 trials: 2 COMPLETE" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:  # a study the storage does not hold is not created either
        sweep_report.main([str(_results(tmp_path / "sweep", f"sqlite:///{db}", study="other")), "--no-plots"])
    assert exit_.value.code == 2 and "'other'" in capsys.readouterr().err
    assert db.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["optuna.db", "sweep"]
