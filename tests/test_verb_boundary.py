"""The one-line rule at the verbs' boundary (issue 20, items 7 and 11): what Hydra raises while
composing, what the machine refuses, and a file or value a verb cannot read each end in one
``zoo: <Kind>:`` line naming the field or path and the fix, and a refused command leaves no run
directory behind. Each runs the real command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_reliability import one_line_error, run

pytestmark = pytest.mark.slow
GPT = ["experiment=gpt_generator", "trainer.max_steps=1"]


def _runs(cwd: Path) -> list[Path]:
    """Every run directory under cwd's outputs/ (one holding a .hydra record)."""
    return sorted(p.parent for p in (cwd / "outputs").rglob(".hydra"))


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        (
            "model/position=rop",
            ["model/position=rop is not a choice of model/position", "did you mean model/position=rope?"],
        ),
        ("trainer.max_step=10", ["trainer.max_step is not a key of trainer", "did you mean trainer.max_steps=10?"]),
        ("trainer=gpu", ["this machine has no GPU", "use trainer=cpu"]),
        ("model/position=rope,alibi", ["add -m (--multirun)", "model/position=[rope,alibi] for a list"]),
        ("modl/position=rope", ["modl/position is not a config group", "did you mean model/position=rope?"]),
    ],
)
def test_a_mistake_hydra_or_lightning_sees_is_one_line_and_leaves_no_run(override, needles, tmp_path):
    done = run("train", *GPT, override, cwd=tmp_path)
    line = one_line_error(done, "ConfigError", *needles)
    assert "+trainer" not in line  # not Hydra's advice to add a key that was misspelt
    assert "hydra/" not in line and len(line) < 400  # the user's groups, not Hydra's own
    assert _runs(tmp_path) == []


def test_a_run_directory_below_a_file_is_one_line(tmp_path):
    (tmp_path / "a-file").write_text("mine")
    done = run("train", *GPT, "hydra.run.dir=a-file/run", cwd=tmp_path)
    one_line_error(done, "a-file/run", "Not a directory", "hydra.run.dir=", code=1)
    assert (tmp_path / "a-file").read_text() == "mine"


def test_a_data_record_that_is_not_text_names_the_file_and_the_record(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(40)) + '{"text": 42}\n')
    done = run("train", *GPT, "data=local_text", f"data.source_args.path={corpus}", cwd=tmp_path)
    one_line_error(done, "DataError", f"path={corpus}", "record 40", "'text' = 42 (of type int), not text")
    assert _runs(tmp_path) == []


def test_eval_past_the_position_table_names_the_longest_length(gpt_base, tmp_path):
    done = run("evaluate", f"ckpt_path={gpt_base}", "+data.seq_len=100000", cwd=tmp_path)
    one_line_error(
        done, "UserError", "data.seq_len=100000 is longer than the model's position table", "give at most data.seq_len="
    )


@pytest.mark.parametrize(
    ("verb", "setting"), [("generate", "prompt: ???"), ("evaluate", "split: test"), ("attention", "prompt: null")]
)
def test_help_of_a_verb_that_reads_a_checkpoint_lists_its_own_settings(verb, setting, tmp_path):
    done = run(verb, "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert setting in done.stdout and "Configuration groups" not in done.stdout and "experiment:" not in done.stdout
    assert done.stdout.startswith(f"zoo-{verb.replace('evaluate', 'eval')}: ")


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["trainer=tp", "optimizer=muon"], ["optimizer=muon updates each weight matrix as a whole", "optimizer=adamw"]),
        (["experiment=t5_translator", "trainer=pp"], ["trainer=pp trains tasks that cut", "TranslatorTask"]),
        (["trainer=tp", "trainer.num_nodes=2"], ["trainer.num_nodes=2", "set trainer.num_nodes=1"]),
    ],
)
def test_what_a_strategy_refuses_is_refused_once_before_any_process_starts(overrides, needles, tmp_path):
    """Issue 37, item 4: the refusal is made when the run is composed, once (not once per rank), names the
    user's choice, and leaves nothing behind, not even the empty outputs/ folders the run would have used."""
    done = run("train", "trainer.max_steps=1", *overrides, cwd=tmp_path)
    one_line_error(done, *needles)
    assert "Initializing distributed" not in done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == []
