"""The three architecture forms (``arch``), each a thin wrapper around the shared :class:`Stack`.

Each form's class also says what differs between the forms, as class attributes and classmethods
that code elsewhere asks (through ``cfg.form`` or ``type(model)``) instead of comparing ``arch``:
its natural self-attention mask, whether it has cross-attention, how it generates (``decoding``),
its inputs (``input_names``, ``example_inputs``), its attention maps, its head and cached layers
(for ``zoo.stats``) and the config rules of its own (``check``).

- ``encoder`` (BERT): token (+ segment) embeddings -> bidirectional stack -> hidden states;
  optional pooler and masked-LM head.
- ``decoder`` (GPT): token embeddings -> causal stack -> LM head (tied to the embeddings or not).
- ``encoder_decoder`` (T5): one shared embedding table; a bidirectional encoder; a causal decoder
  whose blocks add cross-attention over the encoder output (its K/V computed once per source).

What the forms share (weights' init, the KV cache, embeddings and head) is :class:`ZooModel`, in
zoo/zoo_model.py; it is importable from here too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.blocks import Stack
from zoo.config import ModelConfig
from zoo.kv_cache import Cache
from zoo.norm import build_norm
from zoo.registry import ARCH, MASK, ConfigError
from zoo.stack_role import StackRole
from zoo.zoo_model import PipelineCut, ZooModel, mup_width


@ARCH.register("encoder")
class EncoderModel(ZooModel):
    """BERT: hidden states of a bidirectional stack; it does not generate."""

    attention_kinds = ("encoder self",)
    reads = frozenset({"gelu_approximate"})  # MLMHead's GELU
    pipeline_cut = PipelineCut("encoder", first=("embed", "segment"), last=("pooler", "mlm_head"))

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        _refuse_split_depth(cfg)

    @classmethod
    def has_vocab_head(cls, cfg: ModelConfig) -> bool:
        return cfg.mlm_head

    @classmethod
    def ties_head(cls, cfg: ModelConfig) -> bool:
        return cfg.mlm_head  # the MLM head always reads the embedding

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.segment = nn.Embedding(cfg.type_vocab_size, cfg.d_model) if cfg.type_vocab_size else None
        self.encoder = Stack(cfg, n_layers=cfg.n_layers, mask=cfg.resolved_mask, role=StackRole())
        self.pooler = nn.Linear(cfg.d_model, cfg.d_model) if cfg.pooler else None
        self.mlm_head = MLMHead(cfg) if cfg.mlm_head else None

    def stacks(self) -> list[Stack]:
        return [self.encoder]

    def head_matrices(self) -> list[nn.Parameter]:
        """The pooler's and the MLM transform's (D, D) weights: hidden matrices under muP."""
        return [m.weight for m in (self.pooler, self.mlm_head and self.mlm_head.dense) if m is not None]

    def fold_logit_multiplier_(self, factor: float) -> None:
        """The MLM head's norm carries it (its output goes to the tied decoder alone)."""
        if self.mlm_head is not None:
            self.mlm_head.norm.scale_output_(factor)
            self.mlm_head.multiplier = 1.0

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        prefix_len: int | Tensor | None = None,
    ) -> Tensor:
        """input_ids: (B, T); attention_mask: (B, T), 1 = token, 0 = padding. Returns (B, T, D)."""
        x = self.embed_inputs(input_ids, token_type_ids)
        return self.encoder(x, padding_mask=attention_mask, prefix_len=prefix_len)

    def embed_inputs(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """Token embeddings plus segment embeddings (segment 0 without ``token_type_ids``)."""
        x = self.embed_tokens(input_ids)
        if self.segment is not None:
            x = x + self.segment(torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids)
        return x

    def pool(self, hidden: Tensor) -> Tensor:
        """BERT pooler: tanh(W h_0 + b) over the first token. (B, T, D) -> (B, D)."""
        if self.pooler is None:
            raise ConfigError("this encoder has no pooler; build it with pooler=True")
        return torch.tanh(self.pooler(hidden[:, 0]))

    def mlm_logits(self, hidden: Tensor) -> Tensor:
        """Masked-LM logits over the vocabulary. (B, T, D) -> (B, T, V)."""
        if self.mlm_head is None:
            raise ConfigError("this encoder has no masked-LM head; build it with mlm_head=True")
        return self.mlm_head(hidden, self.embed.weight)


class MLMHead(nn.Module):
    """BERT's masked-LM head: dense + GELU + norm, then the (tied) embedding matrix plus a bias."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.approximate = cfg.gelu_approximate
        self.norm = build_norm(cfg)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        width = mup_width(cfg)
        self.multiplier = 1.0 if width is None else 1.0 / width  # muP: the logits (before the bias) times 1/m

    def forward(self, hidden: Tensor, embedding: Tensor) -> Tensor:
        """(B, T, D) hidden states and the (V_padded, D) embedding -> (B, T, V) logits."""
        h = self.norm(F.gelu(self.dense(hidden), approximate=self.approximate))
        h = h * self.multiplier if self.multiplier != 1.0 else h
        vocab = self.bias.shape[0]
        if embedding.shape[0] == vocab:
            return F.linear(h, embedding, self.bias)
        return F.linear(h, embedding)[..., :vocab] + self.bias  # vocab_multiple_of: the padding rows cut off


@ARCH.register("decoder")
class DecoderModel(ZooModel):
    """GPT: next-token logits of a causal stack; generates by continuing a left-padded prompt."""

    natural_mask = "causal"
    decoding = "decoder"
    has_lm_head = True
    attention_kinds = ("decoder self",)
    pipeline_cut = PipelineCut("decoder", last=("lm_head",))

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        if MASK.get(cfg.resolved_mask, field="mask").bidirectional:
            raise ConfigError(
                f"mask={cfg.resolved_mask!r} lets a decoder see the tokens it must predict; use mask='causal' or "
                "'prefix', or arch='encoder' for a bidirectional model"
            )
        _refuse_encoder_heads(cfg)
        _refuse_split_depth(cfg)

    @classmethod
    def cached_layers(cls, cfg: ModelConfig) -> int:
        return cfg.n_layers

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.decoder = Stack(cfg, n_layers=cfg.n_layers, mask=cfg.resolved_mask, role=StackRole(causal=True))
        self.lm_head = None if cfg.tie_embeddings else self._lm_head()

    def features(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        *,
        position_ids: Tensor | None = None,
        prefix_len: int | Tensor | None = None,
        cache: Cache | None = None,
        document_ids: Tensor | None = None,
    ) -> Tensor:
        """Final hidden states (B, T, D). With a cache, attention_mask covers cached + new positions.
        document_ids: (B, T), which packed document each position belongs to (mask='document' keeps
        attention and positions inside it; other masks refuse them)."""
        return self.decoder(
            self.embed_tokens(input_ids),
            padding_mask=attention_mask,
            position_ids=position_ids,
            prefix_len=prefix_len,
            cache=cache,
            document_ids=document_ids,
        )

    def stacks(self) -> list[Stack]:
        return [self.decoder]

    @property
    def needs_prefix_len(self) -> bool:
        """Whether its mask reads where the prompt ends (``prefix``): decoding passes the prompt's length."""
        return self.decoder.mask.needs_prefix_len

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        *,
        position_ids: Tensor | None = None,
        prefix_len: int | Tensor | None = None,
        cache: Cache | None = None,
        document_ids: Tensor | None = None,
    ) -> Tensor:
        """input_ids: (B, T) -> next-token logits (B, T, V)."""
        return self.logits(
            self.features(
                input_ids,
                attention_mask,
                position_ids=position_ids,
                prefix_len=prefix_len,
                cache=cache,
                document_ids=document_ids,
            )
        )


