"""Parameter-efficient fine-tuning adapters (``adapter``): ``none`` and ``lora``.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") freezes a linear layer's
weight W (out, in) and learns a low-rank update: y = W x + b + (alpha / r) * B A dropout(x), with
A (r, in) random and B (out, r) zero at init, so an adapted model starts equal to its base model.

Fused layers. zoo fuses projections that other code keeps apart: self-attention's ``qkv`` = [q; k; v],
cross-attention's ``kv`` = [k; v] and a GLU's ``fc`` = [gate; up]. Each part (a *segment*: a block of
output rows) gets its own A and B, exactly as LoRA on separate ``q_proj``/``v_proj`` layers would:
adapting q and v of a GQA layer adds A_q (r, D), B_q (H*hd, r), A_v (r, D), B_v (KV*hd, r) and leaves
the k rows of W untouched. :func:`merge` adds scale * B_s A_s to the rows of segment s only.

Target names. A layer is named by its qualified module name (``decoder.blocks.0.attn.out``); a
segment of a fused layer by that name plus the segment (``decoder.blocks.0.attn.qkv.v``). A target
is a friendly name (see :data:`TARGETS`) or a regex that must fully match a layer name (all its
segments) or a segment name (that segment only).

    model = zoo.create_model("gpt2", n_layers=2)
    zoo.adapters.apply(model, "lora", rank=8, targets=("q", "v"))  # in place; base frozen
    ...train...
    zoo.adapters.merge(model)  # a plain model again, adapters folded into the weights
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.io import CheckpointError
from zoo.models import count_parameters
from zoo.registry import ConfigError, Registry
from zoo.sublayer import Sublayer
from zoo.zoo_model import ZooModel

ADAPTERS: Registry[type[Adapter]] = Registry("adapter")  # bound to Adapter below

# friendly target names -> the regex they stand for (fully matched against layer or segment names)
TARGETS: dict[str, str] = {
    "q": r"(.*\.)?attn\.qkv\.q",  # self-attention query rows of the fused qkv
    "k": r"(.*\.)?attn\.qkv\.k",
    "v": r"(.*\.)?attn\.qkv\.v",
    "out": r"(.*\.)?attn\.out",  # self-attention output projection
    "ffn": r"(.*\.)?ffn\.(fc|proj)",  # both FFN layers (a GLU's gate and up rows included)
    "cross": r"(.*\.)?cross_attn\.(q|kv|out)",  # all of cross-attention
}
DEFAULT_TARGETS = ("q", "k", "v", "out")


@dataclass(frozen=True)
class AdapterConfig:
    """An adapter's settings, as plain data (``to_dict``) for a checkpoint or a config file."""

    name: str = "lora"
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0  # on the adapter's input only
    targets: tuple[str, ...] = DEFAULT_TARGETS  # friendly names or regexes over layer names
    trainable: tuple[str, ...] = ()  # regexes over module or parameter names left trainable (a head)

    def __post_init__(self) -> None:
        for field in ("targets", "trainable"):  # a single string is one pattern; a Hydra list is a sequence
            value = getattr(self, field)
            object.__setattr__(self, field, (value,) if isinstance(value, str) else tuple(value))

    def validate(self) -> None:
        ADAPTERS.get(self.name, field="adapter")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank <= 0:
            raise ConfigError(f"rank={self.rank!r}: a LoRA rank must be a positive integer, e.g. rank=8")
        if not self.alpha > 0:
            raise ConfigError(f"alpha={self.alpha!r}: must be > 0 (the update is scaled by alpha/rank), e.g. 16")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout={self.dropout!r}: must be in [0, 1)")
        if not self.targets:
            raise ConfigError(f"targets is empty; choose from {', '.join(TARGETS)} or regexes over layer names")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


