"""Back-of-the-envelope numbers for a model: parameters, FLOPs per token and KV-cache size.

Parameters are counted exactly on a meta-device copy, so a 70B preset costs no memory. A
mixture-of-experts model (``ffn=moe``) has fewer *active* parameters than parameters: one token
passes its router, its top-k experts and the shared expert, not the other experts
(``Sublayer.inactive_parameters``, summed over the sublayers); a dense model's are all active.
FLOPs follow Chowdhery et al. 2022 (PaLM, appendix B): a forward pass costs 2 FLOPs per active matmul
weight per token plus 4 * layers * seq_len * (heads * head_dim) for the score and value products;
training (forward + backward) is 3x the forward. Two conventions count the attention term, and both are
given: ``flops_per_token_*`` counts every attention layer whole, each query against all seq_len keys
(PaLM's appendix B, nanoGPT's ``estimate_mfu``); ``flops_per_token_*_causal`` counts a causal
self-attention layer at half of that, the keys a query may see on average (what a causal kernel computes;
FlashAttention's papers count so). Bidirectional and cross-attention layers count whole in both; a
sliding window's layers count as causal ones, whatever the window.

Parameters and FLOPs count the true vocabulary (``vocab_size``). A model whose embedding and head rows
are padded (``vocab_multiple_of``) holds ``padding_params`` more in memory and its head multiplies by
them too; those are neither parameters (nothing trains them) nor model FLOPs (an MFU counts the work the
model needs, not the work its padding adds). KV-cache bytes are
2 (K and V) x layers x kv_heads x head_dim x seq_len x bytes per value x batch; an int8 cache
(``kv_dtype="int8"``) takes 1 byte per value plus a 4-byte scale per head and position (zoo.kv_cache).

Model FLOPs utilisation (MFU) divides the FLOPs per token times tokens per second by the device's peak:
:func:`peak_flops` looks that up by the device's name in zoo's table of dense peaks (:data:`PEAK_FLOPS`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from zoo.config import ModelConfig
from zoo.kv_cache import check_kv_dtype, value_bytes
from zoo.models import ZooModel, build_model, count_parameters
from zoo.presets import get_config
from zoo.sublayer import Sublayer


@dataclass(frozen=True)
class ModelStats:
    name: str
    params: int  # the true vocabulary's rows: without the padding rows (padding_params)
    embedding_params: int  # token, position and segment tables
    non_embedding_params: int
    flops_per_token_forward: int  # attention counted whole: every query against every key
    flops_per_token_train: int
    kv_cache_bytes: int
    seq_len: int
    batch_size: int
    dtype: str
    kv_dtype: str  # what the KV cache stores: the model's dtype, or "int8"
    active_params: int  # what one token uses: all of params but the experts it is not routed to (ffn=moe)
    flops_per_token_forward_causal: int  # causal self-attention counted at half: the keys a query sees
    flops_per_token_train_causal: int
    vocab_size: int  # the tokens the model predicts
    padded_vocab_size: int  # its embedding and head rows (vocab_multiple_of); = vocab_size unpadded
    padding_params: int  # in the padding rows: held in memory, not in params

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stats(
    model: str | ModelConfig | ZooModel,
    *,
    seq_len: int | None = None,
    batch_size: int = 1,
    dtype: torch.dtype = torch.bfloat16,
    kv_dtype: str | None = None,
    **overrides: Any,
) -> ModelStats:
    """Parameters, FLOPs per token and KV-cache bytes of a preset name, a config or a model.

    ``zoo.stats("llama2-7b", seq_len=4096, dtype=torch.bfloat16).kv_cache_bytes == 2_147_483_648``;
    with ``kv_dtype="int8"`` it is 1_107_296_256 (0.52x: 128 + 4 bytes per head and position instead of 256).
    """
    check_kv_dtype(kv_dtype)
    if isinstance(model, ZooModel):
        cfg, name = model.config, type(model).__name__
    else:
        cfg = get_config(model, **overrides) if isinstance(model, str) else model.replace(**overrides)
        name = model if isinstance(model, str) else cfg.arch
        with torch.device("meta"):
            model = build_model(cfg)
    seq_len = seq_len or cfg.max_seq_len or 2048
    params = count_parameters(model)  # the true vocabulary's rows
    padding = sum(p.numel() for p in model.parameters()) - params  # the vocabulary's padding rows
    embedding = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Embedding))
    embedding -= sum(stack.position.attention_table_params() for stack in model.stacks())
    if model.embed is not None:  # its padding rows (a pipeline stage may hold no embedding)
        embedding -= (cfg.padded_vocab_size - cfg.vocab_size) * model.embed.weight.shape[1]
    non_embedding = params - embedding
    inactive = sum(m.inactive_parameters() for m in model.modules() if isinstance(m, Sublayer))
    form = cfg.form  # what differs between the forms: its head, its attention and cached layers
    tied_head = form.ties_head(cfg)
    head = cfg.vocab_size * cfg.d_model if tied_head else 0  # tied: a matmul, no new weight
    d_attn = cfg.n_heads * cfg.resolved_head_dim
    attention = 4 * seq_len * d_attn  # per layer: QK^T and AV over seq_len keys, 2 FLOPs per multiply-add
    causal = sum(len(stack.blocks) for stack in model.stacks() if stack.mask.causal)  # their self-attention
    forward = 2 * (non_embedding - inactive + head) + form.attention_layers(cfg) * attention
    forward_causal = forward - causal * attention // 2
    per_head = value_bytes(kv_dtype, cfg.resolved_head_dim, torch.empty((), dtype=dtype).element_size())
    # a windowed layer's cache keeps its last positions only (each layer's: a window_pattern's global ones all)
    lookbacks = model.stacks()[-1].lookbacks()
    held = [seq_len if back is None or form.cross_attention else min(seq_len, back) for back in lookbacks]
    per_layer = cfg.resolved_n_kv_heads * per_head * batch_size * 2  # per position held, K and V
    kv = per_layer * sum(held) * form.cached_layers(cfg) // len(held)  # decoders: one held per cached layer
    return ModelStats(
        name=name,
        params=params,
        embedding_params=embedding,
        non_embedding_params=non_embedding,
        flops_per_token_forward=forward,
        flops_per_token_train=3 * forward,
        kv_cache_bytes=kv,
        seq_len=seq_len,
        batch_size=batch_size,
        dtype=str(dtype).removeprefix("torch."),
        kv_dtype=kv_dtype or str(dtype).removeprefix("torch."),
        active_params=params - inactive,
        flops_per_token_forward_causal=forward_causal,
        flops_per_token_train_causal=3 * forward_causal,
        vocab_size=cfg.vocab_size,
        padded_vocab_size=cfg.padded_vocab_size,
        padding_params=padding,
    )


# Dense peak FLOP/s per compute dtype (no 2:4 sparsity: NVIDIA's datasheets print the sparse figure, twice
# these, with an asterisk). "tf32" is a float32 matmul on tensor cores (torch.backends.cuda.matmul.allow_tf32).
# Sources: NVIDIA H100 datasheet (2024, H100 SXM / PCIe / NVL columns, https://www.nvidia.com/en-us/data-center/h100/)
# and H200 datasheet (H200 SXM / NVL columns, https://www.nvidia.com/en-us/data-center/h200/).
_HOPPER_SXM = {"float32": 67e12, "tf32": 494.7e12, "bfloat16": 989.4e12, "float16": 989.4e12, "float8": 1978.9e12}
_HOPPER_NVL = {"float32": 60e12, "tf32": 417.5e12, "bfloat16": 835.5e12, "float16": 835.5e12, "float8": 1670.5e12}
_HOPPER_PCIE = {"float32": 51.2e12, "tf32": 378e12, "bfloat16": 756e12, "float16": 756e12, "float8": 1513e12}

# (words that must all be in the lower-cased torch.cuda.get_device_name, dense peaks), the first match wins:
# "NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA GH200 480GB", "NVIDIA H100 80GB HBM3" (SXM5), "NVIDIA H100 PCIe",
# "NVIDIA H100 NVL"; an H100 of no named variant is taken to be an SXM5 (its HBM3 names vary by memory size).
PEAK_FLOPS: tuple[tuple[tuple[str, ...], dict[str, float]], ...] = (
    (("h200", "nvl"), _HOPPER_NVL),
    (("h200",), _HOPPER_SXM),  # GH200's GPU too
    (("h100", "nvl"), _HOPPER_NVL),
    (("h100", "pcie"), _HOPPER_PCIE),
    (("h100", "hbm2e"), _HOPPER_PCIE),  # the PCIe card's name under early drivers
    (("h100",), _HOPPER_SXM),
)


def peak_flops(device_name: str, dtype: torch.dtype | str) -> float | None:
    """Dense peak FLOP/s of one device, by its name as ``torch.cuda.get_device_name`` gives it, for matmuls in
    ``dtype`` (a torch dtype, or "tf32" for float32 matmuls on tensor cores); None for a device or dtype that
    zoo's table (:data:`PEAK_FLOPS`: H100 and H200 variants) does not hold.

    ``peak_flops("NVIDIA H200", torch.bfloat16) == 989.4e12``.
    """
    key = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    key = "float8" if key.startswith("float8") else key
    name = device_name.lower()
    for words, peaks in PEAK_FLOPS:
        if all(word in name for word in words):
            return peaks.get(key)
    return None
