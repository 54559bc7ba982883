"""What every architecture form shares (:class:`ZooModel`): its config, its stacks, the weight
initialisation, the KV cache it makes, the token embeddings and the LM head. The forms themselves, and
what differs between them, are in zoo/models.py.

muP (``mup_base_d_model``; Yang et al. 2022, "Tensor Programs V", https://arxiv.org/abs/2203.03466):
a model of width d_model = m * base is initialised and trained so that every layer's activations move
by the same amount per step at every width, and the learning rate tuned at the base width carries
over. zoo follows the paper's table 8 form (a multiplier on the output, the head's weights Adam-trained
at the base rate), so that a tied head, which is the embedding, needs no rule of its own. At m = 1 a
muP model is the standard one, weight for weight. Each choice and the rule it follows:

==========================================  ==========================  ===================================
parameter or quantity                       init                        Adam lr (Muon: tasks/optim.py)
==========================================  ==========================  ===================================
token, position and segment embeddings      init_std                    lr (input weights: fan-in fixed)
hidden matrices: q/k/v/out, cross q/kv,     init_std * m^-1/2 (var ∝    lr / m (hidden: Adam's update is
FFN fc/proj, GLU gate/up, MoE experts and   1/fan_in), residual         rank-one-like, it moves h by
shared expert, pooler, MLM dense            outputs also / sqrt(2L)     fan_in * lr)
MoE router (E x D, E fixed)                 init_std / m (var ∝         lr / m (table 3's output rule, no
                                            1/fan_in^2)                 multiplier: nothing to export)
LM head (untied) / tied embedding           init_std                    lr; logits times 1/m (table 8)
biases, norm gains, DyT alpha,              as without muP              lr (vectors: no width dimension)
value_residual lambda, qk_norm gains
attention scores                            scale sqrt(hd_base)/hd when the head grows with the
                                            width (head_dim null): 1/hd asymptotically (sec. 4); with
                                            head_dim set the heads multiply and 1/sqrt(hd) stays
==========================================  ==========================  ===================================

m = d_model / mup_base_d_model; every width (heads x hd, d_ff) is taken to grow with d_model.
Positions (rope, alibi, t5_relative, sinusoidal, learned) read no width: their rules are the
embeddings' or none. What the optimizer does with the roles, ``tasks.optim`` says; task heads outside
the model (a classifier's) are trained at lr. Exports fold the two multipliers (logits, attention
scores) into weights (:meth:`ZooModel.without_mup`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.attention import Attention
from zoo.blocks import Stack
from zoo.config import ModelConfig
from zoo.kv_cache import Cache, check_kv_dtype
from zoo.norm import Norm, Placement
from zoo.position import position_limit
from zoo.registry import ARCH, ATTENTION, Component, ConfigError
from zoo.sublayer import Sublayer

if TYPE_CHECKING:
    from zoo.adapters import AdapterConfig


@dataclass(frozen=True)
class PipelineCut:
    """How a form is cut into pipeline stages (zoo.pipeline), declared in one record: ``stack``, the child
    whose blocks the stages share out; ``first``, the children only the first stage holds (the
    embeddings); ``last``, those only the last stage holds (the heads). A stage drops the others'."""

    stack: str
    first: tuple[str, ...] = ("embed",)
    last: tuple[str, ...] = ()

    def of(self, model: ZooModel) -> Stack:
        """The stack of ``model`` that this cut shares out."""
        stack = model.get_submodule(self.stack)
        assert any(stack is s for s in model.stacks()), f"{type(model).__name__}.{self.stack} is not one of its stacks"
        return stack