class LoRALinear(nn.Linear):
    """An ``nn.Linear`` plus low-rank updates of some of its segments (blocks of output rows).

    It holds the base layer's own ``weight`` and ``bias`` parameters, so the base keys of the
    state_dict do not change; the adapter adds ``lora_A.<segment>`` (r, in) and ``lora_B.<segment>``
    (rows, r). Notation: N leading dims, in/out features, r rank.
    """

    def __init__(
        self,
        base: nn.Linear,
        segments: Sequence[tuple[str, int]],
        adapted: Sequence[str],
        *,
        rank: int,
        alpha: float,
        dropout: float,
    ) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: the base's parameters are reused, not allocated
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.segments = tuple(segments)  # (name, rows) in row order; their rows sum to out_features
        self.rank, self.scale = rank, alpha / rank
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        kw = dict(device=base.weight.device, dtype=base.weight.dtype)
        self.lora_A, self.lora_B = nn.ParameterDict(), nn.ParameterDict()
        for name, rows in self.segments:
            if name in adapted:
                self.lora_A[name] = nn.Parameter(torch.empty(rank, self.in_features, **kw))
                self.lora_B[name] = nn.Parameter(torch.zeros(rows, rank, **kw))  # zero: starts as the base
                nn.init.kaiming_uniform_(self.lora_A[name], a=math.sqrt(5))  # nn.Linear's init, as in PEFT

    def forward(self, x: Tensor) -> Tensor:
        """x: (N, in) -> (N, out)."""
        y = F.linear(x, self.weight, self.bias)  # (N, out)
        h = self.drop(x)
        pieces = list(y.split([rows for _, rows in self.segments], dim=-1))  # (N, rows) per segment
        for i, (name, _) in enumerate(self.segments):
            if name in self.lora_A:
                pieces[i] = pieces[i] + self.scale * F.linear(F.linear(h, self.lora_A[name]), self.lora_B[name])
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` holding this layer's weight with W[rows of s] += scale * B_s A_s."""
        start = 0
        for name, rows in self.segments:
            if name in self.lora_A:
                delta = self.lora_B[name].float() @ self.lora_A[name].float()  # (rows, in)
                self.weight[start : start + rows] += (self.scale * delta).to(self.weight.dtype)
            start += rows
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight, linear.bias = self.weight, self.bias
        return linear

    def extra_repr(self) -> str:
        adapted = ", ".join(self.lora_A)
        return f"{super().extra_repr()}, rank={self.rank}, scale={self.scale:g}, adapted=[{adapted}]"


def segments_of(parent: nn.Module, attr: str, linear: nn.Linear) -> list[tuple[str, int]]:
    """The named row blocks of ``parent.<attr>``, as the sublayer declares them (``Sublayer.fused_segments``:
    [q, k, v] of self-attention's ``qkv``, [k, v] of cross-attention's ``kv``, [gate, up] of a GLU's
    ``fc``); one segment named ``attr`` otherwise."""
    fused = parent.fused_segments() if isinstance(parent, Sublayer) else {}
    return fused.get(attr, [(attr, linear.out_features)])


def _linear_layers(model: nn.Module) -> dict[str, tuple[nn.Module, str, list[tuple[str, int]]]]:
    """Every plain nn.Linear by qualified name -> (parent, attribute, segments)."""
    layers = {}
    for prefix, parent in model.named_modules():
        for attr, child in parent.named_children():
            if isinstance(child, nn.Linear) and not isinstance(child, LoRALinear):
                name = f"{prefix}.{attr}" if prefix else attr
                layers[name] = (parent, attr, segments_of(parent, attr, child))
    return layers


def _compile(pattern: str, field: str) -> re.Pattern[str]:
    try:
        return re.compile(TARGETS.get(pattern, pattern))
    except re.error as err:
        raise ConfigError(
            f"{field}: {pattern!r} is neither a target name ({', '.join(TARGETS)}) nor a valid regex ({err})"
        ) from None


def resolve_targets(model: nn.Module, targets: Sequence[str]) -> dict[str, list[str]]:
    """Layer name -> the names of its segments that ``targets`` select, in row order.

    Every target must select something: a name this model lacks is a ConfigError naming the valid ones.
    """
    layers = _linear_layers(model)
    chosen: dict[str, set[str]] = {}
    for target in targets:
        regex, hit = _compile(target, "targets"), False
        for name, (_, _, segments) in layers.items():
            fused = len(segments) > 1
            picked = {s for s, _ in segments if regex.fullmatch(name) or (fused and regex.fullmatch(f"{name}.{s}"))}
            if picked:
                chosen.setdefault(name, set()).update(picked)
                hit = True
        if not hit:
            close = difflib.get_close_matches(target, TARGETS, n=1, cutoff=0.5)
            hint = f" Did you mean {close[0]!r}?" if close and close[0] != target else ""
            examples = [f"{n}.{segs[-1][0]}" if len(segs) > 1 else n for n, (_, _, segs) in layers.items()][:2]
            notes = dict.fromkeys(m.adapter_note() for m in model.modules() if isinstance(m, Sublayer))
            raise ConfigError(
                f"targets: {target!r} selects no layer of this {type(model).__name__}; valid names: "
                f"{', '.join(TARGETS)}, or a regex over layer names such as {' or '.join(map(repr, examples))}."
                f"{hint}{''.join(f' {note}.' for note in notes if note)}"
            )
    return {name: [s for s, _ in layers[name][2] if s in segs] for name, segs in chosen.items()}


def _matching_parameters(model: nn.Module, patterns: Sequence[str]) -> list[nn.Parameter]:
    """The parameters whose own name, or the name of a module holding them, a pattern fully matches."""
    params, found = dict(model.named_parameters()), []
    for pattern in patterns:
        regex = _compile(pattern, "trainable")
        hits = [
            p
            for name, p in params.items()
            if any(regex.fullmatch(".".join(name.split(".")[:i])) for i in range(1, name.count(".") + 2))
        ]
        if not hits:
            example = next((n for n, _ in model.named_children()), "lm_head")
            raise ConfigError(
                f"trainable: {pattern!r} matches no module or parameter of this "
                f"{type(model).__name__}; give a regex over module names, such as {example!r}"
            )
        found += hits
    return found


class Adapter:
    """An adapter family: how it changes a model for fine-tuning (in place). ``freezes_base``: the
    model's own weights stay as loaded, so they should be pretrained ones."""

    freezes_base = False

    @classmethod
    def apply(cls, model: nn.Module, cfg: AdapterConfig) -> None:
        raise NotImplementedError


ADAPTERS.bind(Adapter)


@ADAPTERS.register("none")
class NoAdapter(Adapter):
    """Full fine-tuning: nothing wrapped, nothing frozen (its 'adapter tensors' are all parameters)."""

    @classmethod
    def apply(cls, model: nn.Module, cfg: AdapterConfig) -> None:
        pass


@ADAPTERS.register("lora")
class LoRA(Adapter):
    """Low-rank updates of the target layers; every other parameter frozen but ``trainable``'s."""

    freezes_base = True

    @classmethod
    def apply(cls, model: nn.Module, cfg: AdapterConfig) -> None:
        chosen = resolve_targets(model, cfg.targets)
        extra = _matching_parameters(model, cfg.trainable)  # checked before anything changes
        model.requires_grad_(False)
        layers = _linear_layers(model)
        for name, adapted in chosen.items():
            parent, attr, segments = layers[name]
            setattr(
                parent,
                attr,
                LoRALinear(
                    getattr(parent, attr), segments, adapted, rank=cfg.rank, alpha=cfg.alpha, dropout=cfg.dropout
                ),
            )
        for p in extra:  # the same objects after wrapping: a wrapper keeps its base's parameters
            p.requires_grad_(True)


def apply(
    model: ZooModel,
    name: str = "lora",
    *,
    rank: int = 8,
    alpha: float = 16.0,
    dropout: float = 0.0,
    targets: Sequence[str] = DEFAULT_TARGETS,
    trainable: Sequence[str] = (),
) -> ZooModel:
    """Add the ``name`` adapter to ``model`` in place and return it.

    Args:
        name: a registered adapter (``ADAPTERS``): ``lora``, or ``none`` for full fine-tuning.
        rank, alpha: LoRA's r and alpha; the update is scaled by alpha / r.
        dropout: dropout on the adapter's input (the base path is never dropped).
        targets: friendly names (``q``, ``k``, ``v``, ``out``, ``ffn``, ``cross``) or regexes fully
            matching layer names (``decoder.blocks.1.attn.out``) or segment names (``...attn.qkv.v``).
        trainable: regexes over module or parameter names that stay trainable too (a task head).

    The settings are kept as ``model.adapter_config`` for :func:`adapter_state_dict` and :func:`merge`.
    A model that already has an adapter is refused: merge it first.
    """
    cfg = AdapterConfig(name, rank=rank, alpha=alpha, dropout=dropout, targets=targets, trainable=trainable)
    cfg.validate()
    if model.adapter_config is not None or any(isinstance(m, LoRALinear) for m in model.modules()):
        raise ConfigError(f"this {type(model).__name__} already has an adapter; zoo.adapters.merge(model) first")
    ADAPTERS.get(name, field="adapter").apply(model, cfg)
    model.adapter_config = cfg
    return model


def is_adapter_tensor(name: str) -> bool:
    """Whether a state-dict key is an adapter's (``...qkv.lora_A.q``) rather than the base model's."""
    return ".lora_A." in name or ".lora_B." in name


def adapted_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """The LoRA-wrapped layers of ``model`` by qualified name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def _config_of(model: ZooModel) -> AdapterConfig:
    cfg = model.adapter_config
    if cfg is None:
        raise ValueError(f"this {type(model).__name__} has no adapter; zoo.adapters.apply(model, ...) first")
    return cfg


def merge(model: ZooModel) -> ZooModel:
    """Fold every adapter into its base weight (on its own rows) and remove the wrappers, in place.

    The result is a plain zoo model: its state_dict has exactly the base model's keys, every parameter
    is trainable again (as after ``build_model``) and ``adapter_config`` is None. Returns ``model``.
    """
    _config_of(model)
    for name, layer in adapted_layers(model).items():
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name), attr, layer.merged())
    model.requires_grad_(True)
    model.adapter_config = None
    return model


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters that train, by name (for an optimizer: ``trainable_parameters(m).values()``)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def count_trainable(model: nn.Module) -> int:
    """Number of trainable parameters (a tied one counts once)."""
    return count_parameters(model, trainable_only=True)


def adapter_state_dict(model: ZooModel) -> dict[str, Any]:
    """``{"adapter": settings as plain data, "tensors": {name: tensor}}``: what fine-tuning trained.

    For ``lora`` the tensors are the adapter's A and B plus the ``trainable`` parameters; for ``none``
    every parameter. Like ``state_dict`` the tensors share storage with the model.
    """
    cfg = _config_of(model)
    return {"adapter": cfg.to_dict(), "tensors": {n: p.detach() for n, p in trainable_parameters(model).items()}}


def load_adapter(model: ZooModel, state: dict[str, Any]) -> ZooModel:
    """Re-apply a saved adapter (:func:`adapter_state_dict`) to a base ``model`` and load its tensors.

    The tensor names and shapes must be exactly those the adapter makes on this model (a
    CheckpointError names the difference, and the adapter is removed again). Returns ``model``.
    """
    apply(model, **state["adapter"])
    try:
        _load_tensors(model, state["tensors"])
    except CheckpointError:
        merge(model)  # B is still zero: merging only removes the wrappers
        raise
    return model


def _load_tensors(model: nn.Module, tensors: dict[str, Tensor]) -> None:
    expected = trainable_parameters(model)
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"adapter tensors do not fit this {type(model).__name__}: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}; was it saved from a model of another config?"
        )
    for name, p in expected.items():
        if p.shape != tensors[name].shape:
            raise CheckpointError(
                f"adapter tensor {name}: shape {tuple(tensors[name].shape)} in the state, "
                f"{tuple(p.shape)} in this model; was it saved from a model of another config?"
            )
    with torch.no_grad():
        for name, p in expected.items():
            p.copy_(tensors[name])
