"""The runtimes that check zoo-export's files run in a child process (tasks/cli/export/checker.py): a
checker that segfaults, hangs or cannot be imported ends ``zoo-export`` in one line, the export kept
whole (exit status 3) or, with ``checker.unchecked=refuse``, nothing written; a Ctrl-C during the
check leaves nothing; no temporary folder is left on any path; and a healthy checker's disagreement
still refuses. The stand-ins (tests/checker_stand_ins.py) take llama.cpp's or onnxruntime's place in
``RUNTIMES``."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from checker_stand_ins import Disagrees, Hangs, Interrupted, MissingDependency, Segfaults, Unimportable
from test_export_safety import assert_one_line_error, export_in_process

from tasks.cli.export import checker
from tasks.cli.loading import load_task

pytest.importorskip("gguf")

EXPORTED = ["README.md", "config.json", "model.gguf"]


def export_gguf(monkeypatch, ckpt: Path, out: Path, *args: str) -> int:
    """zoo-export format=gguf in this process (the stand-in is put in RUNTIMES by the test); its exit code."""
    with pytest.raises(SystemExit) as stop:
        export_in_process(monkeypatch, f"ckpt_path={ckpt}", f"out={out}", "format=gguf", *args)
    return stop.value.code


def only(folder: Path) -> list[str]:
    """Every name in ``folder``, hidden ones (a stage left behind) too."""
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize(
    "stand_in,args,said",
    [
        (Segfaults(), [], "llama.cpp crashed (SIGSEGV) while checking"),
        (Hangs(), ["checker.timeout=2"], "llama.cpp did not finish checking"),
        (Unimportable(), [], "llama.cpp could not be imported to check"),
        (MissingDependency(), [], "llama.cpp could not be imported to check"),
    ],
    ids=["segfault", "hang", "import", "dependency"],
)
def test_a_checker_that_fails_keeps_the_export_in_one_line(
    gpt_base, tmp_path, monkeypatch, capsys, stand_in, args, said
):
    monkeypatch.setitem(checker.RUNTIMES, "llama.cpp", stand_in)
    out = tmp_path / "exported"
    code = export_gguf(monkeypatch, gpt_base, out, *args)
    captured = capsys.readouterr()
    assert code == 3, captured.err
    assert_one_line_error(captured.err)
    assert f"zoo: Unchecked: {said} {out}/model.gguf" in captured.err
    assert "; the file was written and is unchecked: " in captured.err
    if isinstance(stand_in, MissingDependency):  # the module to install, not a rebuild
        assert ": the module zoo_checker_absent_dependency it imports is not installed" in captured.err
        assert "(pip install zoo_checker_absent_dependency)" in captured.err
    else:
        assert "stand-in fix" in captured.err
    assert f"exported {out}/model.gguf" in captured.out  # what transformers' check found, still said
    assert only(tmp_path) == ["exported"] and only(out) == EXPORTED  # whole, and no stage beside it
    assert json.loads((out / "config.json").read_text())["zoo_export"]["files"] == EXPORTED


def test_refuse_writes_nothing(gpt_base, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(checker.RUNTIMES, "llama.cpp", Segfaults())
    code = export_gguf(monkeypatch, gpt_base, tmp_path / "exported", "checker.unchecked=refuse")
    err = capsys.readouterr().err
    assert code == 2 and "crashed (SIGSEGV)" in err and "nothing was written (checker.unchecked=refuse)" in err
    assert_one_line_error(err)
    assert only(tmp_path) == []


def test_a_ctrl_c_during_the_check_leaves_nothing(gpt_base, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(checker.RUNTIMES, "llama.cpp", Interrupted())
    start = time.monotonic()
    code = export_gguf(monkeypatch, gpt_base, tmp_path / "exported", "checker.timeout=300")
    assert code == 130 and "zoo: interrupted" in capsys.readouterr().err
    assert only(tmp_path) == [] and time.monotonic() - start < 120  # the child was killed, not waited for


def test_a_healthy_checkers_disagreement_still_refuses(gpt_base, tmp_path, monkeypatch, capsys):
    task, _ = load_task(gpt_base)
    monkeypatch.setitem(checker.RUNTIMES, "llama.cpp", Disagrees(task.model.config.vocab_size))
    code = export_gguf(monkeypatch, gpt_base, tmp_path / "exported", "checker.unchecked=keep")
    err = capsys.readouterr().err
    assert code == 2 and "llama.cpp's run of the f32 file gives logits" in err and "nothing was written" in err
    assert_one_line_error(err)
    assert only(tmp_path) == []


@pytest.mark.parametrize(
    "args,words", [(["checker.timeout=0"], "checker.timeout=0"), (["checker.unchecked=maybe"], "keep")]
)
def test_bad_checker_settings_are_one_line(gpt_base, tmp_path, monkeypatch, capsys, args, words):
    code = export_gguf(monkeypatch, gpt_base, tmp_path / "exported", *args)
    err = capsys.readouterr().err
    assert code == 2 and words in err
    assert_one_line_error(err)
    assert only(tmp_path) == []


@pytest.mark.slow
def test_an_onnxruntime_that_segfaults_keeps_the_export(gpt_base, tmp_path, monkeypatch, capsys):
    pytest.importorskip("onnxruntime")
    monkeypatch.setitem(checker.RUNTIMES, "onnxruntime", Segfaults("onnxruntime"))
    out = tmp_path / "exported"
    with pytest.raises(SystemExit) as stop:
        export_in_process(monkeypatch, f"ckpt_path={gpt_base}", f"out={out}", "format=onnx")
    err = capsys.readouterr().err
    assert stop.value.code == 3 and f"onnxruntime crashed (SIGSEGV) while checking {out}/model.onnx" in err
    assert_one_line_error(err)
    assert only(tmp_path) == ["exported"] and (out / "model.onnx").is_file()


@pytest.mark.slow
def test_the_real_llama_cpp_checks_through_the_child(gpt_base, tmp_path):
    """With llama-cpp-python installed: either a checked export (exit 0, llama.cpp's figures said) or,
    where its build crashes on this CPU, the one line and the file kept, never a silent exit 139."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    out = tmp_path / "exported"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tasks.cli.export",
            f"ckpt_path={gpt_base}",
            f"out={out}",
            "format=gguf",
            "gguf.dtype=q8_0",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 3), done.stderr[-3000:]
    if done.returncode == 0:
        assert "llama.cpp runs it: max abs diff" in done.stdout
    else:
        assert_one_line_error(done.stderr)
        assert "zoo: Unchecked: llama.cpp" in done.stderr
    assert only(tmp_path) == ["exported"] and only(out) == EXPORTED
