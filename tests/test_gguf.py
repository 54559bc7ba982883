"""GGUF in and out at tiny size: tiny random Llama (GQA, untied), Qwen2 (q/k/v biases, tied) and GPT-2
models written by zoo.to_gguf are read back by transformers' own GGUF loading (an independent
reader: logits within 1e-4 of zoo's reading of the same file, every dtype) and, in f32, agree with the
original model; files built independently with gguf's own writer and name map, as llama.cpp's
converter lays them out, are read by zoo.read_gguf with the original model's logits. A wrong q/k
permutation fails both. Vocabularies (byte-level BPE and SentencePiece) encode as transformers'
GGUF tokenizers do."""

from __future__ import annotations

import warnings

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import zoo

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

ATOL = 1e-4
SPECIALS = ["<pad>", "<unk>", "<s>", "</s>", "<mask>"]
TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a test of 123 tokens!",
    "  leading spaces and\nnew lines\t tabs",
    "<s>special tokens inside</s> text",
]
DTYPES = ["f32", "f16", "bf16", "q8_0", "q4_0"]


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    """A byte-level BPE as zoo trains it (its specials at ids 0..4), 300 tokens."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TEXTS * 20, trainer=trainer)
    return tok


def _hf_model(family: str, vocab: int) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(vocab_size=vocab, bos_token_id=2, eos_token_id=3, initializer_range=0.2)
    if family == "gpt2":  # transformers' GGUF loading keeps GPT-2's n_positions and n_inner defaults
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, **common)).eval()
    cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}[family]
    config = cls.config_class(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        max_position_embeddings=64,
        tie_word_embeddings=family == "qwen2",
        **common,
    )
    return cls(config).eval()


def _ids(vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(5, vocab, (2, 12), generator=torch.Generator().manual_seed(seed))


def _hf_gguf(folder, name: str) -> torch.nn.Module:
    pytest.importorskip("accelerate")  # transformers' GGUF loading needs it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# ---- zoo's writer, transformers' reader ---------------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_written_gguf_reads_as_transformers_reads_it(family, bpe, tmp_path):
    hf = _hf_model(family, bpe.get_vocab_size())
    model = zoo.from_hf(hf)
    ids = _ids(hf.config.vocab_size)
    with torch.no_grad():
        original = hf(ids).logits
    for dtype in DTYPES:
        name = f"{family}-{dtype}.gguf"
        assert zoo.to_gguf(model, tmp_path / name, dtype=dtype, tokenizer=bpe) == family
        got = zoo.read_gguf(tmp_path / name)
        with torch.no_grad():
            ours, theirs = got.model(ids), _hf_gguf(tmp_path, name)(ids).logits
        assert _max_diff(ours, theirs) < ATOL, (dtype, _max_diff(ours, theirs))
        weight_type = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0"}[dtype]
        assert got.loaded["attn_output.weight"] == weight_type and got.loaded["attn_norm.weight"] == "F32"
        assert got.config.tie_embeddings == model.config.tie_embeddings
        print(
            f"{family} {dtype}: zoo vs transformers {_max_diff(ours, theirs):.1e}, "
            f"vs the original {_max_diff(ours, original):.3g}"
        )
        if dtype == "f32":
            assert _max_diff(ours, original) < ATOL
        if dtype == "q8_0":  # the agreement of the quantized file's next tokens with the original's
            agree = (ours.argmax(-1) == original.argmax(-1)).float().mean().item()
            print(f"{family} q8_0: next-token agreement with the original {agree:.0%}")
            assert agree > 0.5


def test_q_and_k_rows_are_llama_cpps_permutation(tmp_path):
    """The stored q/k rows are llama.cpp's converter's permutation of HF's (its formula, written
    out here): each head's (first half, second half) interleaved; qwen2 keeps HF's order."""
    for family in ("llama", "qwen2"):
        hf = _hf_model(family, 300)
        zoo.to_gguf(zoo.from_hf(hf), tmp_path / f"{family}.gguf")
        stored = {t.name: torch.from_numpy(t.data.copy()) for t in gguf.GGUFReader(tmp_path / f"{family}.gguf").tensors}
        for part, heads in (("q", 4), ("k", 2)):
            w = hf.model.layers[1].self_attn.__getattr__(f"{part}_proj").weight.detach()
            permuted = w.reshape(heads, 2, w.shape[0] // heads // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
            expected = permuted if family == "llama" else w
            assert torch.equal(stored[f"blk.1.attn_{part}.weight"], expected), (family, part)
            assert family == "qwen2" or not torch.equal(permuted, w)


# ---- an independent writer, zoo's reader -----------------------------------------------------------------
def _llama_cpp_convert(hf: torch.nn.Module, path, arch: str, vocab=None) -> None:
    """What llama.cpp's convert_hf_to_gguf.py writes for ``hf``, rebuilt with gguf's own writer and
    tensor-name map: its hyperparameter keys, q/k rows permuted for llama, GPT-2's Conv1D weights
    transposed and its head written as a copy of the embedding. ``vocab(writer)`` adds a vocabulary."""
    c = hf.config
    n_layers = getattr(c, "num_hidden_layers", None) or c.n_layer
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], n_layers)
    w = gguf.GGUFWriter(path, arch)
    if arch == "gpt2":
        w.add_context_length(c.n_positions), w.add_embedding_length(c.n_embd), w.add_block_count(c.n_layer)
        w.add_feed_forward_length(4 * c.n_embd), w.add_head_count(c.n_head), w.add_layer_norm_eps(c.layer_norm_epsilon)
    else:
        w.add_context_length(c.max_position_embeddings), w.add_embedding_length(c.hidden_size)
        w.add_block_count(n_layers), w.add_feed_forward_length(c.intermediate_size)
        w.add_head_count(c.num_attention_heads), w.add_head_count_kv(c.num_key_value_heads)
        w.add_layer_norm_rms_eps(c.rms_norm_eps), w.add_rope_freq_base(c.rope_parameters["rope_theta"])
        w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if vocab is not None:
        vocab(w)
    for name, tensor in hf.state_dict().items():
        data = tensor.detach().float()
        if name.endswith((".attn.bias", ".attn.masked_bias")) or (name == "lm_head.weight" and c.tie_word_embeddings):
            continue
        heads = {"q_proj": c.num_attention_heads, "k_proj": getattr(c, "num_key_value_heads", None)}
        part = name.split(".")[-2]
        if arch == "llama" and part in heads:
            n = heads[part]
            data = data.reshape(n, 2, data.shape[0] // n // 2, *data.shape[1:]).swapaxes(1, 2).reshape(data.shape)
        if arch == "gpt2" and name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
            data = data.T.contiguous()
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        w.add_tensor(new, data.numpy())
        if arch == "gpt2" and new == "token_embd.weight":
            w.add_tensor("output.weight", data.numpy())
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_llama_cpp_layout_reads_as_the_original(family, tmp_path):
    hf = _hf_model(family, 120)
    _llama_cpp_convert(hf, tmp_path / "m.gguf", family)
    model = zoo.from_gguf(tmp_path / "m.gguf")
    ids = _ids(120)
    with torch.no_grad():
        assert _max_diff(model(ids), hf(ids).logits) < ATOL
    assert model.config.tie_embeddings == hf.config.tie_word_embeddings  # GPT-2's copied head is tied again
    assert zoo.from_gguf(tmp_path / "m.gguf", dtype=torch.bfloat16).embed.weight.dtype == torch.bfloat16


# ---- vocabularies ----------------------------------------------------------------------------------------
def test_bpe_vocabulary_round_trip(bpe, tmp_path):
    model = zoo.from_hf(_hf_model("llama", bpe.get_vocab_size() + 4))  # padded rows: [PAD<id>] tokens
    template = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"
    zoo.to_gguf(
        model,
        tmp_path / "m.gguf",
        tokenizer=bpe,
        specials={"bos": 2, "eos": 3, "pad": 0, "unk": 1, "origin": "zoo"},
        chat_template=template,
    )
    got = zoo.read_gguf(tmp_path / "m.gguf")
    assert got.specials == {"bos": 2, "eos": 3, "pad": 0, "unk": 1} and got.chat_template == template
    assert not got.add_bos and got.tokenizer.get_vocab_size() == bpe.get_vocab_size() + 4
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")
    for text in TEXTS:
        assert got.tokenizer.encode(text).ids == bpe.encode(text).ids == theirs(text).input_ids, text
        assert got.tokenizer.decode(got.tokenizer.encode(text).ids, skip_special_tokens=False) == text


def _sentencepiece_file(path) -> list[str]:
    """A tiny llama-style (SentencePiece) vocabulary: <unk> <s> </s>, 256 byte tokens, then pieces
    whose score is minus their rank, with the weights of a tiny Llama of that vocabulary."""
    words = ["▁the", "▁quick", "▁fox", "▁hello", "▁world", "▁a", "ing", "er"]
    pieces = sorted(
        {w[:k] for w in words for k in range(1, len(w) + 1)} | set("abcdefghijklmnopqrstuvwxyz▁,!"),
        key=lambda p: (len(p), p),
    )
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    types = [2, 3, 3, *[6] * 256, *[1] * len(pieces)]
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))][::-1]  # longer pieces merge first

    def vocab(w):
        w.add_tokenizer_model("llama"), w.add_token_list(tokens), w.add_token_scores(scores)
        w.add_token_types(types), w.add_bos_token_id(1), w.add_eos_token_id(2), w.add_unk_token_id(0)

    _llama_cpp_convert(_hf_model("llama", len(tokens)), path, "llama", vocab)
    return tokens


def test_sentencepiece_vocabulary_encodes_as_transformers(tmp_path):
    _sentencepiece_file(tmp_path / "m.gguf")
    got = zoo.read_gguf(tmp_path / "m.gguf")
    assert got.add_bos and got.specials == {"bos": 1, "eos": 2, "unk": 0}
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")
    for text in ["the quick fox", "hello world, the fox!", "a quickering thé fox"]:  # é: byte fallback
        ids = got.tokenizer.encode(text).ids
        assert ids == theirs(text).input_ids, text
        assert ids[0] == 1 and got.tokenizer.decode(ids) == text
    assert got.tokenizer.encode("the").tokens == ["<s>", "▁the"]
    zoo.to_gguf(got.model, tmp_path / "again.gguf", tokenizer=got.tokenizer, specials=got.specials, add_bos=True)
    again = zoo.read_gguf(tmp_path / "again.gguf")  # the vocabulary written back as llama's
    again_theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="again.gguf")
    for text in ["the quick fox", "hello world, the fox!", "a quickering thé fox"]:
        assert again.tokenizer.encode(text).ids == got.tokenizer.encode(text).ids == again_theirs(text).input_ids


# ---- bad input: one line naming the file and the key or tensor, nothing lost ------------------------
def _one_line(error: pytest.ExceptionInfo, *words: str) -> None:
    message = str(error.value)
    assert "\n" not in message and all(w in message for w in words), message


def _valid(tmp_path, vocab=None):
    path = tmp_path / "m.gguf"
    _llama_cpp_convert(_hf_model("llama", 120), path, "llama", vocab)
    return path


def test_not_gguf_and_truncated_files(tmp_path):
    (tmp_path / "notes.gguf").write_text("not a model at all, but long enough to have a header\n")
    with pytest.raises(zoo.CheckpointError) as error:
        zoo.from_gguf(tmp_path / "notes.gguf")
    _one_line(error, "notes.gguf", "not a GGUF file")
    data = _valid(tmp_path).read_bytes()
    for cut in (30, 200, len(data) // 2, len(data) - 8):  # in the metadata, the tensor table, the data
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(zoo.CheckpointError) as error:
            zoo.from_gguf(tmp_path / "cut.gguf")
        _one_line(error, "cut.gguf", "truncated")


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("general.architecture", "mamba", ["general.architecture='mamba'", "llama"]),
        ("llama.block_count", "two", ["llama.block_count", "'two'", "not an integer"]),
        ("llama.feed_forward_length", 128, ["blk.0.ffn_gate.weight", "(96, 64)", "(128, 64)"]),
        ("llama.rope.dimension_count", 8, ["llama.rope.dimension_count=8", "partial rotary"]),
    ],
)
def test_bad_metadata(tmp_path, key, value, words):
    def vocab(w):
        (w.add_string if isinstance(value, str) else w.add_uint32)(key, value)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = _valid(tmp_path, vocab)
    with pytest.raises(zoo.CheckpointError) as error:
        zoo.read_gguf(path)
    _one_line(error, "m.gguf", *words)


def _header(n_tensors: int, n_keys: int, body: bytes = b"") -> bytes:
    import struct

    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_keys) + body


def test_huge_declared_sizes_are_refused_before_allocating(tmp_path):
    import struct

    key = struct.pack("<Q", 1) + b"a"
    cases = {
        "keys": _header(0, 2**62),
        "array": _header(0, 1, key + struct.pack("<IIQ", 9, 0, 2**60)),
        "string": _header(0, 1, key + struct.pack("<IQ", 8, 2**61)),
        "tensor": _header(1, 0, struct.pack("<Q", 1) + b"t" + struct.pack("<IQQIQ", 2, 2**40, 2**20, 0, 0)),
    }
    for name, data in cases.items():
        (tmp_path / f"{name}.gguf").write_bytes(data + bytes(64))
        with pytest.raises(zoo.CheckpointError) as error:
            zoo.read_gguf(tmp_path / f"{name}.gguf")
        _one_line(error, f"{name}.gguf")


def test_a_type_gguf_cannot_dequantize_names_the_tensor(tmp_path):
    from zoo.gguf.reader import GGUFFile

    w = gguf.GGUFWriter(tmp_path / "q.gguf", "llama")
    w.add_tensor(
        "blk.0.attn_q.weight", torch.zeros(4, 40, dtype=torch.uint8).numpy(), raw_dtype=gguf.GGMLQuantizationType.Q8_1
    )  # no dequantizer in gguf
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with GGUFFile(tmp_path / "q.gguf") as f, pytest.raises(zoo.CheckpointError) as error:
        f.tensor("blk.0.attn_q.weight")
    _one_line(error, "q.gguf", "blk.0.attn_q.weight", "Q8_1")


def test_a_tokenizer_zoo_cannot_read(tmp_path):
    path = _valid(tmp_path, lambda w: w.add_tokenizer_model("bert"))
    with pytest.raises(zoo.CheckpointError) as error:
        zoo.read_gguf(path)
    _one_line(error, "m.gguf", "tokenizer.ggml.model='bert'", "zoo.from_gguf")
    assert zoo.from_gguf(path).config.n_layers == 2  # the weights alone still read


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"mask": "prefix"}, "model.mask"),
        ({"mask": "document", "window": 8}, "model.mask"),
        ({"position": "alibi"}, "model.position"),
        ({"position": "t5_relative"}, "model.position"),
        ({"position": "learned"}, "model.position"),
        ({"norm_placement": "sandwich"}, "model.norm_placement"),
        ({"bias": True}, "model.bias"),
        ({"arch": "encoder"}, "model.arch"),
        ({"ffn": "gelu", "norm": "layernorm", "position": "learned", "bias": True}, "model.ffn"),  # erf GELU
    ],
)
def test_export_refusals_are_one_line_and_write_nothing(tmp_path, overrides, field):
    from conftest import tiny_model

    model = tiny_model(**overrides)
    with pytest.raises(zoo.ConfigError) as error:
        zoo.gguf_exportable(model)
    _one_line(error, field, "format=safetensors")
    with pytest.raises(zoo.ConfigError):
        zoo.to_gguf(model, tmp_path / "m.gguf")
    assert list(tmp_path.iterdir()) == []


def test_failed_or_refused_writes_leave_nothing(tmp_path, bpe):
    from conftest import tiny_model

    model = tiny_model(vocab_size=300)
    assert zoo.gguf_exportable(model.config) == "llama"

    def check(tmp):
        assert zoo.from_gguf(tmp).config.d_model == 32  # the finished file, before it takes its name
        raise ValueError("the reload disagreed")

    with pytest.raises(ValueError, match="reload disagreed"):
        zoo.to_gguf(model, tmp_path / "m.gguf", check=check)
    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    with pytest.raises(zoo.ConfigError) as error:
        zoo.to_gguf(model, tmp_path / "m.gguf", tokenizer=wordpiece)
    _one_line(error, "tokenizer", "WordPiece")
    with pytest.raises(zoo.ConfigError) as error:
        zoo.to_gguf(model, tmp_path / "m.gguf", dtype="q2_k")
    _one_line(error, "gguf.dtype='q2_k'")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "m.gguf").write_text("keep me")
    with pytest.raises(FileExistsError):
        zoo.to_gguf(model, tmp_path / "m.gguf", tokenizer=bpe)
    assert (tmp_path / "m.gguf").read_text() == "keep me"
