"""Nobody in: weights-only loading for every verb, damaged and crafted checkpoints refused in one
line, a finished run's directory never reused, and one line (no traceback) for a user's mistake —
with the real commands, against one tiny gpt_generator run trained for the module.

Nothing lost (atomic checkpoint writes, run-directory claims, a NaN stop): tests/test_reliability_writes.py;
interrupted and resumed runs: tests/test_reliability_resume.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from real_commands import GPT, digest, one_line_error, run
from test_tasks import compose_train

import zoo
from tasks.cli.loading import load_task
from tasks.cli.train.training import train
from tasks.errors import UserError


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpt")
    train(compose_train("gpt_generator", out))
    return out


class Payload:
    """Unpickling this runs code: it creates the file named in ``__reduce__``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


# ---- security: one weights-only loader for every verb ---------------------------------------------
@pytest.fixture(scope="module")
def payload_ckpt(tmp_path_factory, gpt_run) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("payload")
    marker = folder / "pwned"
    checkpoint = torch.load(gpt_run / "checkpoints" / "last.ckpt", weights_only=True)
    checkpoint["extra"] = Payload(marker)
    torch.save(checkpoint, folder / "evil.ckpt")
    return folder / "evil.ckpt", marker


def test_the_loader_never_runs_a_pickled_payload_and_never_suggests_weights_only_false(payload_ckpt):
    path, marker = payload_ckpt
    with pytest.raises(zoo.CheckpointError) as error:
        zoo.load_weights_file(path)
    assert not marker.exists()
    assert "weights_only" not in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(zoo.CheckpointError, match="URLs are not read"):
        zoo.load_weights_file("http://127.0.0.1:9/x.ckpt")


@pytest.mark.slow
@pytest.mark.parametrize(
    "module,args",
    [
        ("train", ["ckpt_path={ckpt}", *GPT]),
        ("train", ["init_from={ckpt}", *GPT]),
        ("evaluate", ["ckpt_path={ckpt}"]),
        ("generate", ["ckpt_path={ckpt}", "prompt=def"]),
        ("export", ["ckpt_path={ckpt}", "out={tmp}/export"]),
        ("attention", ["ckpt_path={ckpt}", "text=def"]),
    ],
)
def test_every_verb_refuses_a_payload_checkpoint_and_a_url(module, args, payload_ckpt, tmp_path):
    path, marker = payload_ckpt
    urls = ["http://127.0.0.1:9/x.ckpt"] if module in ("train", "evaluate") else []  # one loader: two verbs suffice
    for ckpt in (path, *urls):
        given = [a.format(ckpt=ckpt, tmp=tmp_path) for a in args]
        run_dir = tmp_path / ("run" if ckpt == path else "run_url")
        result = run(module, *given, f"hydra.run.dir={run_dir}", cwd=tmp_path)
        one_line_error(result, str(ckpt))
        assert not marker.exists()
        assert "weights_only=False" not in result.stderr + result.stdout
        assert not (run_dir / "checkpoints").exists()  # nothing trained, nothing saved


@pytest.mark.parametrize(
    "content,message",
    [
        (None, "no such"),
        (b"", "empty"),
        (b"checkpoint: yes\n", "not a checkpoint written by torch.save"),
        ("truncated", "damaged or truncated"),
        ("dir", "is a directory"),
    ],
)
def test_bad_checkpoint_files_are_one_line_errors(content, message, gpt_run, tmp_path):
    path = tmp_path / "x.ckpt"
    if content == "truncated":
        data = (gpt_run / "checkpoints" / "last.ckpt").read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif content == "dir":
        path = gpt_run
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(zoo.CheckpointError, match=message) as error:
        load_task(path)
    assert "\n" not in str(error.value)


def _edited(checkpoint: dict, path: Path, edit) -> Path:
    copy = {k: (dict(v) if isinstance(v, dict) else v) for k, v in checkpoint.items()}
    edit(copy)
    torch.save(copy, path)
    return path


@pytest.mark.parametrize(
    "name,edit,message",
    [
        ("hp_str", lambda c: c.update(hyper_parameters="gpt"), "hyper_parameters is str, not dict"),
        (
            "optimizer_str",
            lambda c: c["hyper_parameters"].update(optimizer="adam"),
            "hyper_parameters.optimizer is str",
        ),
        ("extra_key", lambda c: c["state_dict"].update(extra=torch.ones(1)), "its tensors do not fit GeneratorTask"),
        ("int_key", lambda c: c["state_dict"].update({3: torch.ones(1)}), "state_dict entry 3 is not a named tensor"),
        ("tokenizer", lambda c: c.update(tokenizer_json="{not json"), "its tokenizer cannot be read"),
        ("no_tokenizer", lambda c: c.update(tokenizer_json=None), "tokenizer_json is NoneType"),
        (
            "nan",
            lambda c: c["state_dict"].update(
                {k: v * float("nan") for k, v in c["state_dict"].items() if v.is_floating_point()}
            ),
            "holds NaN or infinite values",
        ),
        ("step", lambda c: c.update(global_step="7"), "global_step is str, not int"),
        ("task", lambda c: c.update(zoo_run={**c["zoo_run"], "task": "os.system"}), "zoo_run.task='os.system'"),
    ],
)
def test_crafted_checkpoints_are_one_line_checkpoint_errors(name, edit, message, gpt_run, tmp_path):
    checkpoint = torch.load(gpt_run / "checkpoints" / "last.ckpt", weights_only=True)
    path = _edited(checkpoint, tmp_path / f"{name}.ckpt", edit)
    with pytest.raises(zoo.CheckpointError, match=re.escape(message)) as error:
        load_task(path)
    assert "\n" not in str(error.value) and str(error.value).startswith(f"ckpt_path={path}")


def test_a_checkpoint_whose_config_asks_for_absurd_sizes_is_refused_before_allocating(gpt_run, tmp_path):
    checkpoint = torch.load(gpt_run / "checkpoints" / "last.ckpt", weights_only=True)
    for field, value in (("d_model", 32768), ("n_layers", 20000)):
        edited = {**checkpoint, "hyper_parameters": {**checkpoint["hyper_parameters"]}}
        edited["hyper_parameters"]["model"] = {**checkpoint["hyper_parameters"]["model"], field: value}
        torch.save(edited, tmp_path / f"{field}.ckpt")
        with pytest.raises(zoo.CheckpointError, match="the config and the weights come from different models"):
            load_task(tmp_path / f"{field}.ckpt")


# ---- run directories and files: never another run's ----------------------------------------------
def test_a_new_run_in_a_finished_runs_directory_is_refused_and_changes_nothing(gpt_run):
    before = digest(gpt_run)
    with pytest.raises(UserError, match="holds another run's files"):
        train(compose_train("gpt_generator", gpt_run))
    assert digest(gpt_run) == before


@pytest.mark.slow
def test_real_command_refuses_an_explicit_run_dir_of_another_run(gpt_run, tmp_path):
    before = digest(gpt_run)
    result = run("train", *GPT, f"hydra.run.dir={gpt_run}", cwd=tmp_path)
    one_line_error(result, "holds a training run's files", f"ckpt_path={gpt_run / 'checkpoints' / 'last.ckpt'}")
    assert digest(gpt_run) == before  # not even Hydra's .hydra/ was rewritten


def test_a_resume_that_cannot_load_writes_nothing(gpt_run, tmp_path):
    last = gpt_run / "checkpoints" / "last.ckpt"
    before = digest(gpt_run)
    with pytest.raises(zoo.ConfigError, match="was trained with another model"):
        train(compose_train("gpt_generator", gpt_run, f"ckpt_path={last}", "model.n_layers=3"))
    assert digest(gpt_run) == before


