"""Lower-precision weights for inference: ``zoo.quantize(model, weights="int8")``.

Batch-1 decoding reads every weight once per token and does little arithmetic with it, so it is
bound by memory traffic: weights stored in fewer bytes decode faster. ``weights`` names the storage:

- ``bf16``: the whole model cast to bfloat16 (``model.to(torch.bfloat16)``), on any device.
- ``int8``: every ``nn.Linear`` (attention q/k/v/out, FFN, pooler, LM head) with int8 weights and one
  scale per output row, weight-only. On the CPU an :class:`Int8Linear` over PyTorch's own int8
  weight-only kernel (``torch._weight_int8pack_mm``, bfloat16 activations); on CUDA torchao's
  ``Int8WeightOnlyConfig``. A mixture of experts' stacked experts (``zoo.moe.ExpertLinear``) become
  :class:`Int8ExpertLinear` on either device: one scale per output row per expert, an expert's rows
  dequantised when it runs.
- ``int4``: CUDA only, torchao's ``Int4WeightOnlyConfig`` (groups of 128, the tinygemm kernel of
  core PyTorch, bfloat16 activations; the model is cast to bfloat16 first).

Why not torchao on the CPU. torchao is the maintained home of PyTorch quantization and the one used
on CUDA, but measured on a CPU (torch 2.13, torchao 0.18, 2 threads, batch-1 greedy decoding of a
6-layer d_model 384 GPT-2, float32 = 1.00x) none of its configs is faster than float32: int8
weight-only converts the int8 matrix back to the activation dtype on every call (0.23x), int8
dynamic runs at 0.66x, int8 dynamic with int4 weights at 0.07x, and its int4 weight-only config has
no CPU packing. ``torch.ao.quantization.quantize_dynamic`` (deprecated) ran at 2.1x but its packed
weights break ``torch.compile``'s graph at every Linear. PyTorch's own int8 weight-only matmul
(``torch._weight_int8pack_mm``), called directly, ran at 1.5x float32 and, being plain tensors and an
aten op, composes with ``generate(compile=True)``: 3.6x HF's eager float32 ``generate`` at batch 1
(scripts/bench/quantize.py).

Embeddings stay in float: a lookup reads only the rows of the current tokens, so int8 would save
memory but no time. A head tied to the embedding (GPT-2, T5) is the largest matrix a decoding step
multiplies by, so it gets a quantized *copy* of the embedding as its own ``lm_head`` (the lookup
table itself stays float); an encoder's masked-LM head stays tied and float.

The model is changed in place and returned, in eval mode, with ``quantized_weights`` set to the
precision. It is for inference: it does not train, and its ``state_dict`` holds int8 (or packed)
weights, so keep the float checkpoint and quantize after loading. ``generate`` (greedy, sampling, beam; cached
or not) uses it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.adapters import adapted_layers
from zoo.kv_cache import check_kv_dtype
from zoo.moe import ExpertLinear, expert_stacks
from zoo.registry import ConfigError, Registry
from zoo.zoo_model import ZooModel

WEIGHTS: Registry[Callable[[nn.Module], None]] = Registry("weight precision")


def quantize(model: ZooModel, weights: str | None = "int8", kv_cache: str | None = None) -> ZooModel:
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
    check_kv_dtype(kv_cache, field="kv_cache")  # a registered KV_FORMATS name or None
    apply = None if weights is None else WEIGHTS.get(weights, field="weights")
    if apply is not None:
        _check_quantizable(model, weights)
    if apply is not None:
        apply(model)  # a refusal of the device or dtype comes before anything changes
        model.quantized_weights = weights
    model.set_kv_dtype(kv_cache)
    return model.eval()


def _check_quantizable(model: ZooModel, weights: str) -> None:
    if model.training:
        raise ConfigError(
            f"weights={weights!r}: zoo.quantize prepares a model for inference and this one is "
            "in training mode; call model.eval() first (and keep training the float model)"
        )
    done = model.quantized_weights
    if done is not None:
        raise ConfigError(
            f"weights={weights!r}: this model is already quantized (weights={done!r}); "
            "quantize a freshly loaded float model instead"
        )
    if adapted_layers(model):
        raise ConfigError(
            f"weights={weights!r}: this model has LoRA adapters; fold them in with "
            "zoo.adapters.merge(model) before quantizing"
        )


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _untie_head(model: ZooModel) -> None:
    """Give a model whose logits reuse the embedding matrix an ``lm_head`` Linear sharing that
    matrix, so that the quantizer replaces the head with its own packed copy and the embedding
    lookup keeps the float table. ``ZooModel.logits`` uses ``lm_head`` whenever it is set."""
    if not model.has_lm_head or model.lm_head is not None:
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
        _cpu_int8(model)
    elif device.type == "cuda":
        _torchao(model, "int8")
    else:
        raise ConfigError(
            f"weights='int8' has no kernel on {device.type!r}; it runs on 'cpu' (PyTorch's int8 "
            "weight-only matmul) and 'cuda' (torchao); weights='bf16' works on every device"
        )
    _int8_experts(model)  # after a refusal, so a refused model is unchanged


@WEIGHTS.register("int4")
def _int4(model: nn.Module) -> None:
    device = _device(model)
    if device.type != "cuda":
        raise ConfigError(
            f"weights='int4' needs a CUDA device (torchao's int4 weight-only kernel); this model "
            f"is on {device.type!r}, where torchao has no eager int4 kernel: use weights='int8' "
            "or 'bf16'"
        )
    _torchao(model, "int4")


class Int8Linear(nn.Module):
    """A Linear with int8 weights and one scale per output row (symmetric absmax: w ~ q * scale), for
    inference. Its matmul is PyTorch's own weight-only int8 kernel ``torch._weight_int8pack_mm``, which
    reads the int8 weights and multiplies bfloat16 activations; the output returns in the input's
    dtype. That kernel takes in_features in multiples of 16 only (others crash it), so other widths
    dequantise the weight for each call (correct, not faster). Plain tensors throughout: it traces
    under ``torch.compile`` and its state_dict is int8 weights and scales."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        scale = weight.detach().float().abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        self.register_buffer("weight", (weight.detach().float() / scale[:, None]).round().to(torch.int8))
        self.register_buffer("scale", scale.to(torch.bfloat16))  # (out,)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.packed = self.in_features % 16 == 0  # what the kernel accepts

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        return cls(linear.weight, linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.packed:
            y = torch._weight_int8pack_mm(x.reshape(-1, self.in_features).to(torch.bfloat16), self.weight, self.scale)
            y = y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        else:
            y = F.linear(x, self.weight.to(x.dtype) * self.scale[:, None].to(x.dtype))
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed={self.packed}"


class Int8ExpertLinear(nn.Module):
    """``zoo.moe.ExpertLinear`` with int8 weights (E, out, in) and one scale per output row per expert
    (E, out), symmetric absmax as in :class:`Int8Linear`. ``forward(x, expert)`` dequantises that
    expert's (out, in) rows to the input's dtype and multiplies: memory shrinks, the matmul does not."""

    def __init__(self, experts: ExpertLinear) -> None:
        super().__init__()
        self.in_features, self.out_features = experts.in_features, experts.out_features
        weight = experts.weight.detach().float()  # (E, out, in)
        scale = weight.abs().amax(dim=2).clamp(min=torch.finfo(torch.float32).tiny) / 127  # (E, out)
        self.register_buffer("weight", (weight / scale[..., None]).round().to(torch.int8))
        self.register_buffer("scale", scale.to(torch.bfloat16))
        self.register_buffer("bias", None if experts.bias is None else experts.bias.detach().clone())  # (E, out)

    def forward(self, x: Tensor, expert: int) -> Tensor:
        """x: (n, in) rows sent to ``expert`` -> (n, out)."""
        weight = self.weight[expert].to(x.dtype) * self.scale[expert, :, None].to(x.dtype)  # (out, in)
        return F.linear(x, weight, None if self.bias is None else self.bias[expert].to(x.dtype))

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]} x ({self.in_features} -> {self.out_features}), bias={self.bias is not None}"


def _int8_experts(model: nn.Module) -> None:
    """Every stacked expert layer becomes an Int8ExpertLinear (plain tensors: any device)."""
    for parent, name, experts in expert_stacks(model):
        setattr(parent, name, Int8ExpertLinear(experts))


def _cpu_int8(model: nn.Module) -> None:
    """Every nn.Linear becomes an Int8Linear (a tied LM head first gets its own, so its copy is int8)."""
    if not hasattr(torch, "_weight_int8pack_mm"):
        raise ConfigError(
            f"weights='int8' on the CPU uses torch._weight_int8pack_mm, which torch {torch.__version__} "
            "lacks; use weights='bf16'"
        )
    _untie_head(model)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, Int8Linear.from_linear(child))


def _torchao(model: nn.Module, weights: str) -> None:
    try:
        from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    except ImportError as err:
        raise ConfigError(
            f"weights={weights!r} on CUDA uses torchao, which is not installed: pip install 'zoo[quantize]'"
        ) from err
    if weights == "int8":
        config = Int8WeightOnlyConfig()
    else:
        config = Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d")
        model.to(torch.bfloat16)  # the tinygemm kernel takes bfloat16 activations
    _untie_head(model)
    quantize_(model, config)
