"""GGUF for zoo.hf's newer families at tiny size: Qwen3 (a norm on each head's q and k, heads wider
than d_model / n_heads, tied), Gemma 2 (gains stored as 1 + w, both soft-caps, a window of 4 on
alternate layers), OLMo 2 (norms on the sublayers' outputs, one q and one k norm over all heads) and
Mixtral (llama.cpp's ``llama`` with experts). For each: zoo.to_gguf's file reads back to the same
weights and logits and holds only tensor names llama.cpp's architecture lists; a file laid out as
llama.cpp's converter lays it out (rebuilt with gguf's writer and name map from the save_pretrained
folder) is tensor for tensor and key for key zoo's own, and reads as the transformers model;
llama.cpp itself (llama-cpp-python) runs zoo's file with zoo's logits and greedy tokens; and a setting
llama.cpp's architecture does not compute is refused in one line that names the field."""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_gguf import bpe  # noqa: F401  (the byte-level BPE fixture: llama.cpp needs a vocabulary)

import zoo
from zoo.gguf.archs import gemma2_scalar

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

FAMILIES = ["qwen3", "gemma2", "olmo2", "mixtral"]
TIED_OLMO2 = pytest.param("olmo2", {"tie_word_embeddings": True}, id="olmo2-tied")  # llama.cpp's olmo2 needs a head
CASES = [*(pytest.param(family, {}, id=family) for family in FAMILIES), TIED_OLMO2]
LLAMA_CPP = {"qwen3": "qwen3", "gemma2": "gemma2", "olmo2": "olmo2", "mixtral": "llama"}
SIZES = dict(
    num_hidden_layers=3,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    max_position_embeddings=64,
    initializer_range=0.2,
    bos_token_id=2,
    eos_token_id=3,
)
SHAPES = {
    "qwen3": ("Qwen3ForCausalLM", dict(head_dim=24, tie_word_embeddings=True)),
    "gemma2": (
        "Gemma2ForCausalLM",
        dict(
            head_dim=24,
            query_pre_attn_scalar=24,  # llama.cpp's gemma2 scales scores by head_dim^-1/2 (below 46 layers)
            sliding_window=4,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
            attn_implementation="eager",
        ),
    ),
    "olmo2": ("Olmo2ForCausalLM", {}),
    "mixtral": ("MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2)),
}
LLAMA_CPP_TOLERANCE = 0.02  # of the largest logit: llama.cpp keeps its KV cache in f16


def _hf_model(family: str, vocab: int, **overrides: object) -> torch.nn.Module:
    """A tiny random transformers model of ``family``; its norm gains drawn too (not all 1 or 0), so a
    gain in the wrong place or a lost 1 + w changes the logits."""
    cls = getattr(transformers, SHAPES[family][0])
    torch.manual_seed(0)
    model = cls(cls.config_class(vocab_size=vocab, **{**SIZES, **SHAPES[family][1], **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0.0, 0.5)
    return model


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(5, vocab, (2, 12), generator=torch.Generator().manual_seed(1))


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _stored(path: Path) -> tuple[dict[str, object], dict[str, object]]:
    """A GGUF file's tensors (numpy, by name) and metadata (by key) as gguf's own reader gives them."""
    reader = gguf.GGUFReader(path)
    return {t.name: t.data.copy() for t in reader.tensors}, {k: f.contents() for k, f in reader.fields.items()}


# ---- zoo's writer, zoo's reader ---------------------------------------------------------------------------
@pytest.mark.parametrize(("family", "overrides"), CASES)
def test_a_written_file_reads_back_as_the_model(family, overrides, tmp_path):
    hf = _hf_model(family, 120, **overrides)
    model = zoo.from_hf(hf)
    assert zoo.to_gguf(model, tmp_path / "m.gguf") == LLAMA_CPP[family]
    got = zoo.read_gguf(tmp_path / "m.gguf", tokenizer=False)
    assert got.architecture == LLAMA_CPP[family]
    assert got.config.replace(init_std=model.config.init_std) == model.config  # init_std is not in a GGUF file
    ours, theirs = model.state_dict(), got.model.state_dict()
    assert ours.keys() == theirs.keys()
    for name, weight in ours.items():
        if family == "gemma2" and "norm" in name:  # the file holds 1 + w in f32: w within its rounding
            assert ((weight - theirs[name]).abs() <= 2**-23 * (2 + weight.abs())).all(), name
        else:
            assert torch.equal(weight, theirs[name]), name
    ids = _ids(120)
    with torch.no_grad():
        assert _max_diff(model(ids), got.model(ids)) < 1e-5
        assert _max_diff(got.model(ids), hf(ids).logits) < 1e-4
    listed = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH[LLAMA_CPP[family].upper()]]}
    allowed = {f"{n.format(bid=i)}.weight" for n in listed for i in range(SIZES["num_hidden_layers"])}
    stored = _stored(tmp_path / "m.gguf")[0]
    assert set(stored) <= allowed  # only names llama.cpp's architecture has
    if family == "olmo2" and model.config.tie_embeddings:  # its tied head as a copy of the embeddings
        assert (stored["output.weight"] == stored["token_embd.weight"]).all()


# ---- llama.cpp's converter's layout, zoo's reader ---------------------------------------------------------
def _llama_cpp_convert(folder: Path, path: Path) -> None:
    """What llama.cpp's convert_hf_to_gguf.py writes (in f32) for the save_pretrained ``folder``, rebuilt
    with gguf's own writer and tensor-name map: the hyperparameters its TextModel writes (Gemma2Model's
    own: no rope base, its soft-caps and window), Mixtral's q/k rows permuted and experts stacked (its
    LlamaModel), Gemma 2's norm gains as 1 + w and its lm_head left out (Gemma2Model.modify_tensors)."""
    c = json.loads((folder / "config.json").read_text())
    arch, n = LLAMA_CPP[c["model_type"]], c["num_hidden_layers"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], n)
    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(c["max_position_embeddings"]), w.add_embedding_length(c["hidden_size"])
    w.add_block_count(n), w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"]), w.add_head_count_kv(c["num_key_value_heads"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    if c.get("head_dim") is not None:
        w.add_key_length(c["head_dim"]), w.add_value_length(c["head_dim"])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(c["attn_logit_softcapping"])
        w.add_final_logit_softcapping(c["final_logit_softcapping"]), w.add_sliding_window(c["sliding_window"])
    else:
        w.add_rope_freq_base(c.get("rope_theta") or c["rope_parameters"]["rope_theta"])
    if arch == "llama":
        w.add_expert_count(c["num_local_experts"]), w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_vocab_size(c["vocab_size"]), w.add_rope_dimension_count(c["hidden_size"] // c["num_attention_heads"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    experts: dict[str, list[torch.Tensor]] = {}
    for name, data in load_file(folder / "model.safetensors").items():
        data = data.float()
        if arch == "gemma2" and name == "lm_head.weight":
            continue
        if arch == "gemma2" and name.endswith("norm.weight"):
            data = data + 1
        part = name.split(".")[-2]
        if arch == "llama" and part in ("q_proj", "k_proj"):
            heads = c["num_attention_heads"] if part == "q_proj" else c["num_key_value_heads"]
            data = (
                data.reshape(heads, 2, data.shape[0] // heads // 2, *data.shape[1:]).swapaxes(1, 2).reshape(data.shape)
            )
        if ".experts." in name:  # ...experts.<e>.w1.weight: stacked over e, in order
            head, e, rest = name.split(".experts.")[0], *name.split(".experts.")[1].split(".", 1)
            experts.setdefault(f"{head}.experts.{rest}", []).append((int(e), data))
            continue
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), data.numpy())
    for name, parts in experts.items():
        stacked = torch.stack([data for _, data in sorted(parts, key=lambda p: p[0])])  # (n_experts, out, in)
        w.add_tensor(names.get_name(name, try_suffixes=(".weight",)), stacked.numpy())
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_llama_cpp_converter_layout_is_zoos_and_reads_as_the_original(family, tmp_path):
    hf = _hf_model(family, 120)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.save_pretrained(tmp_path / "hf")
    _llama_cpp_convert(tmp_path / "hf", tmp_path / "converted.gguf")
    model = zoo.from_gguf(tmp_path / "converted.gguf")
    ids = _ids(120)
    with torch.no_grad():
        assert _max_diff(model(ids), hf(ids).logits) < 1e-4
    zoo.to_gguf(zoo.from_hf(hf), tmp_path / "zoo.gguf")
    (theirs, their_keys), (ours, our_keys) = _stored(tmp_path / "converted.gguf"), _stored(tmp_path / "zoo.gguf")
    assert theirs.keys() == ours.keys()
    for name, data in theirs.items():
        assert (data == ours[name]).all(), name  # the same names, layouts and values
    for key, value in their_keys.items():
        if not key.startswith(("general.", "GGUF.")):
            assert our_keys.get(key) == value, key  # every hyperparameter the converter writes, alike


