"""Nothing lost, nobody in: weights-only loading, run directories that are never shared, atomic
checkpoints, a NaN stop, and one line (no traceback) for a user's mistake — with the real commands."""

from __future__ import annotations

import csv
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_tasks import STEPS, TINY, compose_train

import zoo
from tasks.checkpoints import RUN_MARKER, ZooCheckpointIO, claim_fresh, claim_run_dir
from tasks.cli.loading import load_task
from tasks.cli.train import train
from tasks.errors import DivergedError, UserError

GPT = ["experiment=gpt_generator", *TINY["gpt_generator"], *STEPS]


def run(
    module: str, *args: str, cwd: Path, timeout: int = 300, extra: list[str] | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", f"tasks.cli.{module}", *args, *(extra or [])],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line_error(result: subprocess.CompletedProcess, *needles: str, code: int = 2) -> str:
    """The process ended with ``code`` and one ``zoo: `` line on stderr (no traceback) holding ``needles``."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == code, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in lines if line.startswith("zoo: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


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


# ---- 1. security: one weights-only loader for every verb ------------------------------------------
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


# ---- 2. run directories and files: never another run's -------------------------------------------
def test_a_new_run_in_a_finished_runs_directory_is_refused_and_changes_nothing(gpt_run):
    before = digest(gpt_run)
    with pytest.raises(UserError, match="holds another run's files"):
        train(compose_train("gpt_generator", gpt_run))
    assert digest(gpt_run) == before


def test_claims_are_exclusive_and_default_names_get_a_fresh_sibling(tmp_path):
    folder = tmp_path / "2026-01-01_00-00-00"
    assert claim_fresh(folder) == folder
    assert claim_fresh(folder) == tmp_path / "2026-01-01_00-00-00_2"  # a second launch in the same second
    claim_run_dir(folder)
    assert (folder / RUN_MARKER).is_file()
    with pytest.raises(UserError, match="holds another run"):
        claim_run_dir(folder)


@pytest.mark.slow
def test_real_command_refuses_an_explicit_run_dir_of_another_run(gpt_run, tmp_path):
    before = digest(gpt_run)
    result = run("train", *GPT, f"hydra.run.dir={gpt_run}", cwd=tmp_path)
    one_line_error(result, "holds a training run's files", f"ckpt_path={gpt_run / 'checkpoints' / 'last.ckpt'}")
    assert digest(gpt_run) == before  # not even Hydra's .hydra/ was rewritten


def test_resuming_in_the_runs_own_directory_appends_to_its_metrics(tmp_path):
    train(compose_train("gpt_generator", tmp_path, "test=false"))
    with (tmp_path / "logs" / "metrics.csv").open() as f:
        first = list(csv.DictReader(f))
    last = tmp_path / "checkpoints" / "last.ckpt"
    train(compose_train("gpt_generator", tmp_path, f"ckpt_path={last}", "trainer.max_steps=9", "test=false"))
    with (tmp_path / "logs" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows[: len(first)] == [
        {**r, **{k: v for k, v in rows[i].items() if k not in r}} for i, r in enumerate(first)
    ]  # the earlier rows are still there, unchanged
    steps = [int(r["step"]) for r in rows if r.get("train/loss")]
    assert max(steps) > max(int(r["step"]) for r in first) and steps == sorted(steps)


def test_a_resume_that_cannot_load_writes_nothing(gpt_run, tmp_path):
    last = gpt_run / "checkpoints" / "last.ckpt"
    before = digest(gpt_run)
    with pytest.raises(zoo.ConfigError, match="was trained with another model"):
        train(compose_train("gpt_generator", gpt_run, f"ckpt_path={last}", "model.n_layers=3"))
    assert digest(gpt_run) == before


def test_checkpoint_writes_are_atomic(tmp_path, monkeypatch):
    io = ZooCheckpointIO(own_dir=tmp_path)
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}}, path)
    before = path.read_bytes()

    def full_disk(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"PK\x03\x04 half")
        raise OSError(28, "No space left on device", str(f))

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError):
        io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}}, path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_file(tmp_path):
    path = tmp_path / "last.ckpt"
    zoo.atomic_save({"step": 1}, path)
    code = (
        "import os, torch, zoo\n"
        "real = torch.save\n"
        "def slow(obj, f, *a, **k):\n"
        "    real(obj, f, *a, **k)\n"
        "    os.kill(os.getpid(), 9)\n"  # killed after writing the temp file, before the rename
        "torch.save = slow\n"
        f"zoo.atomic_save({{'step': 2, 'w': torch.ones(1000)}}, {str(path)!r})\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == -9
    assert torch.load(path, weights_only=True) == {"step": 1}


def test_the_checkpoint_writer_refuses_nan_weights_and_removes_only_its_own_files(tmp_path):
    io = ZooCheckpointIO(own_dir=tmp_path / "mine")
    with pytest.raises(DivergedError, match="w is not"):
        io.save_checkpoint({"state_dict": {"w": torch.tensor([1.0, float("nan")])}}, tmp_path / "mine" / "a.ckpt")
    assert not (tmp_path / "mine" / "a.ckpt").exists()
    other = tmp_path / "other.ckpt"
    other.write_bytes(b"x")
    io.remove_checkpoint(other)
    assert other.exists()


# ---- 4. divergence ---------------------------------------------------------------------------------
def test_a_diverging_run_stops_naming_the_step_and_keeps_no_nan_checkpoint(tmp_path):
    cfg = compose_train(
        "gpt_generator",
        tmp_path,
        "optimizer.lr=1e4",
        "scheduler.warmup_steps=1",
        "trainer.gradient_clip_val=0",
        "trainer.max_steps=40",
        "test=false",
    )
    with pytest.raises(DivergedError, match=r"training diverged at step \d+") as error:
        train(cfg)
    assert "optimizer.lr" in str(error.value)
    saved = list((tmp_path / "checkpoints").glob("*.ckpt"))
    assert not (tmp_path / "checkpoints" / "on_exception.ckpt").exists()
    for path in saved:
        state = torch.load(path, weights_only=True)["state_dict"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point()), path


# ---- 5. one line for a mistake, before any data is read ---------------------------------------------
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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_folder_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys):
    import errno

    import tasks.cli.train as train_module
    from tasks.cli.boundary import user_errors

    def read_only(folder, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(folder))

    monkeypatch.setattr(train_module, "claim_run_dir", read_only)
    with pytest.raises(SystemExit) as exit_:
        user_errors(train)(compose_train("gpt_generator", tmp_path / "ro"))
    assert exit_.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"zoo: UserError: cannot write {tmp_path / 'ro'}: Read-only file system; choose a folder you "
        f"can write (paths.output_dir / hydra.run.dir, or out=)"
    ]


@pytest.mark.slow
def test_ctrl_c_during_data_preparation_is_one_line_and_exit_130(tmp_path):
    import signal
    import time

    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "tasks.cli.train", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not (run_dir / ".hydra" / "overrides.yaml").exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)  # Hydra has started the job, which checks the config and reads all of the stdlib
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-3000:]
    assert "zoo: interrupted" in err and "Traceback" not in err
    assert not (run_dir / "tokenizer.json").exists() and not (run_dir / RUN_MARKER).exists()


def test_a_failed_checkpoint_write_is_one_line_and_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    zoo.atomic_save({"step": 1}, path)

    def full(obj, f, *args, **kwargs):  # how torch reports a write that failed (a full disk, ulimit -f)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 512 vs 448")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError) as error:
        zoo.atomic_save({"step": 2}, path)
    assert error.value.filename == str(path) and "the write failed" in error.value.strerror
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"step": 1} and [p.name for p in tmp_path.iterdir()] == [path.name]


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


@pytest.mark.slow
def test_a_resume_into_its_own_directory_keeps_the_first_commands_record(tmp_path):
    run_dir = tmp_path / "run"
    first = run(
        "train",
        *GPT,
        "test=false",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
        extra=[
            "++callbacks.rich_progress_bar={_target_:tasks.callbacks.ProgressBar}",
            "++callbacks.rich_model_summary={_target_:tasks.callbacks.ModelSummary}",
        ],
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert "DecoderModel" in first.stdout  # the model summary is printed, without the rows below
    for noise in ("litlogger", "`weights_only` was not set", "Epoch 0/-2", "v_num", "FLOPs", "MetricCollection"):
        assert noise not in first.stdout + first.stderr, noise  # nothing to act on
    assert not (run_dir / "train.log").exists()  # Hydra's job log stayed empty: there is none
    before = digest(run_dir)
    last = run_dir / "checkpoints" / "last.ckpt"
    failed = run("train", *GPT, "model.n_layers=3", f"ckpt_path={last}", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    one_line_error(failed, "was trained with another model")
    assert {k: v for k, v in digest(run_dir).items() if not k.startswith(".hydra/resume")} == before
    resumed = run(
        "train",
        *GPT,
        "trainer.max_steps=8",
        "test=false",
        f"ckpt_path={last}",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert digest(run_dir)[".hydra/overrides.yaml"] == before[".hydra/overrides.yaml"]
    records = sorted(p.name for p in (run_dir / ".hydra").glob("resume*"))
    assert records == ["resume", "resume_2"]  # the failed attempt's record and this one's, beside the first
    assert "trainer.max_steps=8" in (run_dir / ".hydra" / "resume_2" / "overrides.yaml").read_text()


@pytest.mark.slow
def test_ctrl_c_during_training_says_interrupted_and_how_to_resume(tmp_path):
    import signal
    import time

    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    run_dir = tmp_path / "run"
    args = [*GPT, "trainer.max_steps=100000", "trainer.val_check_interval=3", f"hydra.run.dir={run_dir}"]
    process = subprocess.Popen(
        [sys.executable, "-m", "tasks.cli.train", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not (run_dir / "checkpoints" / "last.ckpt").exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)  # training has stepped and validated
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-3000:]
    crash = run_dir / "checkpoints" / "on_exception.ckpt"
    assert f"zoo: interrupted; resume with: zoo-train resume={run_dir}" in err and "Traceback" not in err
    assert torch.load(crash, weights_only=True)["global_step"] >= 3


@pytest.mark.slow
def test_resume_continues_the_run_with_its_own_config_in_its_directory(tmp_path):
    run_dir = tmp_path / "run"
    first = run("train", *GPT, "model.n_layers=1", "test=false", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run("train", f"resume={run_dir}", "trainer.max_steps=9", cwd=tmp_path)  # no other override repeated
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {run_dir} from last.ckpt (step 6) with trainer.max_steps=9" in resumed.stdout
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 9 and last["hyper_parameters"]["model"]["n_layers"] == 1
    with (run_dir / "logs" / "metrics.csv").open() as f:
        steps = [int(r["step"]) for r in csv.DictReader(f) if r.get("train/loss")]
    assert steps == list(range(9))  # one metrics file, every step once
    assert (run_dir / ".hydra" / "resume" / "overrides.yaml").is_file()
    assert not (tmp_path / "outputs").exists()  # no stray new run directory
    other = run("train", f"resume={run_dir}", "model=llama-tiny", cwd=tmp_path)
    one_line_error(other, "model=llama-tiny would make another run")
    missing = run("train", f"resume={tmp_path / 'nope'}", cwd=tmp_path)
    one_line_error(missing, "resume=", "no such folder")
