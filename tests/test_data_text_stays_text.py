"""Text learnt from a user's data (a tokenizer's vocabulary, label names) reaches the task as it is:
OmegaConf reads "${" as an interpolation, and Python source is full of them (f-strings in shell
snippets, string.Template), so none of it may pass through a config."""

from __future__ import annotations

import json

from test_tasks import compose_train

import zoo
from tasks.cli.train.training import train

SHELL = ["echo ${HOME} ${PATH:-/bin}", "x = Template('${name} is ${age}')", "run ${{ matrix.os }}"]


def test_a_tokenizer_with_dollar_braces_trains_and_is_kept(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("\n".join(SHELL * 300))
    out = tmp_path / "run"
    args = (
        "data.source=local",
        "~data.source_args.max_files",
        f"+data.source_args.path={tmp_path / 'corpus'}",
        "test=false",
    )
    train(compose_train("gpt_generator", out, *args))
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    assert any("${" in token for token in vocab)  # the case this is about happened


def test_label_names_with_dollar_braces_reach_the_task(tmp_path):
    rows = [
        {"text": f"{line} number {i}", "label": "${a}" if i % 2 else "${b:-c}"} for i, line in enumerate(SHELL * 60)
    ]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "run"
    args = ("data.source=local", f"+data.source_args.path={tmp_path / 'rows.jsonl'}", "test=false")
    train(compose_train("bert_classifier", out, *args))
    checkpoint = zoo.load_weights_file(out / "checkpoints" / "last.ckpt")
    assert checkpoint["hyper_parameters"]["label_names"] == ["${a}", "${b:-c}"]
