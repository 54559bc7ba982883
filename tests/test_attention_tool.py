"""zoo-attention and the analysis under it: attention rollout, entropy normalised under a causal
mask, head flags, capture on the three forms, and the command end to end at tiny size."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import zoo
from tasks.cli.attention.maps import attention_report
from tasks.cli.console import quote_free_text
from tasks.cli.schemas import conf_dir
from tasks.data.tokenizers import train_tokenizer, with_cls_sep
from zoo.inspect import attention_rollout, capture_attention, head_stats, layers_by_kind, row_entropy

LINES = [
    "def add(a, b):\n    return a + b",
    "Return the running event loop.",
    "three hundred and twelve",
    "trois cent douze",
    "class Point:\n    x: int = 0",
    "Close the stream and wait.",
] * 4


def causal_uniform(T: int, H: int = 1) -> torch.Tensor:
    """Uniform attention over what a causal mask lets each row see, (1, H, T, T)."""
    allowed = torch.ones(T, T).tril()
    return (allowed / allowed.sum(-1, keepdim=True)).expand(1, H, T, T)


# ---- rollout -------------------------------------------------------------------------------------
def test_rollout_rows_sum_to_one_and_stay_causal():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 2, 4, 6, 6, generator=g)  # (L, B, H, T, T)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    for mask in (None, causal):
        layers = list((scores if mask is None else scores.masked_fill(~mask, -math.inf)).softmax(-1))
        rollout = attention_rollout(layers)
        assert rollout.shape == (2, 6, 6)
        torch.testing.assert_close(rollout.sum(-1), torch.ones(2, 6))
        if mask is not None:
            assert rollout.triu(diagonal=1).abs().max() == 0  # no token draws from the future
    assert attention_rollout(list(scores.softmax(-1)[:, 0])).shape == (6, 6)  # unbatched (H, T, T) works too


def test_rollout_of_identity_attention_is_identity():
    eye = torch.eye(5).expand(1, 3, 5, 5)
    torch.testing.assert_close(attention_rollout([eye, eye, eye]), torch.eye(5)[None])
    torch.testing.assert_close(attention_rollout([eye, eye], residual=False), torch.eye(5)[None])


def test_rollout_two_layers_by_hand():
    # layer 1, one head: causal, row 1 half on each token. With the residual: (A + I) / 2
    a1 = torch.tensor([[[1.0, 0.0], [0.5, 0.5]]])  # (H=1, 2, 2)
    # layer 2, two heads whose average is uniform: [[1, 0], [1, 0]] and [[0, 1], [0, 1]]
    a2 = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0]]])  # (H=2, 2, 2)
    # A1' = [[1, 0], [.25, .75]], A2' = [[.75, .25], [.25, .75]], R = A2' A1'
    expected = torch.tensor([[0.8125, 0.1875], [0.4375, 0.5625]])
    torch.testing.assert_close(attention_rollout([a1, a2]), expected)
    # without the residual: mean(A2) A1 = [[.5, .5], [.5, .5]] @ A1 = [[.75, .25], [.75, .25]]
    torch.testing.assert_close(attention_rollout([a1, a2], residual=False), torch.tensor([[0.75, 0.25]] * 2))


# ---- entropy and flags ---------------------------------------------------------------------------
def test_entropy_is_normalised_by_the_keys_each_row_sees():
    T = 7
    entropy, normalised = row_entropy(causal_uniform(T, H=2))
    torch.testing.assert_close(entropy[0, 0], torch.log(torch.arange(1, T + 1).float()))
    assert normalised[..., 0].isnan().all()  # row 0 sees one key: nothing to normalise
    torch.testing.assert_close(normalised[..., 1:], torch.ones(1, 2, T - 1))
    one_hot = torch.eye(T).expand(1, 1, T, T)  # every row on its own position
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    _, normalised = row_entropy(one_hot, visible)  # the mask cannot be read off one-hot rows: pass it
    torch.testing.assert_close(normalised[..., 1:], torch.zeros(1, 1, T - 1))
    # bidirectional uniform attention: log T everywhere, normalised 1
    _, normalised = row_entropy(torch.full((1, 1, T, T), 1 / T))
    torch.testing.assert_close(normalised, torch.ones(1, 1, T))


def test_flags_name_sink_flat_diagonal_and_previous_heads():
    T = 8
    sink = torch.zeros(T, T)
    sink[:, 0] = 1
    previous = torch.zeros(T, T)
    previous[0, 0] = 1
    previous[torch.arange(1, T), torch.arange(T - 1)] = 1
    heads = torch.stack([sink, causal_uniform(T)[0, 0], torch.eye(T), previous])[None]  # (1, 4, T, T)
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    stats = head_stats(heads, visible=visible)
    assert stats.flags() == [["sink"], ["flat"], ["diagonal"], ["previous"]]
    torch.testing.assert_close(stats.norm_entropy, torch.tensor([0.0, 1.0, 0.0, 0.0]))
    assert stats.first_mass[0] == 1 and stats.self_mass[2] == 1 and stats.prev_mass[3] == 1
    # thresholds are the caller's: nothing is flat above 1; sink=0 flags every head but the diagonal one
    assert stats.flags(flat=1.01, sink=2.0, diagonal=2.0) == [[], [], [], []]
    assert [("sink" in f) for f in stats.flags(sink=0.0)] == [True, True, False, True]
    cross = head_stats(heads[..., :5], self_attention=False)  # (1, 4, 8, 5): no own or previous position
    assert cross.self_mass.isnan().all() and cross.prev_mass.isnan().all()


# ---- capture on the three forms ------------------------------------------------------------------
def tiny(arch: str, vocab_size: int = 64, **overrides) -> zoo.ZooModel:
    extra = {"pooler": True} if arch == "encoder" else {}
    if arch == "encoder_decoder":
        extra = {"position": "t5_relative", "eos_token_id": 3, "pad_token_id": 0}
    cfg = zoo.ModelConfig(
        arch=arch,
        vocab_size=vocab_size,
        d_model=32,
        n_layers=2,
        n_heads=4,
        d_ff=64,
        max_seq_len=64,
        **{**extra, **overrides},
    )
    return zoo.build_model(cfg, seed=0).eval()


@pytest.mark.parametrize(
    "arch,kinds",
    [
        ("encoder", ["encoder self"]),
        ("decoder", ["decoder self"]),
        ("encoder_decoder", ["encoder self", "decoder self", "cross"]),
    ],
)
def test_capture_gives_every_layer_of_each_form(arch, kinds):
    model = tiny(arch)
    src, tgt = torch.randint(5, 64, (1, 9)), torch.randint(5, 64, (1, 4))
    with torch.no_grad(), capture_attention(model) as probs:
        model(src, tgt) if arch == "encoder_decoder" else model(src)
    groups = layers_by_kind(probs)
    assert list(groups) == kinds and all(len(names) == 2 for names in groups.values())
    expected = {
        "encoder self": (1, 4, 9, 9),
        "decoder self": (1, 4, 4, 4) if arch == "encoder_decoder" else (1, 4, 9, 9),
        "cross": (1, 4, 4, 9),
    }
    for kind, names in groups.items():
        assert all(probs[n].shape == expected[kind] for n in names), kind
        rollout = attention_rollout([probs[n] for n in names]) if kind != "cross" else None
        if rollout is not None:
            torch.testing.assert_close(rollout.sum(-1), torch.ones(rollout.shape[:2]))


def test_layers_are_ordered_by_number_not_by_text():
    captured = {f"decoder.blocks.{i}.attn": torch.zeros(1) for i in (10, 2, 0, 1)}
    assert layers_by_kind(captured) == {"decoder self": [f"decoder.blocks.{i}.attn" for i in (0, 1, 2, 10)]}


# ---- the command ---------------------------------------------------------------------------------
TOKENIZER_KIND = {"encoder": "wordpiece", "decoder": "bpe", "encoder_decoder": "unigram"}


def saved_model(arch: str, folder: Path) -> Path:
    """An untrained tiny model with a tokenizer trained here, as zoo-export writes it."""
    tokenizer = train_tokenizer(LINES, TOKENIZER_KIND[arch], vocab_size=120)
    if arch == "encoder":
        tokenizer = with_cls_sep(tokenizer)
    zoo.save_pretrained(tiny(arch, vocab_size=tokenizer.get_vocab_size()), folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def report(out: Path, *overrides: str) -> dict:
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = compose("attention", overrides=quote_free_text(list(overrides), keys=("prompt", "text", "target")))
    return attention_report(cfg, out)


def heads_table(out: Path) -> list[list[str]]:
    lines = (out / "heads.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| module"))
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[start + 2 :] if line.startswith("|")]


@pytest.mark.parametrize(
    "arch,text,pngs",
    [
        (
            "encoder",
            "Return the running event loop.",
            ["encoder_self_layer0", "encoder_self_layer1", "rollout_encoder"],
        ),
        ("decoder", "a = 1\n    b", ["decoder_self_layer0", "decoder_self_layer1", "rollout_decoder"]),
        pytest.param(
            "encoder_decoder",
            "three hundred and twelve",
            [
                "cross_layer0",
                "cross_layer1",
                "decoder_self_layer0",
                "decoder_self_layer1",
                "encoder_self_layer0",
                "encoder_self_layer1",
                "rollout_decoder",
                "rollout_encoder",
            ],
            marks=pytest.mark.slow,
        ),
    ],
)
def test_zoo_attention_writes_maps_and_table_for_each_form(arch, text, pngs, tmp_path):
    import matplotlib.image

    folder = saved_model(arch, tmp_path / "model")
    target = ["target=trois cent douze"] if arch == "encoder_decoder" else []
    out = tmp_path / "out"
    summary = report(out, f"model_dir={folder}", f"text={text}", *target, "max_tokens=12")  # small figures: fast
    assert sorted(p.stem for p in out.glob("*.png")) == pngs  # one heatmap per layer and kind, one rollout per stack
    for png in out.glob("*.png"):
        assert matplotlib.image.imread(png).shape[0] > 200  # a real image, not an empty file
    rows = heads_table(out)
    n_modules = 6 if arch == "encoder_decoder" else 2
    assert len(rows) == n_modules * 4 == summary["heads"]  # layers x heads
    # an untrained model (weights ~ N(0, 0.02)) attends almost uniformly: every head is flat
    assert all("flat" in row[-1] for row in rows) and summary["flags"]["flat"] == len(rows)
    assert all(0.9 < float(row[5]) <= 1.0 for row in rows)
    if arch == "decoder":  # whitespace is visible in the labels: newline and indentation as marks
        assert any("↵" in t for t in summary["tokens"]) and not any(c in "".join(summary["tokens"]) for c in " \n")
    if arch == "encoder_decoder":
        assert summary["tokens"][-1] == "</s>" and summary["target_tokens"][0] == "<pad>"  # start token
        assert {r[1] for r in rows} == {"encoder self", "decoder self", "cross"}
        assert all(r[7] == "–" for r in rows if r[1] == "cross")  # no own position across sequences


def test_the_terminal_shows_table_rows_heads_and_heads_md_all(tmp_path, capsys):
    folder = saved_model("decoder", tmp_path / "model")
    summary = report(tmp_path / "out", f"model_dir={folder}", "text=def f(x):", "plots=false", "table_rows=3")
    printed = capsys.readouterr().out
    assert summary["heads"] == len(heads_table(tmp_path / "out")) == 8
    assert "3 of 8, the flagged first: all of them are in heads.md" in printed
    assert table_rows(printed) == 3
    report(tmp_path / "all", f"model_dir={folder}", "text=def f(x):", "plots=false", "table_rows=null")
    printed = capsys.readouterr().out
    assert "of 8" not in printed and table_rows(printed) == 8


def table_rows(printed: str) -> int:
    """The heads in the table zoo-attention printed (each row names its kind: decoder self)."""
    return sum(line.count("self") for line in printed.splitlines() if line.startswith("│"))


def test_prompt_is_what_text_was(tmp_path):
    folder = saved_model("decoder", tmp_path / "model")
    by_prompt = report(tmp_path / "a", f"model_dir={folder}", "prompt=def add(a, b):", "plots=false")
    by_text = report(tmp_path / "b", f"model_dir={folder}", "text=def add(a, b):", "plots=false")
    assert by_prompt["tokens"] == by_text["tokens"] and len(by_prompt["tokens"]) > 3


def test_zoo_attention_translates_when_no_target_is_given_and_cuts_long_texts(tmp_path):
    folder = saved_model("encoder_decoder", tmp_path / "model")
    summary = report(
        tmp_path / "out",
        f"model_dir={folder}",
        "text=three hundred and twelve " * 4,
        "max_tokens=6",
        "max_new_tokens=3",
        "plots=false",
    )
    assert not list((tmp_path / "out").glob("*.png")) and len(heads_table(tmp_path / "out")) == 24
    assert summary["files"] == ["heads.md", "summary.json"]
    assert len(summary["tokens"]) == 6 and 1 < len(summary["target_tokens"]) <= 4
    assert any("greedy translation" in n for n in summary["notes"])
    assert any("cut to its first 6" in n for n in summary["notes"])
    assert "cut to its first 6" in (tmp_path / "out" / "heads.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "overrides,message",
    [
        ([], "give ckpt_path="),
        (["ckpt_path=/nonexistent.ckpt", "text=x"], "is not a file"),
        (["model_dir=MODEL"], 'prompt="…" is required'),
        (["model_dir=MODEL", "text=hello", "target=bonjour"], "target= is for encoder-decoder models"),
        (["model_dir=MODEL", "prompt=hello", "text=bye"], "prompt= and text= name the same text here"),
    ],
)
def test_bad_input_is_one_line_error(overrides, message, tmp_path, capsys):
    folder = saved_model("decoder", tmp_path / "model")
    with pytest.raises(SystemExit) as stop:
        report(tmp_path / "out", *[o.replace("MODEL", str(folder)) for o in overrides])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("zoo: ") and message in err and "\n" not in err


def generator_checkpoint(path: Path) -> Path:
    """A checkpoint as zoo-train writes it (plain data: config, tokenizer JSON, tensors), untrained."""
    import lightning

    from tasks import GeneratorTask

    tokenizer = train_tokenizer(LINES, "bpe", vocab_size=120)
    model = tiny("decoder", vocab_size=tokenizer.get_vocab_size(), position="learned")
    task = GeneratorTask(model=model.config.to_dict(), optimizer={}, tokenizer_json=tokenizer.to_str())
    torch.save(
        {
            "state_dict": task.state_dict(),
            "hyper_parameters": dict(task.hparams),
            "tokenizer_json": tokenizer.to_str(),
            "zoo_run": {"task": "generator", "data_module": "LMDataModule", "data": {}, "config_yaml": ""},
            "pytorch-lightning_version": lightning.__version__,
            "global_step": 0,
            "epoch": 0,
        },
        path,
    )
    return path


@pytest.mark.slow
def test_real_command_on_a_checkpoint(tmp_path):
    """``python -m tasks.cli.attention`` as a user runs it (the zoo-attention entry point)."""
    ckpt = generator_checkpoint(tmp_path / "last.ckpt")
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tasks.cli.attention",
            f"ckpt_path={ckpt}",
            "text=def add(a, b): return a + b",
            f"hydra.run.dir={tmp_path / 'out'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"wrote 5 files to {tmp_path / 'out'}" in run.stdout  # 2 layers, 1 rollout, heads.md, summary.json
    assert len(heads_table(tmp_path / "out")) == 8
    summary = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    assert "".join(summary["tokens"]).replace("␣", " ") == "def add(a, b): return a + b"  # one label per token
