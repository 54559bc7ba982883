"""The three architecture forms (``arch``), each a thin wrapper around the shared :class:`Stack`.

- ``encoder`` (BERT): token (+ segment) embeddings -> bidirectional stack -> hidden states;
  optional pooler and masked-LM head.
- ``decoder`` (GPT): token embeddings -> causal stack -> LM head (tied to the embeddings or not).
- ``encoder_decoder`` (T5): one shared embedding table; a bidirectional encoder; a causal decoder
  whose blocks add cross-attention over the encoder output (its K/V computed once per source).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.attention import Attention
from zoo.blocks import Stack
from zoo.config import ModelConfig
from zoo.generation import GenerationMixin
from zoo.kv_cache import Cache
from zoo.norm import build_norm
from zoo.registry import ARCH, ConfigError


class ZooModel(GenerationMixin, nn.Module):
    """Shared pieces: the token embedding, weight init, caches and generation."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)

    def stacks(self) -> list[Stack]:
        return [m for m in self.children() if isinstance(m, Stack)]

    @torch.no_grad()
    def init_weights(self) -> None:
        """Normal(0, init_std) for matrices and embeddings, zero biases, unit norms; the output
        projection of every residual branch scaled by 1/sqrt(2 * layers) (GPT-2, Radford et al. 2019)."""
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=std)
            elif hasattr(module, "reset_parameters") and not list(module.children()):
                module.reset_parameters()  # norms
        n_layers = sum(len(s.blocks) for s in self.stacks())
        for attn in (m for m in self.modules() if isinstance(m, Attention)):
            # without the 1/sqrt(head_dim) score scale (T5), fold it into q's init instead (Raffel et al.)
            q = attn.q.weight if attn.cross else attn.qkv.weight[: attn.n_heads * attn.head_dim]
            q.mul_(attn.head_dim**-0.5 / attn.scale)
        for stack in self.stacks():
            for block in stack.blocks:
                for branch, name in ((block.attn, "out"), (block.cross_attn, "out"), (block.ffn, "proj")):
                    proj = getattr(branch, name, None)  # a user's component may have no such layer
                    if isinstance(proj, nn.Linear):
                        nn.init.normal_(proj.weight, std=std / math.sqrt(2 * n_layers))

    def new_cache(self, capacity: int = 256) -> Cache:
        """An empty KV cache for this model's decoder, to pass as ``cache=`` to forward/decode."""
        decoder = self.stacks()[-1]
        return Cache(len(decoder.blocks), cross=self.config.arch == "encoder_decoder", capacity=capacity)

    def embed_tokens(self, input_ids: Tensor) -> Tensor:
        """(B, T) token ids -> (B, T, D) embeddings, times ``embed_scale``. With sinusoidal
        positions (unit amplitude) and small initial embeddings, sqrt(d_model) keeps the tokens
        from being swamped by their positions (Vaswani et al. 2017, sec. 3.4)."""
        x = self.embed(input_ids)
        return x * self.config.embed_scale if self.config.embed_scale != 1.0 else x

    def _lm_head(self) -> nn.Module:
        return nn.Linear(self.config.d_model, self.config.vocab_size, bias=False)

    def logits(self, hidden: Tensor) -> Tensor:
        """(B, T, D) final hidden states -> (B, T, V) next-token logits."""
        hidden = hidden * self.config.logit_scale if self.config.logit_scale != 1.0 else hidden
        if self.lm_head is None:
            return F.linear(hidden, self.embed.weight)
        return self.lm_head(hidden)


@ARCH.register("encoder")
class EncoderModel(ZooModel):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.segment = nn.Embedding(cfg.type_vocab_size, cfg.d_model) if cfg.type_vocab_size else None
        self.encoder = Stack(cfg, n_layers=cfg.n_layers, mask=cfg.self_mask)
        self.pooler = nn.Linear(cfg.d_model, cfg.d_model) if cfg.pooler else None
        self.mlm_head = MLMHead(cfg) if cfg.mlm_head else None

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, *, prefix_len: int | Tensor | None = None) -> Tensor:
        """input_ids: (B, T); attention_mask: (B, T), 1 = token, 0 = padding. Returns (B, T, D)."""
        x = self.embed_tokens(input_ids)
        if self.segment is not None:
            x = x + self.segment(torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids)
        return self.encoder(x, padding_mask=attention_mask, prefix_len=prefix_len)

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

    def forward(self, hidden: Tensor, embedding: Tensor) -> Tensor:
        h = self.norm(F.gelu(self.dense(hidden), approximate=self.approximate))
        return F.linear(h, embedding, self.bias)


