"""zoo: Transformer components chosen by name, composed into encoder, decoder and encoder-decoder models.

import zoo
model = zoo.create_model("gpt2", n_layers=4, position="alibi")
logits = model(input_ids)  # (B, T, V)
"""

from typing import TYPE_CHECKING

from zoo import adapters, attention, ffn, mask, moe, norm, position  # noqa: F401  (fill the registries)
from zoo.config import ModelConfig
from zoo.inspect import HeadStats, attention_rollout, capture_attention, head_stats, row_entropy
from zoo.io import CheckpointError, atomic_save, atomic_write, load_weights_file
from zoo.kv_cache import Cache, KVCache
from zoo.lazy import names_from
from zoo.losses import chunked_cross_entropy
from zoo.measuring import Measured, measured
from zoo.models import (
    DecoderModel,
    EncoderDecoderModel,
    EncoderModel,
    ZooModel,
    build_model,
    count_parameters,
)
from zoo.position import position_limit
from zoo.presets import create_model, get_config, list_models, register_model
from zoo.pretrained import check_weights, load_pretrained, save_pretrained
from zoo.quantize import quantize
from zoo.registry import ConfigError, Registry, list_components, register
from zoo.stats import ModelStats, stats

if TYPE_CHECKING:
    from zoo.gguf import GGUFContents, from_gguf, gguf_exportable, read_gguf, to_gguf
    from zoo.hf import from_hf, from_hf_config, hf_exportable, to_hf

__version__ = "0.1.0"
CONVERTERS = {
    **dict.fromkeys(("gguf", "GGUFContents", "from_gguf", "gguf_exportable", "read_gguf", "to_gguf"), "zoo.gguf"),
    **dict.fromkeys(("hf", "from_hf", "from_hf_config", "hf_exportable", "to_hf"), "zoo.hf"),
}
"""The HF and GGUF converters' names: imported on first use, not with zoo (``import zoo`` builds models)."""
__getattr__ = names_from(__name__, CONVERTERS)

__all__ = [
    "Cache",
    "CheckpointError",
    "ConfigError",
    "DecoderModel",
    "EncoderDecoderModel",
    "EncoderModel",
    "GGUFContents",
    "HeadStats",
    "KVCache",
    "Measured",
    "ModelConfig",
    "ModelStats",
    "Registry",
    "ZooModel",
    "atomic_save",
    "atomic_write",
    "attention_rollout",
    "build_model",
    "capture_attention",
    "check_weights",
    "chunked_cross_entropy",
    "count_parameters",
    "create_model",
    "from_gguf",
    "from_hf",
    "from_hf_config",
    "gguf_exportable",
    "hf_exportable",
    "get_config",
    "head_stats",
    "list_components",
    "list_models",
    "load_weights_file",
    "load_pretrained",
    "measured",
    "position_limit",
    "quantize",
    "read_gguf",
    "register",
    "register_model",
    "row_entropy",
    "save_pretrained",
    "stats",
    "to_gguf",
    "to_hf",
]