class ZooModel(Component, nn.Module):
    """Shared pieces: the token embedding, weight init, caches and the door to generation; and the
    defaults of what a form declares about itself (each registered form sets its own)."""

    natural_mask: ClassVar[str] = "bidirectional"  # the main stack's self-attention mask when cfg.mask is None
    cross_attention: ClassVar[bool] = False  # reads a source and a target: decoder blocks attend over the encoder
    decoding: ClassVar[str | None] = None  # how generate() decodes: a zoo.decoding.DECODINGS name; None: it cannot
    input_names: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask")  # forward's inputs, by keyword
    attention_kinds: ClassVar[tuple[str, ...]] = ()  # the maps zoo.capture_attention finds (zoo.inspect.KINDS)
    reads: ClassVar[frozenset[str]] = frozenset()  # the component settings it reads (zoo.registry.reads)
    pipeline_cut: ClassVar[PipelineCut | None] = None  # how trainer=pp cuts it (zoo.pipeline); None: it is not cut
    has_lm_head: ClassVar[bool] = False  # its logits are ``lm_head``'s, or the tied embedding's where that is None

    lm_head: nn.Module | None  # set by the forms that have one (has_lm_head)
    adapter_config: AdapterConfig | None = None  # the adapter zoo.adapters.apply put in; merge clears it
    quantized_weights: str | None = None  # the weight precision zoo.quantize gave it

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Raise ConfigError for a setting this form cannot use (ModelConfig.validate calls it)."""

    @classmethod
    def has_vocab_head(cls, cfg: ModelConfig) -> bool:
        """Whether the output is multiplied by a (d_model, vocab) matrix: logits over the vocabulary."""
        return True

    @classmethod
    def ties_head(cls, cfg: ModelConfig) -> bool:
        """Whether the vocabulary head multiplies by the token embedding (a matmul, no weight of its own)."""
        return cls.has_vocab_head(cfg) and cfg.tie_embeddings

    @classmethod
    def attention_layers(cls, cfg: ModelConfig) -> int:
        """Attention layers per forward pass (self and cross), for counting FLOPs."""
        return cfg.n_layers

    @classmethod
    def cached_layers(cls, cfg: ModelConfig) -> int:
        """Attention layers whose keys and values a KV cache holds while generating."""
        return 0

    @classmethod
    def example_inputs(
        cls, cfg: ModelConfig, *, batch: int = 2, length: int = 16, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        """Inputs to trace or test a model of ``cfg`` with, by ``input_names``: random token ids
        (>= 5, clear of the special tokens) and an attention mask that pads the second half of the
        first row. ``generator`` defaults to one seeded with 0."""
        generator = torch.Generator().manual_seed(0) if generator is None else generator
        inputs = {
            "input_ids": torch.randint(5, cfg.vocab_size, (batch, length), generator=generator),
            "attention_mask": torch.ones(batch, length, dtype=torch.long),
        }
        inputs["attention_mask"][0, length // 2 :] = 0  # exercise padding
        return inputs

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.padded_vocab_size, cfg.d_model)  # rows from vocab_size on: padding
        self._kv_dtype: str | None = None  # see kv_dtype
        self.register_load_state_dict_pre_hook(_pad_vocab_rows)

    @property
    def kv_dtype(self) -> str | None:
        """How keys and values are kept: None (their own dtype) or "int8" (zoo.kv_cache). New KV caches
        store them so, and attention without a cache rounds them the same way, so a forward pass
        computes what cached decoding does. ``zoo.quantize(model, kv_cache="int8")`` sets it
        (``set_kv_dtype``; assigning the property does the same)."""
        return self._kv_dtype

    @kv_dtype.setter
    def kv_dtype(self, kv_dtype: str | None) -> None:
        self.set_kv_dtype(kv_dtype)

    def set_kv_dtype(self, kv_dtype: str | None) -> None:
        """Keep keys and values as ``kv_dtype`` says (a ``KV_FORMATS`` name, or None: their own dtype)
        from now on, in every attention layer at once; a name that is no format is refused first."""
        check_kv_dtype(kv_dtype)
        self._kv_dtype = kv_dtype
        for layer in self._attention().values():
            layer.kv_dtype = kv_dtype

    def set_attention_kernel(self, kernel: str | Mapping[str, str]) -> dict[str, str]:
        """Run every attention layer on ``kernel`` (an ``ATTENTION`` name: ``math`` for explicit
        matmuls an exporter or a probe reads), or each layer on its own kernel (a mapping by module
        name, as this returns). Returns the kernels the layers had, by module name, so that passing it
        back restores them. The config's ``attention`` is unchanged: a copy built from it runs on its
        own kernel. A name that is no kernel is refused before any layer changes."""
        layers = self._attention()
        wanted = {name: kernel if isinstance(kernel, str) else kernel[name] for name in layers}
        for name in set(wanted.values()):
            ATTENTION.get(name, field="attention")
        before = {name: layer.kernel for name, layer in layers.items()}
        for name, layer in layers.items():
            layer.kernel = wanted[name]
        return before

    def _attention(self) -> dict[str, Attention]:
        """Its attention layers (self and cross) by module name: what the settings above reach."""
        return {name: m for name, m in self.named_modules() if isinstance(m, Attention)}

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model's position encodings can number (a learned table ends at
        its ``max_len``); None when they are unbounded."""
        return position_limit(self.config)

    def generate(self, input_ids: Any, max_new_tokens: int = 20, **settings: Any) -> Tensor:
        """Continue ``input_ids`` by up to ``max_new_tokens`` tokens: :func:`zoo.generation.generate`, whose
        docstring has the settings (sampling, beams, penalties, caching) and the limits. Generation's
        modules (prompts, sampling, beam search) are imported on the first call, not with the model."""
        from zoo.generation import generate

        return generate(self, input_ids, max_new_tokens, **settings)

    def stacks(self) -> list[Stack]:
        """Its stacks, input side first (each form declares its own)."""
        raise NotImplementedError(f"{type(self).__name__} declares no stacks(); a form lists its Stack children")

    def branches(self) -> list[tuple[Sublayer, Placement]]:
        """Every block's residual branches (``Block.branches``), stack by stack: what init and Muon ask."""
        return [pair for stack in self.stacks() for block in stack.blocks for pair in block.branches()]

    @torch.no_grad()
    def init_weights(self) -> None:
        """Normal(0, init_std) for matrices and embeddings, zero biases, unit norms; then each residual
        branch as its placement says (``Placement.init_gain``): by default its output projections drawn
        with std init_std/sqrt(2 * layers) (GPT-2, Radford et al. 2019); with a gain, its value weights
        (``Sublayer.value_weights``) multiplied by it (DeepNorm's beta)."""
        std = self.config.init_std
        width = mup_width(self.config)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=std)
            elif hasattr(module, "reset_parameters") and not list(module.children()):
                module.reset_parameters()  # norms
        for table in self.vocab_tables().values():
            table[self.config.vocab_size :].zero_()  # the padding rows (vocab_multiple_of): read by nothing, zero
        n_layers = sum(len(s.blocks) for s in self.stacks())
        for attn in self._attention().values():
            # without the 1/sqrt(head_dim) score scale (T5), fold it into q's init instead (Raffel et al.)
            attn.query_weight().mul_(attn.head_dim**-0.5 * attn.width_scale / attn.scale)
        for sublayer, placement in self.branches():
            if not isinstance(sublayer, Sublayer):  # a user's component need not declare its weights: left as drawn
                continue
            gain = placement.init_gain()
            if gain is None:  # each sublayer declares its residual outputs
                for proj in sublayer.residual_projections():
                    nn.init.normal_(proj.weight, std=std / math.sqrt(2 * n_layers))
            else:
                for weight in sublayer.value_weights():
                    weight.mul_(gain)
        if width is not None:  # muP: var ∝ 1/fan_in for hidden matrices, 1/fan_in^2 for readouts (table 3)
            for role, power in (("hidden", -0.5), ("readout", -1.0)):
                for weight in self.mup_groups()[role]:
                    weight.mul_(width**power)

    def mup_groups(self) -> dict[str, list[nn.Parameter]]:
        """muP's parameters by role, each once: ``hidden`` (both dimensions grow with the width) and
        ``readout`` (the input grows, the output is fixed: an MoE router), as each sublayer declares
        (``Sublayer.mup_matrices``) plus the form's own hidden matrices (``head_matrices``). Parameters
        in no role (embeddings, the LM head, vectors) keep the base learning rate. Empty without muP.
        ``tasks.optim.build_optimizer`` gives each role its learning rate."""
        if self.config.mup_base_d_model is None:
            return {}
        groups: dict[str, dict[int, nn.Parameter]] = {"hidden": {}, "readout": {}}
        for sublayer, _ in self.branches():
            if isinstance(sublayer, Sublayer):  # a user's plain Module declares none: trained at lr
                for role, params in sublayer.mup_matrices().items():
                    groups[role].update((id(p), p) for p in params)
        groups["hidden"].update((id(p), p) for p in self.head_matrices())
        return {role: list(params.values()) for role, params in groups.items()}

    @property
    def mup_width(self) -> float | None:
        """muP's width multiplier m = d_model / mup_base_d_model; None without muP."""
        return mup_width(self.config)

    def head_matrices(self) -> list[nn.Parameter]:
        """The form's hidden matrices outside the blocks (an encoder's pooler and MLM transform); none here."""
        return []

    def without_mup(self) -> ZooModel:
        """This model as a standard-parametrization one that computes the same outputs: a copy whose
        logit multiplier sits in the head (an untied head's weight, or the final norm before a tied
        one) and whose attention factor sits in the queries, with ``mup_base_d_model`` None. What an
        export writes (other runtimes know no multipliers); this model itself when it is not muP.

        Raises:
            ConfigError: a tied head with no norm before it to carry the logit multiplier."""
        width = self.mup_width
        if width is None:
            return self
        model = copy.deepcopy(self)
        with torch.no_grad():
            model.fold_logit_multiplier_(1.0 / width)
            for attn in model._attention().values():
                attn.fold_width_scale()
        model.config = self.config.replace(mup_base_d_model=None)
        return model

    def fold_logit_multiplier_(self, factor: float) -> None:
        """Multiply the logits by ``factor`` through the weights: an untied head's, or the final norm's
        that feeds a tied head (its output goes to the head alone)."""
        if self.lm_head is not None:
            self.lm_head.weight.mul_(factor)
            return
        norm = self.stacks()[-1].final_norm
        if not isinstance(norm, Norm):
            raise ConfigError(
                f"this muP model's head is tied to the embedding and norm_placement={self.config.norm_placement} "
                "has no final norm to carry the logit multiplier; export with format=safetensors, or train with "
                "tie_embeddings=false"
            )
        norm.scale_output_(factor)

    def new_cache(self, capacity: int = 256, *, static: bool = False, kv_dtype: str | None = "model") -> Cache:
        """An empty KV cache for this model's decoder, to pass as ``cache=`` to forward/decode; it keeps
        only as many past positions as the decoder's mask lets a query see (``Mask.lookback``).
        ``static``: all ``capacity`` positions allocated at the first write, the shapes a compiled
        decoding step needs; ``kv_dtype``: "int8" or None (the keys' own dtype), by default the
        model's ``kv_dtype`` (zoo.kv_cache)."""
        decoder = self.stacks()[-1]
        return Cache(
            len(decoder.blocks),
            cross=self.cross_attention,
            capacity=capacity,
            keep=decoder.lookbacks(),
            static=static,
            kv_dtype=self.kv_dtype if kv_dtype == "model" else kv_dtype,
        )

    def embed_tokens(self, input_ids: Tensor) -> Tensor:
        """(B, T) token ids -> (B, T, D) embeddings, times ``embed_scale``. With sinusoidal
        positions (unit amplitude) and small initial embeddings, sqrt(d_model) keeps the tokens
        from being swamped by their positions (Vaswani et al. 2017, sec. 3.4)."""
        x = self.embed(input_ids)
        return x * self.config.embed_scale if self.config.embed_scale != 1.0 else x

    def embed_inputs(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """(B, T) token ids -> (B, T, D): what the main stack reads before its positions are added.
        Forms with segment embeddings add them from ``token_type_ids``; others take none."""
        if token_type_ids is not None:
            raise ConfigError(f"arch={self.config.arch!r} has no segment embeddings: pass no token_type_ids")
        return self.embed_tokens(input_ids)

    def _lm_head(self) -> nn.Module:
        return nn.Linear(self.config.d_model, self.config.padded_vocab_size, bias=False)

    def vocab_tables(self) -> dict[str, Tensor]:
        """The weights whose rows are the vocabulary, ``padded_vocab_size`` of them, by ``state_dict`` name:
        the token embedding and an untied LM head (a pipeline stage's, where it holds them)."""
        tables = {} if self.embed is None else {"embed.weight": self.embed.weight}
        head = self.lm_head if self.has_lm_head else None
        if head is not None and isinstance(getattr(head, "weight", None), Tensor):
            tables["lm_head.weight"] = head.weight
        return tables

    def fit_vocab_rows(self, state_dict: dict[str, Any], stored_rows: int, prefix: str = "") -> None:
        """Fit, in place, the vocabulary tables of ``state_dict`` (this model's vocabulary, stored with
        ``stored_rows`` rows: unpadded, or padded to another ``vocab_multiple_of``) to this model's rows: the
        true rows kept, the padding zero. A table of any other shape is left for ``load_state_dict`` to refuse."""
        for name, own in self.vocab_tables().items():
            theirs = state_dict.get(prefix + name)
            if (
                isinstance(theirs, Tensor)
                and stored_rows != own.shape[0]
                and theirs.shape == (stored_rows, *own.shape[1:])
            ):
                state_dict[prefix + name] = fit_rows(theirs, own.shape[0], self.config.vocab_size)

    def with_vocab_multiple(self, multiple: int | None) -> ZooModel:
        """This model with its vocabulary rows padded to ``multiple`` (``vocab_multiple_of``; None or 1: the
        true vocabulary alone, as every export writes it): a copy that computes the same logits, the new
        padding rows zero; this model itself where the rows already number that many.

        ``zoo.from_hf(folder).with_vocab_multiple(128)`` pads a pretrained GPT-2 as the gpt2 preset is."""
        cfg = self.config.replace(vocab_multiple_of=multiple)
        cfg.validate()
        rows = cfg.padded_vocab_size
        if rows == self.config.padded_vocab_size:
            return self
        model = copy.deepcopy(self)
        model.config = cfg
        with torch.no_grad():
            for name in self.vocab_tables():
                module = model.get_submodule(name.rpartition(".")[0])
                held = self.config.padded_vocab_size
                for key, param in module.named_parameters(recurse=False):  # a Linear's weight (and bias)
                    if param.shape[0] == held:
                        setattr(module, key, nn.Parameter(fit_rows(param, rows, cfg.vocab_size), param.requires_grad))
                for key, buffer in module.named_buffers(recurse=False):  # an int8 head's weight and scales
                    if buffer.dim() and buffer.shape[0] == held:
                        setattr(module, key, fit_rows(buffer, rows, cfg.vocab_size))
                for size in ("num_embeddings", "out_features"):  # nn.Embedding's and nn.Linear's record of it
                    if hasattr(module, size):
                        setattr(module, size, rows)
        return model

    def aux_losses(self) -> dict[str, Tensor]:
        """The auxiliary losses of the last forward (``Sublayer.aux_losses``), each summed over the
        layers, by name; empty for a model without them. A task adds them to its training loss."""
        found: dict[str, Tensor] = {}
        for module in self.modules():
            if isinstance(module, Sublayer):
                for name, value in module.aux_losses().items():
                    found[name] = found[name] + value if name in found else value
        return found

    def logits(self, hidden: Tensor) -> Tensor:
        """(B, T, D) final hidden states -> (B, T, V) next-token logits."""
        scale = self.config.logit_scale / (self.mup_width or 1.0)  # muP: logits times base/width
        hidden = hidden * scale if scale != 1.0 else hidden
        logits = F.linear(hidden, self.embed.weight) if self.lm_head is None else self.lm_head(hidden)
        if logits.shape[-1] != self.config.vocab_size:  # vocab_multiple_of: the padding rows' logits cut off
            logits = logits[..., : self.config.vocab_size]  # (B, T, V_padded) -> (B, T, V)
        cap = self.config.final_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)  # Gemma 2's final soft-cap


def fit_rows(tensor: Tensor, rows: int, vocab: int) -> Tensor:
    """``tensor``'s first ``vocab`` rows (the true vocabulary), then zero rows up to ``rows`` in all."""
    fitted = tensor.new_zeros((rows, *tensor.shape[1:]))
    fitted[:vocab] = tensor[:vocab]
    return fitted


def _pad_vocab_rows(model: ZooModel, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """``load_state_dict``'s pre-hook: a vocabulary table stored with the true vocabulary's rows alone (an
    unpadded model's, an HF or GGUF import's) loads into a model with padding rows (``vocab_multiple_of``),
    its padding zero. Any other shape is left for ``load_state_dict`` to refuse."""
    model.fit_vocab_rows(state_dict, model.config.vocab_size, prefix)


def mup_width(cfg: ModelConfig) -> float | None:
    """muP's width multiplier of ``cfg``: d_model / mup_base_d_model; None without muP."""
    return None if cfg.mup_base_d_model is None else cfg.d_model / cfg.mup_base_d_model


ARCH.bind(ZooModel)