def _transformers_reading(folder: Path, family: str, cfg: zoo.ModelConfig) -> torch.nn.Module:
    """transformers' own GGUF loading of ``folder/m.gguf``, given what its reader does not take from the
    file: Qwen3's head_dim, Gemma 2's soft-caps and score scale (it maps no key to them)."""
    pytest.importorskip("accelerate")
    given = {"head_dim": cfg.resolved_head_dim}
    if family == "gemma2":
        scalar = gemma2_scalar(cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.resolved_head_dim)
        given |= {
            "attn_logit_softcapping": cfg.attn_softcap,
            "final_logit_softcapping": cfg.final_softcap,
            "query_pre_attn_scalar": scalar,
        }
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        return transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file="m.gguf", dtype=torch.float32, **given
        ).eval()


@pytest.mark.parametrize("family", ["qwen3", "gemma2"])  # transformers reads neither olmo2 nor llama's experts
def test_transformers_reads_zoos_file_as_zoo_does(family, tmp_path):
    model = zoo.from_hf(_hf_model(family, 120))
    zoo.to_gguf(model, tmp_path / "m.gguf")
    ids = _ids(120)
    with torch.no_grad():
        theirs = _transformers_reading(tmp_path, family, model.config)(ids).logits
        assert _max_diff(model(ids), theirs) < 1e-4


