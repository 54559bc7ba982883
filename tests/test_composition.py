"""Packed documents and sliding windows compose: ``mask=document`` with ``window=W`` lets a query see
the keys of its own document within the window, so a packed row computes, for each document, what
``mask=sliding_window`` computes for that document alone; generation (one document) keeps a KV
cache of W - 1 positions; and a LoRA run of a packed, checkpointed, sliding-window Llama trains,
exports to transformers (as Mistral: one document is all a prompt is) and generates."""

from __future__ import annotations

import csv
import math
import re

import pytest
import torch
from conftest import tiny_config, tiny_model
from rounding import assert_rounding_close
from test_reliability import run
from test_tasks import STEPS, TINY
from torch import Tensor

import zoo
from tasks.cli.loading import load_task
from zoo.mask import Document, DocumentWindow

W = 3  # shorter than every document below, so the window matters
LENGTHS = (5, 7, 4)  # one packed row of three documents, T = 16
POSITIONS = ["rope", "learned", "alibi", "t5_relative"]


def _model(position: str, mask: str, window: int | None = W, **kw) -> zoo.ZooModel:
    """Masks hold no weights: one seed gives every mask the same model."""
    return tiny_model(position=position, mask=mask, window=window, n_kv_heads=2, tie_embeddings=False, **kw)


def _packed(lengths: tuple[int, ...] = LENGTHS, seed: int = 0) -> tuple[Tensor, Tensor, list[slice]]:
    """(1, T) token ids, their (1, T) document ids, and each document's span."""
    ids = torch.randint(5, 61, (1, sum(lengths)), generator=torch.Generator().manual_seed(seed))
    document_ids = torch.cat([torch.full((n,), d) for d, n in enumerate(lengths)])[None]
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    return ids, document_ids, [slice(s, s + n) for s, n in zip(starts, lengths, strict=True)]


# ---- the mask --------------------------------------------------------------------------------------
def test_the_document_mask_reads_a_window_and_bounds_the_cache():
    windowed, plain = _model("rope", "document").decoder.mask, _model("rope", "document", None).decoder.mask
    assert type(windowed) is DocumentWindow and windowed.documents and windowed.causal
    assert not windowed.kernel_causal  # a band is not the lower triangle
    assert windowed.lookback == W - 1
    assert type(plain) is Document and plain.lookback is None and plain.kernel_causal  # unchanged without one
    assert Document.one_document(tiny_config(mask="document", window=W)) == "sliding_window"
    assert Document.one_document(tiny_config(mask="document")) == "causal"


@pytest.mark.parametrize("attention", ["sdpa", "math", "flex"])
@pytest.mark.parametrize("position", POSITIONS)
def test_a_packed_row_gives_each_documents_sliding_window_logits_alone(position, attention):
    document = _model(position, "document", attention=attention)
    sliding = _model(position, "sliding_window", attention=attention)
    unwindowed = _model(position, "document", None, attention=attention)
    ids, document_ids, spans = _packed()
    with torch.no_grad():
        packed = document(ids, document_ids=document_ids)  # (1, T, V)
        whole = unwindowed(ids, document_ids=document_ids)
        for span in spans:
            assert_rounding_close(packed[:, span], sliding(ids[:, span]), sliding)
    # not vacuous: past the window of a document the window changes the logits
    late = [i for span in spans for i in range(span.start + W, span.stop)]
    assert (packed[0, late] - whole[0, late]).abs().amax(-1).min() > 1e-4


@pytest.mark.parametrize("position", POSITIONS)
def test_two_rows_with_different_boundaries_and_padding(position):
    document, sliding = _model(position, "document"), _model(position, "sliding_window")
    rows = [(5, 7, 4), (9, 7)]
    ids = torch.cat([_packed(r, seed=i)[0] for i, r in enumerate(rows)])  # (2, 16)
    document_ids = torch.cat([_packed(r)[1] for r in rows])
    with torch.no_grad():
        packed = document(ids, document_ids=document_ids)
        for b, row in enumerate(rows):
            for span in _packed(row)[2]:
                assert_rounding_close(packed[b : b + 1, span], sliding(ids[b : b + 1, span]), sliding)


# ---- generation ------------------------------------------------------------------------------------
@pytest.mark.parametrize("position", POSITIONS)
def test_cached_generation_equals_uncached_and_sliding_window(position):
    """Generation is one document: the windowed document mask decodes what sliding_window decodes."""
    model = _model(position, "document")
    prompt = torch.randint(0, 61, (3, 6), generator=torch.Generator().manual_seed(2))
    cached = model.generate(prompt, max_new_tokens=12, eos_token_id=None)
    assert cached[:, -12:].unique().numel() > 2, "a constant continuation would make the comparison vacuous"
    assert torch.equal(cached, model.generate(prompt, max_new_tokens=12, eos_token_id=None, use_cache=False))
    assert torch.equal(
        cached, _model(position, "sliding_window").generate(prompt, max_new_tokens=12, eos_token_id=None)
    )


