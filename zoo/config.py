"""The model configuration: one typed dataclass, validated when a model is built."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import typing
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zoo.ranges import POSITIVE, FloatRange
from zoo.registry import ARCH, ATTENTION, FFN, MASK, NORM, NORM_PLACEMENT, POSITION, REGISTRIES, ConfigError, readers

if TYPE_CHECKING:
    from zoo.form import Form


@dataclass
class ModelConfig:
    """Everything needed to build a zoo model. Component choices are registry names.

    Fields left as ``None`` are resolved by the ``resolved_*`` properties below; the config is never
    mutated, so it round-trips through ``asdict``/``from_dict`` unchanged.

    Component settings (``rope_base``, ``window``, ``rel_buckets``...) are read by some components
    only, each declaring them in its ``reads`` class attribute (``zoo.registry.readers``). One set away
    from its default that no chosen component reads is refused by ``validate``, never ignored.
    """

    # form and sizes
    arch: str = "decoder"
    vocab_size: int = 32000
    # the embedding and LM-head rows padded to a multiple of this (GPT-2: 128, 50,257 -> 50,304 rows), for
    # tensor-core tiles; the logits are cut back to vocab_size, so nothing outside the model sees the pad
    vocab_multiple_of: int | None = None  # None or 1: no padding (padded_vocab_size == vocab_size)
    d_model: int = 512
    n_layers: int = 6
    n_heads: int = 8
    n_kv_heads: int | None = None  # None: = n_heads (MHA); 1: MQA; otherwise GQA
    head_dim: int | None = None  # None: d_model // n_heads
    d_ff: int | None = None  # None: 4*d_model, or 2/3*4*d_model rounded up to ffn_multiple_of for GLUs
    ffn_multiple_of: int = 256
    n_encoder_layers: int | None = None  # encoder_decoder only; None: n_layers
    n_decoder_layers: int | None = None
    max_seq_len: int | None = None  # needed by learned positions; otherwise informative
    # components (registry names)
    position: str = "rope"
    norm: str = "rmsnorm"
    norm_placement: str = "pre"
    ffn: str = "swiglu"
    attention: str = "sdpa"
    mask: str | None = None  # self-attention mask of the main stack; None: the form's natural mask
    # details
    dropout: float = 0.0
    attn_dropout: float | None = None  # None: = dropout
    bias: bool = False
    qkv_bias: bool | None = None  # None: = bias (Qwen2 has q/k/v biases only)
    tie_embeddings: bool = True
    norm_eps: float = 1e-5
    embedding_norm: bool = False  # pre: the embeddings normalised in place of the first attention norm (ModernBERT)
    dyt_alpha: float = 0.5  # norm=dyt: the starting value of its learnable tanh slope alpha
    gelu_approximate: str = "none"  # "none" (erf, BERT) or "tanh" (GPT-2, T5 v1.1)
    attn_scale: float | None = None  # None: 1/sqrt(head_dim); T5 uses 1.0
    qk_norm: str = "none"  # a norm (zoo.norm) on the queries and keys before RoPE (Qwen3, OLMo 2); none
    qk_norm_scope: str = "head"  # qk_norm over each head's hd (Qwen3, Gemma 3) or "all" heads at once (OLMo 2)
    attn_softcap: float | None = None  # scores -> c * tanh(scores / c) before the mask (Gemma 2: 50); math/flex only
    final_softcap: float | None = None  # logits -> c * tanh(logits / c) (Gemma 2: 30)
    value_residual: bool = False  # each later layer's values mixed with the first layer's (Zhou et al. 2024)
    logit_scale: float = 1.0  # multiplies the final hidden state before the LM head (T5 v1.0: d_model**-0.5)
    embed_scale: float = 1.0  # multiplies the token embeddings (Vaswani et al. 2017, Gemma: d_model**0.5)
    rope_base: float = 10000.0
    rope_base_global: float | None = None  # rope: the base of a window_pattern's global (G) layers (ModernBERT: 160000)
    rope_scaling: str = "none"  # zoo.rope_scaling.ROPE_SCALINGS: none, linear (position interpolation), ntk, yarn
    rope_scaling_factor: float = 1.0
    rope_original_max_len: int | None = None  # yarn: the context length before the extension
    rel_buckets: int = 32  # t5_relative
    rel_max_distance: int = 128
    type_vocab_size: int = 0  # encoder: segment (token type) embeddings when > 0
    pooler: bool = False  # encoder: dense+tanh over the first token
    mlm_head: bool = False  # encoder: BERT masked-LM head (transform + tied decoder)
    init_std: float = 0.02
    # muP (Yang et al. 2022, https://arxiv.org/abs/2203.03466): the d_model whose learning rate and init
    # carry over to this width (zoo.zoo_model.ZooModel, "muP"); None: the standard parametrization
    mup_base_d_model: int | None = None
    # ffn=moe (zoo.moe): experts, routing and the router's losses (reported by the task, weighted here)
    n_experts: int = 8
    moe_top_k: int = 2  # experts per token
    moe_renormalize: bool = True  # the top-k routing weights sum to 1 (Mixtral); False: softmax over all (Qwen2-MoE)
    moe_shared_expert: bool = False  # one more expert every token passes through (Qwen2-MoE, DeepSeek)
    moe_aux_loss_coef: float = 0.01  # load-balancing loss (Switch Transformer); 0: off
    moe_z_loss_coef: float = 0.001  # router z-loss (ST-MoE); 0: off
    window: int | None = None  # sliding_window or document mask: a query sees itself and the window - 1 before it
    window_pattern: str | None = None  # per layer, repeated: L = the window, G = global (Gemma 2: LG); None: all L
    activation_checkpointing: str = "none"  # "none", "all" (every block) or "every_<k>": recompute in backward
    # special tokens used by generation
    pad_token_id: int = 0
    eos_token_id: int | None = None
    decoder_start_token_id: int = 0

    # ---- resolved values: each field that may be None, with None resolved --------------------------
    @property
    def resolved_n_kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def resolved_head_dim(self) -> int:
        return self.d_model // self.n_heads if self.head_dim is None else self.head_dim

    @property
    def resolved_d_ff(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        if FFN.get(self.ffn, field="ffn").gated:
            hidden = int(2 * 4 * self.d_model / 3)
            return self.ffn_multiple_of * math.ceil(hidden / self.ffn_multiple_of)
        return 4 * self.d_model

    @property
    def padded_vocab_size(self) -> int:
        """The rows of the token embedding and the LM head: ``vocab_size`` rounded up to ``vocab_multiple_of``.
        Rows from ``vocab_size`` on are padding: never looked up, their logits cut off (``ZooModel.logits``)."""
        multiple = self.vocab_multiple_of or 1
        return multiple * math.ceil(self.vocab_size / multiple)

    @property
    def resolved_n_encoder_layers(self) -> int:
        return self.n_layers if self.n_encoder_layers is None else self.n_encoder_layers

    @property
    def resolved_n_decoder_layers(self) -> int:
        return self.n_layers if self.n_decoder_layers is None else self.n_decoder_layers

    @property
    def resolved_mask(self) -> str:
        """The self-attention mask of the main stack (the encoder's in encoder_decoder)."""
        return self.form.natural_mask if self.mask is None else self.mask

    def choices(self) -> dict[str, str]:
        """Each component family, a field of the same name, -> the registered name chosen (``mask``
        resolved to the form's own where it is None)."""
        return {family: self.resolved_mask if family == "mask" else getattr(self, family) for family in REGISTRIES}

    @property
    def form(self) -> type[Form]:
        """The class registered as ``arch`` (zoo.models). It says what differs between the forms:
        ask it (``cfg.form.cross_attention``, ``cfg.form.decoding``) instead of comparing ``arch``."""
        return ARCH.get(self.arch, field="arch")

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ModelConfig:
        """Build from stored data (config.json, a checkpoint, a YAML file). An unknown key, or a value
        of the wrong type for its field (as the dataclass annotates it), is a ConfigError. An int is
        taken for a float field (JSON writes 10000.0 as it likes); a float, even 4.0, is refused for an
        int field, and so is a bool: a size written as 4.0 or true is a mistake to show, not to guess.

        Lenient where composition is strict: a component setting that no chosen component reads (a
        checkpoint written before ``validate`` refused them, e.g. ``rope_base`` beside ``position=alibi``)
        is reset to its default without a word, as the model that stored it never read it either."""
        if not isinstance(values, Mapping):
            raise ConfigError(f"the model config must map field names to values, not be a {type(values).__name__}")
        _check_fields(values)
        return cls(**{name: _typed(name, value) for name, value in values.items()}).without_ignored()

    def replace(self, **overrides: Any) -> ModelConfig:
        _check_fields(overrides)
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # ---- component settings ----------------------------------------------------------------------
    def ignored_settings(self) -> dict[str, list[tuple[str, str]]]:
        """Each component setting away from its default that no chosen component reads -> (family,
        name) of the registered components that would read it. Raises ConfigError for an unknown name."""
        chosen = self.choices()
        for family, name in chosen.items():
            REGISTRIES[family].get(name, field=family)
        defaults, ignored = _defaults(), {}
        for field, who in readers().items():
            if field not in defaults:
                family, name = who[0]
                raise TypeError(f"{family}={name} declares it reads {field!r}, which is not a ModelConfig field")
            if getattr(self, field) != defaults[field] and all(chosen[family] != name for family, name in who):
                ignored[field] = who
        return ignored

    def without_ignored(self, *, keep: Collection[str] = ()) -> ModelConfig:
        """This config with each setting that ``ignored_settings`` names back at its default, but for
        the fields in ``keep`` (a user's overrides: ``validate`` refuses those). Unknown component names
        leave it as it is, for ``validate`` to name."""
        try:
            ignored = self.ignored_settings()
        except ConfigError:
            return self
        reset = {field: _defaults()[field] for field in ignored if field not in keep}
        return dataclasses.replace(self, **reset) if reset else self

    def _check_settings_read(self) -> None:
        ignored = self.ignored_settings()
        if not ignored:
            return
        field, who = next(iter(ignored.items()))
        chosen = self.choices()
        wanted = _either([f"{family}={name}" for family, name in who])
        ignoring = [f"{family}={chosen[family]}" for family in dict.fromkeys(family for family, _ in who)]
        raise ConfigError(
            f"{field}={getattr(self, field)!r} is read by {wanted} only; {' and '.join(ignoring)} "
            f"{'ignores' if len(ignoring) == 1 else 'ignore'} it: drop the override or choose {wanted}"
        )

    # ---- validation ----------------------------------------------------------------------------
    def validate(self) -> ModelConfig:
        """Raise ConfigError naming the field and the fix for any setting that cannot work.

        The rules every model shares are here; each chosen component (its ``check`` classmethod, where
        it has one) and the form (``form.check``) add their own."""
        form = self.form
        components = (
            POSITION.get(self.position, field="position"),
            NORM.get(self.norm, field="norm"),
            NORM_PLACEMENT.get(self.norm_placement, field="norm_placement"),
            FFN.get(self.ffn, field="ffn"),
            ATTENTION.get(self.attention, field="attention"),
            MASK.get(self.resolved_mask, field="mask"),
        )
        self._check_floats()  # first: a NaN passes every comparison a later check would make
        if self.qk_norm != "none" and self.qk_norm not in NORM:
            raise ConfigError(
                f"qk_norm={self.qk_norm!r} is not a registered norm; valid: none, {', '.join(NORM.names())}"
            )
        self._check_sizes()
        self._check_settings_read()
        for component in components:
            component.check(self)
        self._check_values()
        form.check(self)
        for name in ("pad_token_id", "decoder_start_token_id", "eos_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ConfigError(f"{name}={value} must be a token id in [0, vocab_size={self.vocab_size})")
        return self

    def _check_sizes(self) -> None:
        for name in (
            "vocab_size",
            "vocab_multiple_of",
            "d_model",
            "n_layers",
            "n_heads",
            "ffn_multiple_of",
            "rel_buckets",
            "rel_max_distance",
            "n_kv_heads",
            "head_dim",
            "d_ff",
            "n_encoder_layers",
            "n_decoder_layers",
            "max_seq_len",
            "rope_original_max_len",
            "n_experts",
            "moe_top_k",
            "mup_base_d_model",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise ConfigError(f"{name}={value!r} must be a positive integer")
        if self.type_vocab_size < 0:
            raise ConfigError(f"type_vocab_size={self.type_vocab_size} must be >= 0 (0 disables segments)")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ConfigError(
                f"n_heads={self.n_heads} does not divide d_model={self.d_model}; choose n_heads among "
                f"{_divisors(self.d_model)} or set head_dim explicitly"
            )
        if self.n_heads % self.resolved_n_kv_heads:
            raise ConfigError(
                f"n_kv_heads={self.resolved_n_kv_heads} does not divide n_heads={self.n_heads}; choose among "
                f"{_divisors(self.n_heads)}"
            )

    @property
    def checkpoint_every(self) -> int:
        """Every how many blocks activations are recomputed in backward (0: never; 1: every block)."""
        policy = str(self.activation_checkpointing).lower()
        if policy in ("none", "false"):
            return 0
        if policy in ("all", "true"):
            return 1
        every = policy.removeprefix("every_")
        if policy.startswith("every_") and every.isdigit() and int(every) > 0:
            return int(every)
        raise ConfigError(
            f"activation_checkpointing={self.activation_checkpointing!r}: choose none, all (true) or "
            f"every_<k> (every k-th block, e.g. every_2)"
        )

    def _check_floats(self) -> None:
        """Every float field is a finite number in its range (``FLOAT_RANGES``); None where the field allows it."""
        for name, allowed in FLOAT_RANGES.items():
            value = getattr(self, name)
            if value is None and type(None) in _field_types()[name]:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not allowed.holds(value):
                raise ConfigError(f"{name}={value!r} must {allowed}")

    def _check_values(self) -> None:
        self.checkpoint_every  # noqa: B018  (raises for an unknown policy)
        if self.window is not None and (
            isinstance(self.window, bool) or not isinstance(self.window, int) or self.window <= 0
        ):
            raise ConfigError(f"window={self.window!r} must be a positive integer (the positions a query sees)")
        if self.window is not None and self.max_seq_len is not None and self.window > self.max_seq_len:
            raise ConfigError(
                f"window={self.window} is wider than max_seq_len={self.max_seq_len}, the longest sequence the model "
                f"takes (a window of {self.max_seq_len} already sees every position); lower window to at most "
                f"{self.max_seq_len} or raise max_seq_len"
            )
        if self.qk_norm_scope not in ("head", "all"):
            raise ConfigError(
                f"qk_norm_scope={self.qk_norm_scope!r} must be 'head' (each head) or 'all' (every head at once)"
            )
        if self.qk_norm == "none" and self.qk_norm_scope != "head":
            raise ConfigError(
                f"qk_norm_scope={self.qk_norm_scope!r} scopes qk_norm, which is none: set model/qk_norm=rmsnorm "
                "or drop qk_norm_scope"
            )
        if self.gelu_approximate not in ("none", "tanh"):
            raise ConfigError(f"gelu_approximate={self.gelu_approximate!r} must be 'none' or 'tanh'")


FLOAT_RANGES: dict[str, FloatRange] = {
    "dropout": FloatRange(0.0, 1.0, hint="the fraction of activations dropped"),
    "attn_dropout": FloatRange(0.0, 1.0, hint="null: = dropout"),
    "norm_eps": POSITIVE,
    "dyt_alpha": FloatRange(0.0, low_open=True, hint="the paper starts alpha at 0.5"),
    "attn_scale": FloatRange(0.0, low_open=True, hint="null: 1/sqrt(head_dim)"),
    "attn_softcap": FloatRange(0.0, low_open=True, hint="null: no cap"),
    "final_softcap": FloatRange(0.0, low_open=True, hint="null: no cap"),
    "logit_scale": POSITIVE,
    "embed_scale": POSITIVE,
    "rope_base": POSITIVE,
    "rope_base_global": FloatRange(0.0, low_open=True, hint="null: = rope_base"),
    "rope_scaling_factor": FloatRange(1.0, hint="the context extension; 1: none"),
    "init_std": POSITIVE,
    "moe_aux_loss_coef": FloatRange(0.0, hint="0 turns that loss off"),
    "moe_z_loss_coef": FloatRange(0.0, hint="0 turns that loss off"),
}
"""The range of every float field of ModelConfig, checked first by ``validate`` (tests/test_float_settings.py
walks the dataclass: a new float field needs its range here)."""


def _either(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


@functools.cache
def _defaults() -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(ModelConfig)}


def _divisors(n: int) -> list[int]:
    """Up to 12 divisors of ``n``, smallest first, for a message: those up to 4096 and their cofactors
    (a size of 10^12 read from a file is named in no time)."""
    small = [d for d in range(1, min(math.isqrt(n), 4096) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})[:12]


@functools.cache
def _field_types() -> dict[str, tuple[Any, ...]]:
    """Field name -> the types its annotation allows (``int | None`` -> (int, NoneType))."""
    hints = typing.get_type_hints(ModelConfig)
    return {f.name: typing.get_args(hints[f.name]) or (hints[f.name],) for f in dataclasses.fields(ModelConfig)}


def _typed(name: str, value: Any) -> Any:
    """``value`` if its type fits the field's annotation (an int for a float field becomes a float);
    otherwise a ConfigError naming the field, the value and the type wanted."""
    kinds = _field_types()[name]
    for kind in kinds:
        if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
            return _as_float(name, value)
        if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
            return value
    wanted = " or ".join(_WANTED.get(kind, getattr(kind, "__name__", str(kind))) for kind in kinds)
    found = _FOUND.get(type(value), f"a {type(value).__name__}")
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:59] + "…"
    raise ConfigError(f"{name}={shown} is {found}; {name} must be {wanted}")


def _as_float(name: str, value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:
        raise ConfigError(
            f"{name}: an integer of {value.bit_length()} bits is too large for a number; write a float such as 1e30"
        ) from None


_WANTED = {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "null"}
_FOUND = {
    int: "an integer",
    float: "a float",
    bool: "a bool",
    str: "a string",
    type(None): "null",
    list: "a list",
    dict: "a mapping",
}


def _check_fields(values: Mapping[str, Any]) -> None:
    names = [f.name for f in dataclasses.fields(ModelConfig)]
    for key in values:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{key!r} is not a ModelConfig field.{hint}")