# ---- one line for a mistake, before any data is read ------------------------------------------------
@pytest.mark.parametrize(
    "override,message",
    [
        ("optimizer.lr=0", "optimizer.lr=0 must be > 0"),
        ("data.batch_size=0", "data.batch_size=0 must be > 0"),
        ("trainer.val_check_interval=0", "trainer.val_check_interval=0 must be > 0"),
        ("data.seq_len=0", "data.seq_len=0 must be > 0"),
        ("task.sample_tokens=100000", "task.sample_tokens=100000 does not fit"),
        ("task.sample_prompt=''", "task.sample_prompt is empty"),
        ("model.vocab_size=100", None),
        ("optimizer.lr=nan", "optimizer.lr=nan must be a finite number"),
        ("optimizer.lr=inf", "optimizer.lr=inf must be a finite number"),
        ("data.batch_size=2.5", "data.batch_size=2.5 must be a whole number"),
        ("optimizer.betas=[0.9,2]", re.escape("optimizer.betas=[0.9, 2] must be two numbers in [0, 1)")),
        ("data.vocab_size=1000000000", "data.vocab_size=1000000000 is more than any tokenizer needs"),
    ],
)
def test_values_that_would_fail_later_fail_at_composition(override, message, tmp_path):
    cfg = compose_train("gpt_generator", tmp_path, override)
    if message is None:  # decided by the data: refused after the tokenizer, before training
        with pytest.raises(zoo.ConfigError, match="model.vocab_size=100 but the tokenizer has"):
            train(cfg)
        return
    with pytest.raises(zoo.ConfigError, match=message):
        train(cfg)
    assert not (tmp_path / "tokenizer.json").exists()  # stopped before any data was read


def test_init_from_a_checkpoint_of_another_form_is_refused_unless_partial(gpt_run, tmp_path):
    ckpt = gpt_run / "checkpoints" / "last.ckpt"
    cfg = compose_train("bert_classifier", tmp_path / "a", f"init_from={ckpt}")
    with pytest.raises(zoo.ConfigError, match="it has arch='decoder' and this run trains arch='encoder'"):
        train(cfg)
    cfg = compose_train(
        "bert_classifier", tmp_path / "b", f"init_from={ckpt}", "init_partial=true", "trainer.max_steps=1", "test=false"
    )
    train(cfg)
    assert (tmp_path / "b" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_real_command_bad_values_and_files_are_one_line(tmp_path):
    result = run("train", *GPT, "optimizer.lr=-1", cwd=tmp_path)
    one_line_error(result, "optimizer.lr=-1")
    (tmp_path / "empty.ckpt").write_bytes(b"")
    result = run("evaluate", f"ckpt_path={tmp_path / 'empty.ckpt'}", f"hydra.run.dir={tmp_path / 'e'}", cwd=tmp_path)
    one_line_error(result, "empty.ckpt", "empty")
    result = run("train", *GPT, "init_from=missing.ckpt", cwd=tmp_path)
    one_line_error(result, "init_from=missing.ckpt", "no such")
    assert not (tmp_path / "outputs").exists() or not list((tmp_path / "outputs").rglob("*.ckpt"))


@pytest.mark.slow
def test_eval_and_attention_never_write_into_a_training_run_or_a_users_folder(gpt_run, tmp_path):
    ckpt = gpt_run / "checkpoints" / "last.ckpt"
    before = digest(gpt_run)
    result = run("evaluate", f"ckpt_path={ckpt}", f"hydra.run.dir={gpt_run}", cwd=tmp_path)
    one_line_error(result, "holds a training run's files")
    result = run("attention", f"ckpt_path={ckpt}", "text=def", f"hydra.run.dir={gpt_run}", cwd=tmp_path)
    one_line_error(result, "holds a training run's files")
    assert digest(gpt_run) == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "metrics.json").write_text("my numbers")
    result = run("evaluate", f"ckpt_path={ckpt}", f"hydra.run.dir={mine}", cwd=tmp_path)
    one_line_error(result, "is not empty (metrics.json)")
    assert (mine / "metrics.json").read_text() == "my numbers"