# ---- llama.cpp itself ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("family", "overrides"), CASES)
def test_llama_cpp_runs_zoos_file_as_zoo_does(family, overrides, bpe, tmp_path):  # noqa: F811
    llama_cpp = pytest.importorskip("llama_cpp")
    model = zoo.from_hf(_hf_model(family, bpe.get_vocab_size(), **overrides))
    zoo.to_gguf(model, tmp_path / "m.gguf", tokenizer=bpe)
    prompt, steps = _ids(bpe.get_vocab_size())[1], 8
    with contextlib.redirect_stderr(io.StringIO()):
        llm = llama_cpp.Llama(str(tmp_path / "m.gguf"), n_ctx=64, logits_all=True, verbose=False, n_threads=2)
    try:
        llm.eval(prompt.tolist())
        theirs = torch.tensor(llm.scores[: len(prompt)])  # (T, V)
        decoded = []
        for _ in range(steps):
            decoded.append(int(torch.tensor(llm.scores[llm.n_tokens - 1]).argmax()))
            llm.eval(decoded[-1:])
    finally:
        llm.close()
    with torch.no_grad():
        ours = model(prompt[None])[0]  # (T, V)
        greedy = model.generate(prompt[None], steps, do_sample=False)[0, len(prompt) :].tolist()
    diff = _max_diff(ours, theirs)
    print(f"llama.cpp {LLAMA_CPP[family]} ({family}, {overrides}): max logit diff {diff:.2g} of {ours.abs().max():.3g}")
    assert diff < LLAMA_CPP_TOLERANCE * ours.abs().max()
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1)) and decoded == greedy


# ---- what llama.cpp does not compute ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("family", "overrides", "field"),
    [
        ("qwen3", dict(mask="sliding_window", window=4), "mask"),  # transformers' Qwen3 slides, llama.cpp's not
        ("olmo2", dict(mask="document"), "mask"),
        ("mixtral", dict(mask="sliding_window", window=4), "mask"),
        ("gemma2", dict(window_pattern=None), "mask"),  # every layer windowed
        ("gemma2", dict(mask="causal", window=None, window_pattern=None), "mask"),
        ("gemma2", dict(attn_scale=20**-0.5), "attn_scale"),  # query_pre_attn_scalar=20 with head_dim 24
        ("gemma2", dict(attn_softcap=None), "attn_softcap"),
        ("gemma2", dict(final_softcap=None), "final_softcap"),
        ("gemma2", dict(ffn="swiglu"), "ffn"),
        ("gemma2", dict(tie_embeddings=False), "tie_embeddings"),
        ("gemma2", dict(n_layers=46), "attn_scale"),  # llama.cpp's 27B rule: (d_model / n_heads)^-1/2
    ],
)
def test_what_llama_cpp_lacks_is_one_line_and_writes_nothing(family, overrides, field, tmp_path):
    cfg = zoo.from_hf(_hf_model(family, 120)).config
    assert zoo.gguf_exportable(cfg) == family
    changed = cfg.replace(**overrides)
    with pytest.raises(zoo.ConfigError) as error:
        zoo.gguf_exportable(changed)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"model.{field}:") and f"closest, {family}," in message
    assert f"llama.cpp's {LLAMA_CPP[family]}" in message, message
    with pytest.raises(zoo.ConfigError):
        zoo.to_gguf(zoo.build_model(changed), tmp_path / "m.gguf")
    assert list(tmp_path.iterdir()) == []


def test_a_46_layer_gemma2_takes_llama_cpps_27b_score_scale():
    cfg = zoo.from_hf(_hf_model("gemma2", 120)).config.replace(n_layers=46)
    assert zoo.gguf_exportable(cfg.replace(attn_scale=16**-0.5)) == "gemma2"  # d_model / n_heads = 64 / 4


# ---- the verb: zoo-export format=gguf checks each family by the readers that can read it ------------------
@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_the_export_verb_checks_each_family_by_whom_can_read_it(family, bpe, tmp_path):  # noqa: F811
    """transformers checks the Qwen3 and Gemma 2 exports (given what its GGUF reader does not take from the
    file); OLMo 2 and Mixtral, which it cannot read as llama.cpp does, are written and said unchecked by it."""
    pytest.importorskip("accelerate")
    from tasks import GeneratorTask
    from tasks.cli.export.gguf import UNREAD, export_gguf

    model = zoo.from_hf(_hf_model(family, bpe.get_vocab_size()))
    task = GeneratorTask(model=model.config.to_dict(), optimizer={}, tokenizer_json=bpe.to_str())
    task.model.load_state_dict(model.state_dict())
    diff, said = export_gguf(task.eval(), tmp_path / "out", "f32", {"task": "generator"}, None)
    assert (tmp_path / "out" / "model.gguf").is_file()
    record = zoo.gguf_exportable(model)
    if record in UNREAD:
        assert diff != diff and f"not checked by transformers: {UNREAD[record]}" in said  # NaN: not measured
    else:
        assert diff < 1e-4 and "transformers' GGUF reload vs zoo" in said, said