@pytest.mark.parametrize("position", POSITIONS)
def test_the_cache_stays_within_the_window(position):
    """Step by step through the cache equals a full forward, while no layer holds more than W - 1
    positions: the cache's bytes stop growing once the window is full."""
    model = _model(position, "document")
    ids = torch.randint(0, 61, (2, 20))
    cache = model.new_cache()
    sizes = []
    with torch.no_grad():
        full = model(ids)  # (2, 20, V)
        steps = [model(ids[:, :2], cache=cache)[:, -1]]
        sizes.append(cache.nbytes())
        for t in range(2, 20):
            steps.append(model(ids[:, t : t + 1], cache=cache)[:, -1])
            sizes.append(cache.nbytes())
    assert_rounding_close(torch.stack(steps, 1), full[:, 1:], model)
    bound = 2 * 2 * (2 * 2 * (W - 1) * 8) * 4  # layers x k,v x B x KV heads x held x head_dim x fp32
    assert max(sizes) == sizes[-1] == bound and cache.length == 20
    assert all(layer.k.shape[2] == W - 1 for layer in cache.self_attn)


# ---- transformers ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("window", "auto_class"), [(W, "MistralForCausalLM"), (None, "LlamaForCausalLM")])
def test_a_document_decoder_exports_what_it_computes_on_one_document(window, auto_class, tmp_path):
    """transformers has no document mask, but a prompt is one document: there mask=document computes
    causal attention (sliding_window with a window), which Llama (Mistral) computes."""
    transformers = pytest.importorskip("transformers")
    model = _model("rope", "document", window)
    assert zoo.to_hf(model, tmp_path / "out") == auto_class
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(hf).__name__ == auto_class
    ids = torch.randint(0, 61, (2, 12))  # longer than the window
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-4, rtol=1e-4)
        ids, document_ids, spans = _packed()
        packed = model(ids, document_ids=document_ids)
        for span in spans:  # each document of a packed row, given to transformers alone
            torch.testing.assert_close(hf(ids[:, span]).logits, packed[:, span], atol=1e-4, rtol=1e-4)
    back = zoo.from_hf(tmp_path / "out").config  # read back as what transformers computes
    assert (back.resolved_mask, back.window) == (("sliding_window", W) if window else ("causal", None))


def test_a_document_mask_is_refused_where_its_single_document_mask_is():
    with pytest.raises(zoo.ConfigError, match=re.escape("mask=document (Llama has causal attention)")):
        zoo.hf.hf_exportable(tiny_config(mask="document", window=W, bias=True))  # Mistral has no biases


# ---- the real commands -----------------------------------------------------------------------------
LLAMA = [
    "model=llama-tiny",
    "model.d_ff=64",
    "data.packing=documents",
    "model/mask=document",
    "model.window=8",
    "model.activation_checkpointing=all",
    "adapter=lora",
    "adapter.rank=4",
    "optimizer.lr=0.01",
]


@pytest.mark.slow
def test_a_lora_run_of_a_packed_checkpointed_sliding_window_llama_trains_exports_and_generates(tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "run"
    trained = run(
        "train",
        "experiment=gpt_generator",
        *TINY["gpt_generator"],
        *STEPS,
        *LLAMA,
        f"hydra.run.dir={out}",
        "test=false",
        cwd=tmp_path,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    with (out / "logs" / "metrics.csv").open() as f:
        losses = [float(r["val/loss"]) for r in csv.DictReader(f) if r.get("val/loss")]
    assert losses and all(math.isfinite(v) for v in losses)
    ckpt = out / "checkpoints" / "last.ckpt"
    task, _ = load_task(ckpt)
    model = task.model
    assert type(model.decoder.mask) is DocumentWindow and model.decoder.mask.lookback == 7
    assert model.decoder.checkpoint_every and zoo.adapters.adapted_layers(model)

    folder = tmp_path / "hf"
    exported = run("export", f"ckpt_path={ckpt}", "format=hf", f"out={folder}", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-3000:]
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(hf).__name__ == "MistralForCausalLM" and hf.config.sliding_window == 8
    task.merge_adapter()
    ids = torch.randint(5, model.config.vocab_size, (2, 20))  # one document each, longer than the window
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, task.model(ids), atol=1e-4, rtol=1e-4)

    generated = run(
        "generate",
        f"ckpt_path={ckpt}",
        "prompt=def add",
        "max_new_tokens=24",
        f"hydra.run.dir={tmp_path / 'generate'}",
        cwd=tmp_path,
    )
    assert generated.returncode == 0, generated.stderr[-3000:]
    assert generated.stdout.startswith("def add") and len(generated.stdout) > len("def add")
