"""What a form declares about itself, as protocols: the class-level facts config.py, the checks and the
tasks ask of ``cfg.form`` (:class:`Form`), and what decoding asks of a model that generates
(:class:`ContinuesPrompts`, :class:`TranslatesSources`), without importing the model classes.

The registered forms (zoo.models: ``encoder``, ``decoder``, ``encoder_decoder``) subclass
:class:`zoo.zoo_model.ZooModel`, which gives every fact a default; this protocol is the part of them
the layers below the models may read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from torch import Tensor

    from zoo.config import ModelConfig
    from zoo.kv_cache import Cache


class Form(Protocol):
    """A registered form (``ModelConfig.form``): its class-level facts and rules."""

    natural_mask: ClassVar[str]  # the main stack's self-attention mask when cfg.mask is None
    cross_attention: ClassVar[bool]  # reads a source and a target
    decoding: ClassVar[str | None]  # how it generates: a name in zoo.decoding.DECODINGS; None: it does not
    input_names: ClassVar[tuple[str, ...]]  # forward's inputs, by keyword
    attention_kinds: ClassVar[tuple[str, ...]]  # the attention maps zoo.capture_attention finds
    reads: ClassVar[frozenset[str]]  # the component settings it reads

    @classmethod
    def check(cls, cfg: ModelConfig) -> None: ...

    @classmethod
    def has_vocab_head(cls, cfg: ModelConfig) -> bool: ...

    @classmethod
    def ties_head(cls, cfg: ModelConfig) -> bool: ...

    @classmethod
    def attention_layers(cls, cfg: ModelConfig) -> int: ...

    @classmethod
    def cached_layers(cls, cfg: ModelConfig) -> int: ...


class Generates(Protocol):
    """What every decoding loop (zoo.decoding) asks of the model it decodes with."""

    config: ModelConfig

    @property
    def max_positions(self) -> int | None: ...

    def logits(self, hidden: Tensor) -> Tensor: ...

    def new_cache(self, capacity: int = 256, *, static: bool = False, kv_dtype: str | None = "model") -> Cache: ...


class ContinuesPrompts(Generates, Protocol):
    """A form that generates by continuing a prompt (``decoding = "decoder"``)."""

    @property
    def needs_prefix_len(self) -> bool: ...  # its mask reads where the prompt ends (prefix LM)

    def features(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        *,
        position_ids: Tensor | None = None,
        prefix_len: int | Tensor | None = None,
        cache: Cache | None = None,
        document_ids: Tensor | None = None,
    ) -> Tensor: ...


class TranslatesSources(Generates, Protocol):
    """A form that encodes a source once and decodes a target (``decoding = "encoder_decoder"``)."""

    def encode(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, *, prefix_len: int | Tensor | None = None
    ) -> Tensor: ...

    def decoder_features(
        self,
        decoder_input_ids: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None = None,
        *,
        decoder_attention_mask: Tensor | None = None,
        cache: Cache | None = None,
    ) -> Tensor: ...