@ARCH.register("decoder")
class DecoderModel(ZooModel):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.decoder = Stack(cfg, n_layers=cfg.n_layers, mask=cfg.self_mask)
        self.lm_head = None if cfg.tie_embeddings else self._lm_head()

    def features(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                 position_ids: Tensor | None = None, prefix_len: int | Tensor | None = None,
                 cache: Cache | None = None) -> Tensor:
        """Final hidden states (B, T, D). With a cache, attention_mask covers cached + new positions."""
        return self.decoder(self.embed_tokens(input_ids), padding_mask=attention_mask, position_ids=position_ids,
                            prefix_len=prefix_len, cache=cache)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                position_ids: Tensor | None = None, prefix_len: int | Tensor | None = None,
                cache: Cache | None = None) -> Tensor:
        """input_ids: (B, T) -> next-token logits (B, T, V)."""
        return self.logits(self.features(input_ids, attention_mask, position_ids=position_ids,
                                         prefix_len=prefix_len, cache=cache))


@ARCH.register("encoder_decoder")
class EncoderDecoderModel(ZooModel):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.encoder = Stack(cfg, n_layers=cfg.encoder_layers, mask=cfg.self_mask)
        self.decoder = Stack(cfg, n_layers=cfg.decoder_layers, mask="causal", cross=True)
        self.lm_head = None if cfg.tie_embeddings else self._lm_head()

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
               prefix_len: int | Tensor | None = None) -> Tensor:
        """Source (B, S) -> memory (B, S, D)."""
        return self.encoder(self.embed_tokens(input_ids), padding_mask=attention_mask, prefix_len=prefix_len)

    def decoder_features(self, decoder_input_ids: Tensor, memory: Tensor, memory_mask: Tensor | None = None, *,
                         decoder_attention_mask: Tensor | None = None, cache: Cache | None = None) -> Tensor:
        """Target prefix (B, T) and memory (B, S, D) -> final decoder hidden states (B, T, D)."""
        return self.decoder(self.embed_tokens(decoder_input_ids), padding_mask=decoder_attention_mask, cache=cache,
                            memory=memory, memory_mask=memory_mask)

    def decode(self, decoder_input_ids: Tensor, memory: Tensor, memory_mask: Tensor | None = None, *,
               decoder_attention_mask: Tensor | None = None, cache: Cache | None = None) -> Tensor:
        """Target prefix (B, T) and memory (B, S, D) -> next-token logits (B, T, V)."""
        return self.logits(self.decoder_features(decoder_input_ids, memory, memory_mask,
                                                 decoder_attention_mask=decoder_attention_mask, cache=cache))

    def forward(self, input_ids: Tensor, decoder_input_ids: Tensor, attention_mask: Tensor | None = None,
                decoder_attention_mask: Tensor | None = None) -> Tensor:
        """Teacher forcing: source (B, S), target prefix (B, T) -> logits (B, T, V)."""
        memory = self.encode(input_ids, attention_mask)
        return self.decode(decoder_input_ids, memory, attention_mask, decoder_attention_mask=decoder_attention_mask)


def build_model(cfg: ModelConfig, *, seed: int | None = None) -> ZooModel:
    """Validate ``cfg`` and build its model on the current default device, initialised.

    With ``seed`` the initial weights are deterministic and the global RNG is left untouched.
    Under ``with torch.device("meta")`` nothing is allocated (for counting or sharded loading) and
    nothing is initialised: meta tensors hold no values.
    """
    cfg.validate()
    cls = ARCH.get(cfg.arch, field="arch")
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        model = cls(cfg)
        if not model.embed.weight.is_meta:
            model.init_weights()
    return model


def count_parameters(model: nn.Module, *, trainable_only: bool = False) -> int:
    """Number of distinct parameters (a tied embedding counts once); works on the meta device."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
