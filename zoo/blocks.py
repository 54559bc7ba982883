"""The transformer block and the stack of blocks shared by all three forms.

A block receives its sub-modules; the stack wires them from a config. The encoder, the decoder
and the encoder-decoder's two halves are all a :class:`Stack`; they differ only in their mask and
in whether blocks carry cross-attention.

Activation checkpointing (``activation_checkpointing`` in the config) trades compute for memory: a
checkpointed block keeps only its inputs in the forward pass and runs again in backward to rebuild
what its gradients need (Chen et al. 2016, https://arxiv.org/abs/1604.06174). See :class:`Stack`.

Notation: B batch, T new positions, P positions already in the cache, S source (memory) length,
D model width, H heads.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from zoo.attention import AttentionInputs, CrossAttention, SelfAttention, ValueResidual
from zoo.config import ModelConfig
from zoo.kernel_inputs import keep_mask, memory_inputs, self_attention_inputs
from zoo.kv_cache import Cache, LayerCaches
from zoo.mask import document_positions
from zoo.norm import Placement, build_norm
from zoo.position import Position
from zoo.registry import FFN, MASK, NORM_PLACEMENT, POSITION
from zoo.stack_role import StackRole
from zoo.sublayer import Sublayer


class Block(nn.Module):
    """Self-attention, optional cross-attention, then the FFN; each inside its residual placement."""

    def __init__(
        self,
        *,
        attn: SelfAttention,
        ffn: Sublayer,
        attn_res: Placement,
        ffn_res: Placement,
        cross_attn: CrossAttention | None = None,
        cross_res: Placement | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.attn, self.attn_res = attn, attn_res
        self.cross_attn, self.cross_res = cross_attn, cross_res
        self.ffn, self.ffn_res = ffn, ffn_res
        self.drop = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        inputs: AttentionInputs,
        *,
        cache: LayerCaches | None = None,
        memory: Tensor | None = None,
        memory_inputs: AttentionInputs | None = None,
    ) -> Tensor:
        """``cache``: this layer's (self-attention, cross-attention) caches (``Cache.layers``)."""
        drop = self.drop if self.training and self.drop.p else _unchanged  # eval: no call per sublayer
        self_cache, cross_cache = (None, None) if cache is None else cache
        x = self.attn_res(x, lambda h: drop(self.attn(h, inputs, cache=self_cache)))
        if self.cross_attn is not None:
            x = self.cross_res(x, lambda h: drop(self.cross_attn(h, memory_inputs, cache=cross_cache, memory=memory)))
        reads = isinstance(self.ffn, Sublayer) and self.ffn.reads_padding  # a plugin's FFN may be any Module
        ffn = (lambda h: self.ffn(h, keep=inputs.keep)) if reads else self.ffn
        return self.ffn_res(x, lambda h: drop(ffn(h)))

    def branches(self) -> list[tuple[Sublayer, Placement]]:
        """Each residual branch as (its sublayer, its placement), in forward order: what init asks
        (``Placement.init_gain``)."""
        pairs = [(self.attn, self.attn_res), (self.cross_attn, self.cross_res), (self.ffn, self.ffn_res)]
        return [(sublayer, placement) for sublayer, placement in pairs if sublayer is not None]


def _unchanged(x: Tensor) -> Tensor:
    return x


def build_block(cfg: ModelConfig, *, role: StackRole, index: int = 0) -> Block:
    """The block at depth ``index`` of its stack (value_residual: the first gives its values to the others)."""
    placement = NORM_PLACEMENT.get(cfg.norm_placement, field="norm_placement")
    attn = SelfAttention.from_config(cfg)
    if cfg.value_residual:
        attn.values_first = index == 0
        attn.value_residual = None if index == 0 else ValueResidual()
    return Block(
        attn=attn,
        attn_res=(placement.first_attention if index == 0 else placement.from_config)(cfg, role=role),
        cross_attn=CrossAttention.from_config(cfg) if role.cross else None,
        cross_res=placement.from_config(cfg, role=role) if role.cross else None,
        ffn=FFN.get(cfg.ffn, field="ffn").from_config(cfg),
        ffn_res=placement.from_config(cfg, role=role),
        dropout=cfg.dropout,
    )


