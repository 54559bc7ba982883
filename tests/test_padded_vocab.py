"""A padded vocabulary (``vocab_multiple_of``): the embedding and head rows rounded up to a multiple, the
padding never seen outside the model. The same losses and gradients as the unpadded model, no padded id
ever generated, exports and imports with the true vocabulary, the published counts, zoo-info showing it."""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F
from conftest import tiny_config
from test_export_safety import export_in_process

import zoo
from tasks import TASKS
from tasks.cli.loading import load_task
from tasks.cli.pretrained import as_checkpoint
from zoo.cli import info_main

V, MULTIPLE = 61, 16  # 64 rows: 3 of padding

FORMS = {
    "decoder, tied head": dict(arch="decoder"),
    "decoder, own head": dict(arch="decoder", tie_embeddings=False),
    "encoder_decoder": dict(arch="encoder_decoder", position="t5_relative", tie_embeddings=False),
    "encoder, MLM head": dict(arch="encoder", mlm_head=True, type_vocab_size=2),
}


def pair(**form) -> tuple[zoo.ZooModel, zoo.ZooModel]:
    """(unpadded, padded) models of one config, the padded one holding the unpadded one's weights."""
    plain = zoo.build_model(tiny_config(**form), seed=0)
    padded = zoo.build_model(tiny_config(vocab_multiple_of=MULTIPLE, **form), seed=1)  # other weights...
    padded.load_state_dict(plain.state_dict())  # ...replaced: the true rows copied, the padding zero
    return plain, padded


def logits_of(model: zoo.ZooModel, ids: torch.Tensor) -> torch.Tensor:
    if model.config.arch == "encoder":
        return model.mlm_logits(model(ids))
    if model.config.arch == "encoder_decoder":
        return model(ids, ids[:, :-1])
    return model(ids)


def test_padded_rows_are_a_multiple_and_one_means_none():
    assert tiny_config(vocab_multiple_of=MULTIPLE).padded_vocab_size == 64
    assert tiny_config(vocab_multiple_of=1).padded_vocab_size == tiny_config().padded_vocab_size == V
    assert zoo.get_config("gpt2").padded_vocab_size == 50_304
    with torch.device("meta"):
        assert zoo.create_model("gpt-tiny", vocab_size=300).embed.weight.shape[0] == 384
    with pytest.raises(zoo.ConfigError, match="vocab_multiple_of=0 must be a positive integer"):
        tiny_config(vocab_multiple_of=0).validate()


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
def test_the_same_losses_and_gradients_padded_and_unpadded(form):
    plain, padded = pair(**form)
    ids = torch.randint(0, V, (3, 12), generator=torch.Generator().manual_seed(0))
    losses, grads = [], []
    for model in (plain, padded):
        logits = logits_of(model.train(), ids)  # dropout 0: train mode computes what eval does
        assert logits.shape[-1] == V  # the padding's logits never leave the model
        labels = ids[:, : logits.shape[1]]
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), label_smoothing=0.1)  # smoothing: all of V
        loss.backward()
        losses.append(loss.detach())
        grads.append({k: p.grad for k, p in model.named_parameters()})
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=1e-6)
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name][: grad.shape[0]], grad, rtol=1e-5, atol=1e-7)
    for name, table in padded.vocab_tables().items():
        assert table.grad[V:].abs().max() == 0, name  # the padding learns nothing


def test_the_padding_rows_start_at_zero():
    padded = zoo.build_model(tiny_config(tie_embeddings=False, vocab_multiple_of=MULTIPLE), seed=3)
    assert all(table[V:].abs().max() == 0 and table[:V].abs().min() > 0 for table in padded.vocab_tables().values())


