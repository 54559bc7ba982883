"""Lower-precision weights for inference: ``zoo.quantize(model, weights="int8")``.

Batch-1 decoding reads every weight once per token and does little arithmetic with it, so it is
bound by memory traffic: weights stored in fewer bytes decode faster. ``weights`` names the storage:

- ``bf16``: the whole model cast to bfloat16 (``model.to(torch.bfloat16)``), on any device.
- ``int8``: every ``nn.Linear`` (attention q/k/v/out, FFN, pooler, LM head) with int8 weights and one
  scale per output row. On the CPU through ``torch.ao.quantization.quantize_dynamic`` (fbgemm/x86
  kernels that also quantize each activation row to int8 on the fly); on CUDA through torchao's
  ``Int8WeightOnlyConfig`` (activations stay in their float dtype).
- ``int4``: CUDA only, torchao's ``Int4WeightOnlyConfig`` (groups of 128, the tinygemm kernel of
  core PyTorch, bfloat16 activations; the model is cast to bfloat16 first).

Why two backends. torchao is the maintained home of PyTorch quantization and the one used on CUDA,
but measured on a CPU (torch 2.13, torchao 0.18, 2 threads, batch-1 greedy decoding of a 6-layer
d_model 384 GPT-2, float32 = 1.00x) none of its configs is faster than float32: int8 weight-only
converts the int8 matrix back to the activation dtype on every call (0.23x; 0.26x with
``generate(compile=True)``), int8 dynamic runs at 0.66x, int8 dynamic with int4 weights at 0.07x,
and its int4 weight-only config has no CPU packing (``plain`` needs the CUDA-only mslk kernels). The
deprecated but still shipped ``torch.ao`` dynamic int8 path ran at 2.1-2.4x, so the CPU uses it
until torchao has an eager CPU kernel.

Embeddings stay in float: a lookup reads only the rows of the current tokens, so int8 would save
memory but no time. A head tied to the embedding (GPT-2, T5) is the largest matrix a decoding step
multiplies by, so it gets a quantized *copy* of the embedding as its own ``lm_head`` (the lookup
table itself stays float); an encoder's masked-LM head stays tied and float.

The model is changed in place and returned, in eval mode, with ``quantized_weights`` set to the
precision. It is for inference: it does not train, and its ``state_dict`` holds packed weights, so
keep the float checkpoint and quantize after loading. ``generate`` (greedy, sampling, beam; cached
or not) uses it unchanged.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn

from zoo.adapters import adapted_layers
from zoo.kv_cache import KV_DTYPES
from zoo.registry import ConfigError, Registry

WEIGHTS: Registry[Callable[[nn.Module], None]] = Registry("weight precision")


def quantize(model: nn.Module, weights: str | None = "int8", kv_cache: str | None = None) -> nn.Module:
    """Store ``model``'s weights in ``weights`` precision, in place; returns ``model`` in eval mode.

    Args:
        model: a zoo model (any form) in eval mode, not already quantized, without unmerged adapters.
        weights: ``"int8"``, ``"int4"``, ``"bf16"`` or None (weights unchanged). See the module doc
            for what each does on which device.
        kv_cache: ``"int8"``: keys and values kept in int8 with a scale per head and position, in
            the KV cache and in attention without one (``ZooModel.kv_dtype``, zoo.kv_cache); None:
            in the weights' dtype.

    Raises:
        ConfigError: a precision that is not one of these, or one the model's device or state cannot
            take (int4 on the CPU, int8 of a bfloat16 model on the CPU, a model in training mode, ...).
            The message names the value and what works instead.
    """
    if kv_cache is not None and kv_cache not in KV_DTYPES:
        raise ConfigError(f"kv_cache={kv_cache!r} is not a KV-cache precision; valid: "
                          f"{', '.join(map(repr, KV_DTYPES))} or None")
    apply = None if weights is None else WEIGHTS.get(weights, field="weights")
    if apply is not None:
        _check_quantizable(model, weights)
    if apply is not None:
        apply(model)  # a refusal of the device or dtype comes before anything changes
        model.quantized_weights = weights
    model.kv_dtype = kv_cache
    return model.eval()


def _check_quantizable(model: nn.Module, weights: str) -> None:
    if model.training:
        raise ConfigError(f"weights={weights!r}: zoo.quantize prepares a model for inference and this one is "
                          "in training mode; call model.eval() first (and keep training the float model)")
    done = getattr(model, "quantized_weights", None)
    if done is not None:
        raise ConfigError(f"weights={weights!r}: this model is already quantized (weights={done!r}); "
                          "quantize a freshly loaded float model instead")
    if adapted_layers(model):
        raise ConfigError(f"weights={weights!r}: this model has LoRA adapters; fold them in with "
                          "zoo.adapters.merge(model) before quantizing")


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _untie_head(model: nn.Module) -> None:
    """Give a model whose logits reuse the embedding matrix an ``lm_head`` Linear sharing that
    matrix, so that the quantizer replaces the head with its own packed copy and the embedding
    lookup keeps the float table. ``ZooModel.logits`` uses ``lm_head`` whenever it is set."""
    if getattr(model, "lm_head", False) is not None:
        return  # an untied head (already a Linear), or a form without an LM head (encoder)
    embed = model.embed.weight
    head = nn.Linear(embed.shape[1], embed.shape[0], bias=False, device="meta")
    head.weight = embed  # shared, not copied: the quantizer makes the packed copy
    model.lm_head = head


@WEIGHTS.register("bf16")
def _bf16(model: nn.Module) -> None:
    model.to(torch.bfloat16)


@WEIGHTS.register("int8")
def _int8(model: nn.Module) -> None:
    device = _device(model)
    if device.type == "cpu":
        _cpu_dynamic_int8(model)
    elif device.type == "cuda":
        _torchao(model, "int8")
    else:
        raise ConfigError(f"weights='int8' has no kernel on {device.type!r}; it runs on 'cpu' (torch.ao dynamic "
                          "int8) and 'cuda' (torchao); weights='bf16' works on every device")


@WEIGHTS.register("int4")
def _int4(model: nn.Module) -> None:
    device = _device(model)
    if device.type != "cuda":
        raise ConfigError(f"weights='int4' needs a CUDA device (torchao's int4 weight-only kernel); this model "
                          f"is on {device.type!r}, where torchao has no eager int4 kernel: use weights='int8' "
                          "or 'bf16'")
    _torchao(model, "int4")


def _cpu_dynamic_int8(model: nn.Module) -> None:
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        raise ConfigError(f"weights='int8' on the CPU quantizes a float32 model and this one is {dtype}; "
                          "load it in float32 (or use weights='bf16' alone)")
    with warnings.catch_warnings():  # chosen knowingly: the module docstring says why not torchao here
        warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization is deprecated")
        warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions")
        engines = set(torch.backends.quantized.supported_engines) - {"none"}
        quantize_dynamic = getattr(getattr(torch.ao, "quantization", None), "quantize_dynamic", None)
        if quantize_dynamic is None or not engines:
            raise ConfigError(f"weights='int8' on the CPU needs torch.ao.quantization with a quantized engine; "
                              f"torch {torch.__version__} has none here: use weights='bf16'")
        _untie_head(model)
        quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
    # its packed weights are script objects torch.compile cannot trace: a graph break at every Linear,
    # measured slower than eager decoding, so generate(compile=True) refuses rather than slow down
    model.compile_blocker = ("its int8 weights (torch.ao dynamic quantization, the CPU's int8 path) break "
                             "torch.compile's graph at every Linear, which decodes slower than eager")


def _torchao(model: nn.Module, weights: str) -> None:
    try:
        from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    except ImportError as err:
        raise ConfigError(f"weights={weights!r} on CUDA uses torchao, which is not installed: "
                          "pip install 'zoo[quantize]'") from err
    if weights == "int8":
        config = Int8WeightOnlyConfig()
    else:
        config = Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d")
        model.to(torch.bfloat16)  # the tinygemm kernel takes bfloat16 activations
    _untie_head(model)
    quantize_(model, config)