@ARCH.register("encoder_decoder")
class EncoderDecoderModel(ZooModel):
    """T5: a source through a bidirectional encoder, a target through a causal decoder with
    cross-attention; generates a target from ``decoder_start_token_id``."""

    cross_attention = True
    decoding = "encoder_decoder"
    has_lm_head = True
    input_names = ("input_ids", "attention_mask", "decoder_input_ids")
    attention_kinds = ("encoder self", "decoder self", "cross")

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        if MASK.get(cfg.resolved_mask, field="mask").causal:
            raise ConfigError(
                "an encoder_decoder's encoder cannot be causal (mask sets the encoder's mask; the decoder "
                "is always causal): use mask='bidirectional' or 'prefix', or arch='decoder'"
            )
        _refuse_encoder_heads(cfg)

    @classmethod
    def attention_layers(cls, cfg: ModelConfig) -> int:
        return cfg.resolved_n_encoder_layers + 2 * cfg.resolved_n_decoder_layers

    @classmethod
    def cached_layers(cls, cfg: ModelConfig) -> int:
        return 2 * cfg.resolved_n_decoder_layers

    @classmethod
    def example_inputs(
        cls, cfg: ModelConfig, *, batch: int = 2, length: int = 16, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        """As for the other forms, plus a target (``decoder_input_ids``) 3 tokens shorter than the
        source (at least 1), so that the two lengths are separate axes."""
        generator = torch.Generator().manual_seed(0) if generator is None else generator
        inputs = super().example_inputs(cfg, batch=batch, length=length, generator=generator)
        target = max(1, length - 3)
        inputs["decoder_input_ids"] = torch.randint(5, cfg.vocab_size, (batch, target), generator=generator)
        return inputs

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        encoder, decoder = StackRole(paired=True), StackRole(causal=True, cross=True, paired=True)
        self.encoder = Stack(cfg, n_layers=cfg.resolved_n_encoder_layers, mask=cfg.resolved_mask, role=encoder)
        self.decoder = Stack(cfg, n_layers=cfg.resolved_n_decoder_layers, mask="causal", role=decoder)
        self.lm_head = None if cfg.tie_embeddings else self._lm_head()

    def encode(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, *, prefix_len: int | Tensor | None = None
    ) -> Tensor:
        """Source (B, S) -> memory (B, S, D)."""
        return self.encoder(self.embed_tokens(input_ids), padding_mask=attention_mask, prefix_len=prefix_len)

    def decoder_features(
        self,
        decoder_input_ids: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None = None,
        *,
        decoder_attention_mask: Tensor | None = None,
        cache: Cache | None = None,
    ) -> Tensor:
        """Target prefix (B, T) and memory (B, S, D) -> final decoder hidden states (B, T, D)."""
        return self.decoder(
            self.embed_tokens(decoder_input_ids),
            padding_mask=decoder_attention_mask,
            cache=cache,
            memory=memory,
            memory_mask=memory_mask,
        )

    def decode(
        self,
        decoder_input_ids: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None = None,
        *,
        decoder_attention_mask: Tensor | None = None,
        cache: Cache | None = None,
    ) -> Tensor:
        """Target prefix (B, T) and memory (B, S, D) -> next-token logits (B, T, V)."""
        return self.logits(
            self.decoder_features(
                decoder_input_ids, memory, memory_mask, decoder_attention_mask=decoder_attention_mask, cache=cache
            )
        )

    def stacks(self) -> list[Stack]:
        return [self.encoder, self.decoder]

    def forward(
        self,
        input_ids: Tensor,
        decoder_input_ids: Tensor,
        attention_mask: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
    ) -> Tensor:
        """Teacher forcing: source (B, S), target prefix (B, T) -> logits (B, T, V)."""
        memory = self.encode(input_ids, attention_mask)
        return self.decode(decoder_input_ids, memory, attention_mask, decoder_attention_mask=decoder_attention_mask)


def _refuse_encoder_heads(cfg: ModelConfig) -> None:
    for name in ("pooler", "mlm_head"):
        if getattr(cfg, name):
            raise ConfigError(f"{name}=True is an encoder head; set arch='encoder' or {name}=False")
    if cfg.type_vocab_size:
        raise ConfigError("type_vocab_size (segment embeddings) is for arch='encoder'; set it to 0")


def _refuse_split_depth(cfg: ModelConfig) -> None:
    if cfg.n_encoder_layers is not None or cfg.n_decoder_layers is not None:
        raise ConfigError("n_encoder_layers/n_decoder_layers are for arch='encoder_decoder'; use n_layers")


def build_model(cfg: ModelConfig, *, seed: int | None = None) -> ZooModel:
    """Validate ``cfg`` and build its model on the current default device, initialised.

    With ``seed`` the initial weights are deterministic and the global RNG is left untouched.
    Under ``with torch.device("meta")`` nothing is allocated (for counting or sharded loading) and
    nothing is initialised: meta tensors hold no values.
    """
    cfg.validate()
    cls = cfg.form
    if torch.get_default_device().type == "meta":
        with _random_init_skipped():
            return cls(cfg)
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        model = cls(cfg)
        model.init_weights()
    return model


RANDOM_INITS = (
    *("normal_", "uniform_", "trunc_normal_", "orthogonal_"),
    *("kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_"),
)


@contextmanager
def _random_init_skipped() -> Iterator[None]:
    """torch.nn.init's random fills as no-ops while modules are built on the meta device: they would
    write nothing there, and the first one imports torch's compiler (a second, for zoo-info)."""
    saved = {name: getattr(nn.init, name) for name in RANDOM_INITS}
    try:
        for name in RANDOM_INITS:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fill in saved.items():
            setattr(nn.init, name, fill)


def count_parameters(model: nn.Module, *, trainable_only: bool = False, excluding: Iterable[Tensor] = ()) -> int:
    """Number of distinct parameters (a tied embedding counts once); works on the meta device. A zoo
    model's vocabulary tables count their true rows (``vocab_size``), not the padding
    (``vocab_multiple_of``), which holds nothing trained: gpt2's count is the published one either way.
    ``excluding``: parameters left uncounted (a pipeline stage's copies of another stage's)."""
    tables = model.vocab_tables() if isinstance(model, ZooModel) else {}
    true_rows = {id(t): model.config.vocab_size for t in tables.values()}
    left_out = {id(p) for p in excluding}
    return sum(
        p.numel() // p.shape[0] * true_rows[id(p)] if id(p) in true_rows else p.numel()
        for p in model.parameters()
        if (p.requires_grad or not trainable_only) and id(p) not in left_out
    )