def test_the_chunked_loss_reads_the_true_vocabulary():
    plain, padded = pair(arch="decoder")
    ids = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(1))
    want = F.cross_entropy(plain(ids).flatten(0, 1), ids.flatten())
    got = zoo.chunked_cross_entropy(padded.features(ids), padded.logits, ids, chunk=5)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def _tempting(model: zoo.ZooModel) -> zoo.ZooModel:
    """``model`` whose padding rows would win every argmax and nearly every draw, were their logits not cut
    off: every final hidden state all ones (the final LayerNorm's gain 0, its bias 1), so that a padding
    row of ones scores d_model = 32 where a true row scores about N(0, 0.2 * sqrt(32))."""
    with torch.no_grad():
        norm = model.stacks()[-1].final_norm
        norm.weight.zero_()
        norm.bias.fill_(1.0)
        for table in model.vocab_tables().values():
            table[V:] = 1.0
    return model.eval()


@pytest.mark.parametrize("form", [FORMS["decoder, tied head"], FORMS["decoder, own head"], FORMS["encoder_decoder"]])
@pytest.mark.parametrize(
    "settings",
    [
        dict(),
        dict(do_sample=True, temperature=5.0),
        dict(do_sample=True, top_p=0.99, temperature=3.0),
        dict(num_beams=3),
        dict(use_cache=False),
        dict(compile=True),
    ],
    ids=["greedy", "sampled", "top-p", "beams", "uncached", "static step"],
)
def test_generation_never_produces_a_padded_id(form, settings):
    cfg = tiny_config(vocab_multiple_of=MULTIPLE, norm="layernorm", bias=True, **form)
    model = _tempting(zoo.build_model(cfg, seed=0))
    ids = torch.randint(5, V, (2, 6), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    out = model.generate(ids, max_new_tokens=10, **settings)
    assert out.max() < V and out.shape[1] > ids.shape[1]


@pytest.fixture
def gpt_like() -> zoo.ZooModel:
    """A GPT-2 layout of 200 tokens, padded to 256 rows as the gpt presets pad theirs."""
    model = zoo.create_model("gpt-tiny", vocab_size=200, n_layers=1, d_model=32, n_heads=2, seed=0)
    assert model.embed.weight.shape[0] == 256
    return model.eval()


def test_an_hf_export_reloads_with_the_true_vocabulary_and_imports_back_padded(gpt_like, tmp_path):
    transformers = pytest.importorskip("transformers")
    zoo.to_hf(gpt_like, tmp_path / "hf")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert theirs.config.vocab_size == 200 and theirs.get_input_embeddings().weight.shape[0] == 200
    ids = torch.randint(0, 200, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = gpt_like(ids)
        torch.testing.assert_close(theirs(ids).logits, want, rtol=1e-4, atol=1e-5)
        back = zoo.from_hf(tmp_path / "hf")  # the folder's model: unpadded
        assert back.config.padded_vocab_size == 200
        preset = zoo.create_model("gpt-tiny", vocab_size=200, n_layers=1, d_model=32, n_heads=2, seed=5).eval()
        preset.load_state_dict(back.state_dict())  # into the padded preset: its 200 rows, the padding zero
        torch.testing.assert_close(preset(ids), want, rtol=1e-5, atol=1e-6)
        repadded = back.with_vocab_multiple(128)
        assert repadded.embed.weight.shape[0] == 256 and repadded.config.vocab_multiple_of == 128
        torch.testing.assert_close(repadded(ids), want, rtol=1e-5, atol=1e-6)


def test_a_gguf_export_reloads_with_the_true_vocabulary(gpt_like, tmp_path):
    pytest.importorskip("gguf")
    zoo.to_gguf(gpt_like, tmp_path / "m.gguf", dtype="f32")
    got = zoo.read_gguf(tmp_path / "m.gguf", tokenizer=False).model.eval()
    assert got.config.vocab_size == 200 and got.embed.weight.shape[0] == 200
    ids = torch.randint(0, 200, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(got(ids), gpt_like(ids), rtol=1e-5, atol=1e-6)
        preset = zoo.create_model("gpt-tiny", vocab_size=200, n_layers=1, d_model=32, n_heads=2).eval()
        preset.load_state_dict(got.state_dict())
        torch.testing.assert_close(preset(ids), gpt_like(ids), rtol=1e-5, atol=1e-6)


def test_another_vocabulary_is_still_refused(gpt_like):
    other = zoo.create_model("gpt-tiny", vocab_size=201, n_layers=1, d_model=32, n_heads=2, vocab_multiple_of=1)
    with pytest.raises(RuntimeError, match="size mismatch for embed.weight"):
        gpt_like.load_state_dict(other.state_dict())


def test_an_unpadded_checkpoint_loads_as_before(tmp_path):
    """A config stored before vocab_multiple_of existed builds the unpadded model its weights fit."""
    stored = {k: v for k, v in zoo.get_config("gpt-tiny", vocab_size=200).to_dict().items() if k != "vocab_multiple_of"}
    cfg = zoo.ModelConfig.from_dict(stored)
    assert cfg.vocab_multiple_of is None and cfg.padded_vocab_size == 200
    old = zoo.build_model(cfg, seed=0)
    zoo.save_pretrained(old, tmp_path / "old")
    again = zoo.load_pretrained(tmp_path / "old")
    assert again.embed.weight.shape[0] == 200 and torch.equal(again.embed.weight, old.embed.weight)


def test_counts_say_what_they_count():
    s = zoo.stats("gpt2")
    with torch.device("meta"):
        assert s.params == zoo.count_parameters(zoo.create_model("gpt2")) == 124_439_808  # the published count
    assert (s.vocab_size, s.padded_vocab_size, s.padding_params) == (50_257, 50_304, 47 * 768)
    plain = zoo.stats("gpt2", vocab_multiple_of=1)
    assert plain.params == s.params and plain.embedding_params == s.embedding_params
    assert plain.flops_per_token_forward == s.flops_per_token_forward  # model FLOPs: the true vocabulary's
    assert plain.padding_params == 0 and plain.padded_vocab_size == 50_257


def test_zoo_info_shows_the_padding(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    info_main(["gpt2", "t5-small"])
    out = capsys.readouterr().out
    assert "50,257 (50,304 rows)" in out and "32,128 " in out and "32,128 (" not in out
    info_main(["gpt2", "--json"])
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["vocab_size"], row["padded_vocab_size"], row["params"]) == (50_257, 50_304, 124_439_808)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["safetensors", "onnx", "hf", "gguf"])
def test_zoo_export_writes_the_true_vocabulary(gpt_base, tmp_path, monkeypatch, fmt):
    """A zoo-train run of the gpt-tiny preset, its tokenizer's vocabulary padded to a multiple of 128 rows,
    through every format of zoo-export: each file holds the vocabulary's rows alone and reloads with them."""
    ckpt = gpt_base  # a tiny gpt_generator run's last.ckpt (conftest)
    task, _ = load_task(ckpt)
    vocab, rows = task.model.config.vocab_size, task.model.embed.weight.shape[0]
    assert rows % 128 == 0 and rows > vocab  # the run trained a padded model
    out = tmp_path / fmt
    export_in_process(monkeypatch, f"ckpt_path={ckpt}", f"out={out}", f"format={fmt}")
    record = json.loads((out / "config.json").read_text())
    ids = torch.randint(0, vocab, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = task.model(ids)
    if fmt == "safetensors":
        got = zoo.load_pretrained(out)
        assert got.embed.weight.shape[0] == vocab and got.config.padded_vocab_size == vocab
        torch.testing.assert_close(got(ids), want)
    elif fmt == "onnx":
        import onnx
        import onnxruntime

        graph = onnx.load(str(out / "model.onnx"))
        assert not [i.name for i in graph.graph.initializer if i.dims and i.dims[0] == rows]  # no padded table
        session = onnxruntime.InferenceSession(str(out / "model.onnx"))
        given = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        (logits,) = session.run(None, {i.name: given[i.name].numpy() for i in session.get_inputs()})
        assert logits.shape[-1] == vocab and record["model"]["vocab_size"] == vocab
    elif fmt == "hf":
        assert record["vocab_size"] == vocab
        tensors = safetensors.torch.load_file(out / "model.safetensors")
        assert tensors["transformer.wte.weight"].shape[0] == vocab
        assert all(t.shape[0] != rows for t in tensors.values())
    else:
        got = zoo.read_gguf(out / "model.gguf").model.eval()
        assert got.embed.weight.shape[0] == vocab
        torch.testing.assert_close(got(ids), want, rtol=1e-4, atol=1e-4)


def _small(vocab: int, **kw) -> zoo.ModelConfig:
    return zoo.get_config("gpt-tiny", vocab_size=vocab, n_layers=1, d_model=32, n_heads=2, **kw)


def test_init_from_fits_the_vocabulary_rows_of_a_checkpoint_padded_otherwise_and_refuses_another_vocabulary():
    """A checkpoint saved before the presets padded (200 rows) starts a padded run (256 rows), its padding
    zero, the same logits; a padded one starts an unpadded run; another vocabulary stays refused."""
    plain = zoo.build_model(_small(200, vocab_multiple_of=1), seed=0).eval()
    task = TASKS.get("generator")(model=_small(200).to_dict(), optimizer={})
    task.init_from(as_checkpoint(plain), source="old.ckpt")
    table = task.model.embed.weight
    assert table.shape[0] == 256 and torch.equal(table[:200], plain.embed.weight) and table[200:].abs().max() == 0
    ids = torch.randint(0, 200, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(task.model.eval()(ids), plain(ids), rtol=1e-5, atol=1e-6)
    unpadded = TASKS.get("generator")(model=plain.config.to_dict(), optimizer={})
    unpadded.init_from(as_checkpoint(task.model), source="padded.ckpt")
    assert torch.equal(unpadded.model.embed.weight, plain.embed.weight)
    other = zoo.build_model(_small(201, vocab_multiple_of=1), seed=0)
    with pytest.raises(zoo.ConfigError) as refused:
        task.init_from(as_checkpoint(other), source="other.ckpt")
    message = str(refused.value)
    assert "\n" not in message and message.startswith("init_from=other.ckpt: 1 tensors differ in shape")
    assert "model.embed.weight (201, 32) there, (256, 32) here" in message


@pytest.mark.slow  # a tiny HF folder made, one step trained and exported in process: ~20 s
def test_a_run_from_an_hf_folder_trains_the_presets_padded_rows_and_exports_the_true_vocabulary(
    tmp_path, monkeypatch, capsys
):
    transformers = pytest.importorskip("transformers")
    from hf_pretrained_folders import _gpt2
    from test_tasks import compose_train

    from tasks.cli.train.training import train

    folder = _gpt2(tmp_path / "folder")
    theirs = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    vocab = theirs.config.vocab_size
    cfg = compose_train(
        "gpt_generator", tmp_path / "run", f"init_from={folder}", "trainer.max_steps=1", "optimizer.lr=1e-12"
    )
    train(cfg)
    assert f"its {vocab:,} tokens padded to 384 rows (vocab_multiple_of=128)" in capsys.readouterr().out
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    task, _ = load_task(ckpt)
    model = task.model.eval()
    assert model.config.vocab_multiple_of == 128 and model.embed.weight.shape[0] == 384 > vocab
    assert model.embed.weight[vocab:].abs().max() == 0  # the padding rows: zero, and they stay so
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = theirs(ids).logits
        torch.testing.assert_close(model(ids), want, rtol=1e-4, atol=1e-4)  # an lr of 1e-12: the folder's weights
        export_in_process(monkeypatch, f"ckpt_path={ckpt}", f"out={tmp_path / 'hf'}", "format=hf")
        back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
        assert back.transformer.wte.weight.shape[0] == back.config.vocab_size == vocab
        torch.testing.assert_close(back(ids).logits, want, rtol=1e-4, atol=1e-4)
