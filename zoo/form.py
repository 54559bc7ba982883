"""What a form declares about itself, as a protocol: the facts config.py, the checks, decoding and the
tasks ask of ``cfg.form`` without importing the model classes.

The registered forms (zoo.models: ``encoder``, ``decoder``, ``encoder_decoder``) subclass
:class:`zoo.zoo_model.ZooModel`, which gives every fact a default; this protocol is the part of them
the layers below the models may read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from zoo.config import ModelConfig


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
