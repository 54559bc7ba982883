"""llama.cpp's architectures as zoo reads and writes them: :class:`Arch` records in :data:`ARCHS`.

A record ties a llama.cpp ``general.architecture`` to the zoo.hf family that computes the same model
(``llama`` -> Llama, ``qwen2`` -> Qwen2, ``gpt2`` -> GPT-2 here; ``qwen3``, ``gemma2``, ``olmo2``, and
Mixtral, which llama.cpp runs as ``llama`` with experts, in zoo/gguf/archs.py) and says, once for both
directions, which GGUF metadata key holds which HF config attribute (:class:`Key`) and which GGUF tensor holds
which HF tensor in which layout (:class:`Slot`). Reading goes GGUF -> HF names -> the family's weight
map -> zoo; writing runs the same tables backwards, so the two cannot drift apart.

Layouts (GGUF tensors in torch's order, as zoo.gguf.reader returns them):

- ``plain``: the same matrix.
- ``conv1d``: GPT-2's HF ``Conv1D`` stores (in, out); llama.cpp stores (out, in), like ``nn.Linear``.
- ``rope_q`` / ``rope_k``: llama.cpp's ``llama`` rotates interleaved pairs (x0, x1), (x2, x3)... of each
  head, HF's Llama the two halves of it (rotate-half). llama.cpp's converter therefore permutes the
  q and k rows of every head (weights and biases) so that its rotation computes HF's; :func:`rope_rows`
  is that permutation and its inverse. ``qwen2``, ``qwen3``, ``gemma2`` and ``olmo2`` (NeoX rotation,
  as HF) keep HF's rows.
- ``norm_1p``: Gemma's RMSNorm multiplies by (1 + w) and keeps w (zoo's ``rmsnorm_1p`` too); llama.cpp
  multiplies by what it stores, so its converter stores 1 + w.
- ``experts``: a mixture of experts' (n_experts, out, in) stack of one projection, llama.cpp's
  ``ffn_*_exps``; the HF name is the stack's (``...experts.w1``), expert e's is ``...experts.{e}.w1``
  (:func:`expert_names`): :func:`hf_tensors` stacks them, :func:`per_expert` takes them apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from zoo.config import ModelConfig
from zoo.hf.mapping import FAMILIES, Exporter
from zoo.ranges import POSITIVE, FloatRange
from zoo.registry import Registry

PLAIN, CONV1D, ROPE_Q, ROPE_K = "plain", "conv1d", "rope_q", "rope_k"
NORM_1P, EXPERTS = "norm_1p", "experts"


@dataclass(frozen=True)
class Key:
    """HF config attribute ``attr`` <-> GGUF metadata ``{arch}.{suffix}`` of ``kind`` ("int" or "float");
    ``required=False``: a file without it leaves the attribute to the family's default; ``within``: the
    range of a float (the reader refuses a value outside it, and any NaN or infinity)."""

    attr: str
    suffix: str
    kind: str = "int"
    required: bool = True
    within: FloatRange | None = None


@dataclass(frozen=True)
class Slot:
    """GGUF tensor ``gguf`` (``.weight``/``.bias`` appended) <-> HF tensor ``hf``; ``{i}`` is the block."""

    gguf: str
    hf: str
    layout: str = PLAIN


@dataclass(frozen=True)
class Arch:
    """How zoo reads and writes one llama.cpp architecture.

    ``family``: the zoo.hf family whose config reader and weight map compute this model; ``keys``:
    the hyperparameters; ``slots``: the tensors; ``fixed``: HF attributes the architecture fixes
    (its activation, ...); ``biases``: HF attributes set by whether a tensor is in the file;
    ``rope``: the model has RoPE (its ``rope.*`` keys are read and written);
    ``interleaved``: llama.cpp rotates interleaved pairs (q/k rows permuted, see :func:`rope_rows`);
    ``output_copy``: a tied head is written as a copy (``output.weight``), as llama.cpp's converter
    does for GPT-2 (and llama.cpp's olmo2 requires); ``unfit``: the zoo settings llama.cpp's
    architecture does not compute, besides those the HF family already refuses; ``implied``: HF
    attributes llama.cpp derives from the others rather than reads (Gemma 2's score scale), from the
    HF values read so far; ``requires``: a metadata integer (``{name}.`` prepended) whose nonzero value
    picks this record over the one of the same ``name`` without it (Mixtral's ``expert_count`` in a ``llama`` file).
    """

    name: str
    family: str
    keys: Sequence[Key]
    slots: Sequence[Slot]
    fixed: dict[str, Any] = field(default_factory=dict)
    biases: dict[str, str] = field(default_factory=dict)
    rope: bool = True
    interleaved: bool = False
    output_copy: bool = False
    unfit: Callable[[ModelConfig], list[str]] = lambda cfg: []
    implied: Callable[[dict[str, Any]], dict[str, Any]] = lambda values: {}
    requires: str | None = None

    def block_slots(self, n_layers: int) -> list[Slot]:
        """Every slot with ``{i}`` filled in for each block."""
        out: list[Slot] = []
        for slot in self.slots:
            blocks = range(n_layers) if "{i}" in slot.gguf else [None]
            out += [Slot(slot.gguf.format(i=i), slot.hf.format(i=i), slot.layout) for i in blocks]
        return out


ARCHS: Registry[Arch] = Registry("GGUF architecture")


def rope_rows(w: Tensor, heads: int, *, to_gguf: bool) -> Tensor:
    """Rows of each of ``heads`` heads from HF's rotate-half order (first half, second half) to
    llama.cpp's interleaved pairs (``to_gguf``), or back. ``w``: (heads * head_dim, ...) weight or bias."""
    shape = w.shape
    half = shape[0] // heads // 2
    if to_gguf:  # (heads, 2, half, ...) -> (heads, half, 2, ...)
        return w.reshape(heads, 2, half, *shape[1:]).transpose(1, 2).reshape(shape)
    return w.reshape(heads, half, 2, *shape[1:]).transpose(1, 2).reshape(shape)


def convert(w: Tensor, layout: str, cfg: ModelConfig, arch: Arch, *, to_gguf: bool) -> Tensor:
    """One tensor between its GGUF layout and its HF one (see the module docstring)."""
    if layout == CONV1D and w.dim() == 2:
        return w.t().contiguous()
    if layout in (ROPE_Q, ROPE_K) and arch.interleaved:
        heads = cfg.n_heads if layout == ROPE_Q else cfg.resolved_n_kv_heads
        return rope_rows(w, heads, to_gguf=to_gguf).contiguous()
    if layout == NORM_1P:  # the gain 1 + w, rounded to f32 (w comes back within half an ulp of 1 + w)
        return w + 1 if to_gguf else w - 1
    return w


def hf_tensors(state: dict[str, Tensor], arch: Arch, cfg: ModelConfig) -> dict[str, Tensor]:
    """A zoo state dict under the HF names of ``arch``'s family (its weight map run by an Exporter),
    each ``experts`` slot's experts stacked; meta tensors give the shapes alone."""
    family = FAMILIES.get(arch.family)
    exporter = Exporter(state, f"{family.prefix}.")
    family.weights(exporter, cfg)
    out = exporter.out
    for stacked in _stacks(arch, cfg):
        experts = [out.pop(f"{name}.weight") for name in expert_names(stacked, cfg.n_experts)]
        out[f"{stacked}.weight"] = torch.stack(experts)  # (n_experts, out, in)
    return out


def per_expert(tensors: dict[str, Tensor], arch: Arch, cfg: ModelConfig) -> dict[str, Tensor]:
    """:func:`hf_tensors`' stacks taken apart again: HF tensors as the family's weight map reads them."""
    out = dict(tensors)
    for stacked in _stacks(arch, cfg):
        matrices = out.pop(f"{stacked}.weight")  # (n_experts, out, in)
        out.update(
            {f"{name}.weight": m for name, m in zip(expert_names(stacked, cfg.n_experts), matrices, strict=True)}
        )
    return out


def expert_names(stacked: str, n: int) -> list[str]:
    """The HF names of the ``n`` experts of a stack: ``a.experts.w1`` -> ``a.experts.0.w1``, ..."""
    head, last = stacked.rsplit(".", 1)
    return [f"{head}.{e}.{last}" for e in range(n)]


def _stacks(arch: Arch, cfg: ModelConfig) -> list[str]:
    return [slot.hf for slot in arch.block_slots(cfg.n_layers) if slot.layout == EXPERTS]


# ---- what llama.cpp does not compute (beyond what the HF family refuses) ---------------------------
def _common(cfg: ModelConfig, name: str) -> list[str]:
    """llama.cpp attends causally over one sequence: no prefix, document or sliding-window masks."""
    mask = cfg.resolved_mask
    return [] if mask == "causal" else [f"mask={mask} (llama.cpp's {name} has causal attention only)"]


def _llama_unfit(cfg: ModelConfig) -> list[str]:
    problems = _common(cfg, "llama")
    if cfg.bias or cfg.qkv_bias:
        problems.append(
            f"bias={cfg.bias}, qkv_bias={cfg.qkv_bias} (llama.cpp's llama has no biases; q/k/v biases alone are qwen2)"
        )
    return problems


def _qwen2_unfit(cfg: ModelConfig) -> list[str]:
    return _common(cfg, "qwen2")


def _gpt2_unfit(cfg: ModelConfig) -> list[str]:
    problems = _common(cfg, "gpt2")
    if cfg.ffn != "gelu" or cfg.gelu_approximate != "tanh":
        problems.append(f"ffn={cfg.ffn}, gelu_approximate={cfg.gelu_approximate} (llama.cpp's gpt2 has the tanh GELU)")
    if cfg.attn_scale is not None:
        problems.append(f"attn_scale={cfg.attn_scale} (llama.cpp's gpt2 scales attention by 1/sqrt(head_dim))")
    return problems


# ---- the records ----------------------------------------------------------------------------------------
_ROPE_KEYS = (
    Key("hidden_size", "embedding_length"),
    Key("num_hidden_layers", "block_count"),
    Key("num_attention_heads", "attention.head_count"),
    Key("num_key_value_heads", "attention.head_count_kv", required=False),
    Key("intermediate_size", "feed_forward_length"),
    Key("max_position_embeddings", "context_length", required=False),
    Key("rms_norm_eps", "attention.layer_norm_rms_epsilon", "float", within=POSITIVE),
    Key("rope_theta", "rope.freq_base", "float", required=False, within=POSITIVE),
    Key("head_dim", "attention.key_length", required=False),
)
_ROPE_SLOTS = (
    Slot("token_embd", "model.embed_tokens"),
    Slot("blk.{i}.attn_norm", "model.layers.{i}.input_layernorm"),
    Slot("blk.{i}.attn_q", "model.layers.{i}.self_attn.q_proj", ROPE_Q),
    Slot("blk.{i}.attn_k", "model.layers.{i}.self_attn.k_proj", ROPE_K),
    Slot("blk.{i}.attn_v", "model.layers.{i}.self_attn.v_proj"),
    Slot("blk.{i}.attn_output", "model.layers.{i}.self_attn.o_proj"),
    Slot("blk.{i}.ffn_norm", "model.layers.{i}.post_attention_layernorm"),
    Slot("blk.{i}.ffn_gate", "model.layers.{i}.mlp.gate_proj"),
    Slot("blk.{i}.ffn_up", "model.layers.{i}.mlp.up_proj"),
    Slot("blk.{i}.ffn_down", "model.layers.{i}.mlp.down_proj"),
    Slot("output_norm", "model.norm"),
    Slot("output", "lm_head"),
)
_GPT2_KEYS = (
    Key("n_embd", "embedding_length"),
    Key("n_layer", "block_count"),
    Key("n_head", "attention.head_count"),
    Key("n_inner", "feed_forward_length"),
    Key("n_positions", "context_length"),
    Key("layer_norm_epsilon", "attention.layer_norm_epsilon", "float", within=POSITIVE),
)
_GPT2_SLOTS = (
    Slot("token_embd", "transformer.wte"),
    Slot("position_embd", "transformer.wpe"),
    Slot("blk.{i}.attn_norm", "transformer.h.{i}.ln_1"),
    Slot("blk.{i}.attn_qkv", "transformer.h.{i}.attn.c_attn", CONV1D),
    Slot("blk.{i}.attn_output", "transformer.h.{i}.attn.c_proj", CONV1D),
    Slot("blk.{i}.ffn_norm", "transformer.h.{i}.ln_2"),
    Slot("blk.{i}.ffn_up", "transformer.h.{i}.mlp.c_fc", CONV1D),
    Slot("blk.{i}.ffn_down", "transformer.h.{i}.mlp.c_proj", CONV1D),
    Slot("output_norm", "transformer.ln_f"),
    Slot("output", "lm_head"),
)

ARCHS.register("llama")(
    Arch(
        "llama",
        "llama",
        _ROPE_KEYS,
        _ROPE_SLOTS,
        fixed={"hidden_act": "silu"},
        interleaved=True,
        biases={"attention_bias": "blk.0.attn_output.bias", "mlp_bias": "blk.0.ffn_down.bias"},
        unfit=_llama_unfit,
    )
)
ARCHS.register("qwen2")(
    Arch(
        "qwen2",
        "qwen2",
        _ROPE_KEYS,
        _ROPE_SLOTS,
        fixed={"hidden_act": "silu", "use_sliding_window": False},
        unfit=_qwen2_unfit,
    )
)
ARCHS.register("gpt2")(
    Arch(
        "gpt2",
        "gpt2",
        _GPT2_KEYS,
        _GPT2_SLOTS,
        rope=False,
        output_copy=True,
        unfit=_gpt2_unfit,
        fixed={
            "activation_function": "gelu_new",
            "scale_attn_weights": True,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        },
    )
)