@dataclasses.dataclass
class StackInputs:
    """What ``Stack.prepare`` computes once per forward for every block: the positions (for the
    position embedding), the self-attention inputs of the windowed or only layers (``local``) and of
    a ``window_pattern``'s global layers (``wide``, None without them), and the cross-attention
    inputs over the memory (``memory``, None without cross-attention)."""

    position_ids: Tensor
    local: AttentionInputs
    wide: AttentionInputs | None
    memory: AttentionInputs | None


class Stack(nn.Module):
    """Position encoding + blocks (+ the norms the placement asks for), over embedded inputs.

    ``checkpoint_every`` (from ``cfg.checkpoint_every``; assignable on a built stack): 0 never
    checkpoints, k > 0 recomputes blocks 0, k, 2k, ... in backward. Checkpointing uses
    ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``, which

    - restores the RNG state before recomputing (``preserve_rng_state``), so dropout draws the same
      masks and gradients equal those of the plain forward;
    - lets gradients reach tensors that are not positional arguments: the memory of
      cross-attention, and the mask or learned position bias carried inside ``AttentionInputs``;
    - works under DDP and FSDP: each parameter's gradient comes once from the ordinary autograd
      graph, so DDP's reducer needs neither ``static_graph`` nor ``find_unused_parameters`` (the
      reentrant variant does). The recompute calls the block module again, hooks included; with a
      block sharded as its own unit (``fully_shard(block)``) it runs within that block's backward,
      when FSDP has already gathered its parameters (its forward hook, seeing the pre-backward
      state, does not gather them twice).

    It is off while a KV cache is filled or read: a recompute would append the keys twice.
    """

    def __init__(self, cfg: ModelConfig, *, n_layers: int, mask: str, role: StackRole) -> None:
        super().__init__()
        self.mask = MASK.get(mask, field="mask").from_config(cfg, role=role)
        # a window_pattern's global layers (G) attend as the mask without its window
        self.global_mask = self.mask.widened() if self.mask.window_pattern else None
        self.global_layers = [self.global_mask is not None and not w for w in self.mask.windowed_layers(n_layers)]
        self.position: Position = POSITION.get(cfg.position, field="position").from_config(cfg, causal=self.mask.causal)
        placement = NORM_PLACEMENT.get(cfg.norm_placement, field="norm_placement")
        self.embed_norm = build_norm(cfg) if placement.normalises_embeddings(cfg) else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(build_block(cfg, role=role, index=i) for i in range(n_layers))
        self.final_norm = build_norm(cfg) if placement.final_norm else None
        self.checkpoint_every = cfg.checkpoint_every

    def forward(
        self,
        x: Tensor,
        *,
        padding_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        prefix_len: int | Tensor | None = None,
        cache: Cache | None = None,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> Tensor:
        """x: (B, T, D) embedded tokens. padding_mask: (B, P+T), 1 = token, 0 = padding.
        position_ids: (T,) or (B, T); default P..P+T-1, or each position's offset within its document
        when ``document_ids`` (B, T) is given (mask='document': packed rows, no KV cache).
        memory: (B, S, D), memory_mask: (B, S).

        It is ``prepare``, ``embedded``, ``run`` over every block, then ``finish``: a pipeline stage
        (zoo.pipeline) runs the same steps over its own blocks."""
        inputs = self.prepare(
            x,
            padding_mask=padding_mask,
            position_ids=position_ids,
            prefix_len=prefix_len,
            cache=cache,
            memory_mask=memory_mask,
            document_ids=document_ids,
        )
        x = self.embedded(x, inputs.position_ids)
        return self.finish(self.run(x, inputs, cache=cache, memory=memory))

    def prepare(
        self,
        x: Tensor,
        *,
        padding_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        prefix_len: int | Tensor | None = None,
        cache: Cache | None = None,
        memory_mask: Tensor | None = None,
        document_ids: Tensor | None = None,
        layers: range | None = None,
    ) -> StackInputs:
        """What every block of one forward reads (``forward``'s arguments; ``x`` gives the batch,
        length and device only): positions, masks or FlexMods, rotary angles. ``layers``: the blocks
        that will run (default all); the kernel they share decides the form of the mask."""
        B, T = x.shape[:2]
        static = cache is not None and cache.static  # keys: every slot of the cache, past a 0-d tensor
        past = 0 if cache is None else cache.offset
        end = cache.capacity if static else past + T  # positions a query may find among the keys
        if self.position.max_len is not None and end > self.position.max_len:
            raise ValueError(
                f"sequence of {end} positions exceeds max_seq_len={self.position.max_len} of the learned position table"
            )
        q_pos = torch.arange(T, device=x.device) + past  # (T,) absolute query positions
        if document_ids is not None and (static or past):
            raise ValueError("document_ids cannot be used with a filled KV cache: decode one document at a time")
        if position_ids is None:
            position_ids = q_pos if document_ids is None else document_positions(document_ids)  # (T,) or (B, T)
        blocks = list(self.blocks) if layers is None else [self.blocks[i] for i in layers]
        keep = keep_mask(padding_mask)  # (B, P+T) or (B, keys), or None

        def flex(dense: bool) -> bool:  # every block that runs reads FlexMods (Attention.reads_flex_mods)
            device, cached = x.device.type, cache is not None
            return bool(blocks) and all(b.attn.reads_flex_mods(device, cached=cached, dense=dense) for b in blocks)

        local, wide = (
            None
            if mask is None
            else self_attention_inputs(
                mask,
                self.position,
                q_pos,
                past,
                keep,
                prefix_len,
                document_ids,
                keys=end if static else None,
                flex=flex,
                batch=B,
            )
            for mask in (self.mask, self.global_mask if any(self.global_layers) else None)
        )
        assert local is not None  # a stack always has its own mask
        local.rotary = self.position.rotary(position_ids)
        local.keep = None if keep is None else keep[:, q_pos]  # (B, T) new positions
        if wide is not None:  # what layers carry (value_residual) is shared; rotary, unless set apart (ModernBERT)
            rotary = self.position.global_rotary(position_ids, local.rotary)
            wide = dataclasses.replace(wide, rotary=rotary, carried=local.carried, keep=local.keep)
        memory = memory_inputs(memory_mask) if blocks and blocks[0].cross_attn is not None else None
        return StackInputs(position_ids, local, wide, memory)

    def run(
        self,
        x: Tensor,
        inputs: StackInputs,
        *,
        layers: range | None = None,
        cache: Cache | None = None,
        memory: Tensor | None = None,
    ) -> Tensor:
        """The blocks in ``layers`` (default all) over x (B, T, D), each with its layer's inputs, KV
        cache and checkpointing policy."""
        every = self.checkpoint_every if self.checkpointing(cache) else 0
        layer_caches = [None] * len(self.blocks) if cache is None else cache.layers
        for i in range(len(self.blocks)) if layers is None else layers:
            block, layer_cache = self.blocks[i], layer_caches[i]
            attention = inputs.wide if self.global_layers[i] else inputs.local
            if every and i % every == 0:  # keep the block's inputs only; recompute it in backward
                x = checkpoint(
                    block,
                    x,
                    attention,
                    use_reentrant=False,
                    cache=None,
                    memory=memory,
                    memory_inputs=inputs.memory,
                )
            else:
                x = block(x, attention, cache=layer_cache, memory=memory, memory_inputs=inputs.memory)
        return x

    def finish(self, x: Tensor) -> Tensor:
        """The last block's output through the final norm, where the placement has one."""
        return x if self.final_norm is None else self.final_norm(x)

    def embedded(self, x: Tensor, position_ids: Tensor) -> Tensor:
        """Embedded tokens (B, T, D) with the position embedding added, normalised where the placement
        asks, and dropped out while training."""
        pe = self.position.embed(position_ids)
        if pe is not None:
            x = x + pe.to(x.dtype)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        return self.drop(x) if self.training and self.drop.p else x

    def checkpointing(self, cache: Cache | None = None) -> bool:
        """Whether this forward checkpoints blocks: a policy is set, the stack trains, autograd
        records, and no KV cache is in use (decoding never recomputes)."""
        return bool(self.checkpoint_every) and self.training and torch.is_grad_enabled() and cache is None

    def lookbacks(self) -> list[int | None]:
        """Each layer's ``Mask.lookback``: the past positions its KV cache keeps (None: all)."""
        return [None if wide else self.mask.lookback for wide in self.global_layers]
