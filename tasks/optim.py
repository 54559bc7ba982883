"""The optimizers a run can choose: ``optimizer.name`` in conf/optimizer/ names one of
:data:`OPTIMIZERS`, a registry of settings dataclasses, each checked when it is made and able to
build its optimizer over a task's trainable parameters (:func:`build_optimizer`).

- ``adamw``: AdamW (Loshchilov & Hutter 2019, https://arxiv.org/abs/1711.05101) whose weight decay
  skips biases, norms and embeddings (the GPT-2/BERT practice): only matrices decay.
- ``muon``: Muon (Jordan et al. 2024, https://kellerjordan.github.io/posts/muon/), torch's
  ``torch.optim.Muon``, for the hidden matrices (the attention and FFN projections inside the
  blocks), and AdamW with the same decay rule for everything else, as one optimizer
  (:class:`MuonWithAdamW`).

Settings without a ``name`` (the configs and checkpoints of runs from before Muon) are AdamW's.

Under muP (``model.mup_base_d_model``) the model declares its parameters' roles
(``zoo.ZooModel.mup_groups``) and each optimizer gives a role's parameters a group of their own whose
learning rate is ``lr * m**power`` (m = d_model / base), the power from the optimizer's update rule
(:data:`MUP_POWERS`): the learning rate tuned at the base width then carries over. Everything without a
role (embeddings, the LM head, biases, norms, task heads) keeps ``lr``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch
from torch import nn

import zoo

DEFAULT = "adamw"  # what settings without a name mean
ADJUST_LR = ("original", "match_rms_adamw")  # torch.optim.Muon's adjust_lr_fn

OPTIMIZERS: zoo.Registry[type[OptimizerSettings]] = zoo.Registry("optimizer")
S = TypeVar("S", bound="type[OptimizerSettings]")


MUP_POWERS: dict[str, dict[str, float]] = {
    # Adam's update of a matrix is close to rank one and aligned with its inputs: it moves h = W x by
    # lr * fan_in per coordinate, so lr / m keeps that fixed (Tensor Programs V, table 3/8)
    "adamw": {"hidden": -1.0, "readout": -1.0},
    # Muon's orthogonalised update has spectral norm lr * sqrt(max(1, out/in)) ("original") or
    # lr * 0.2 * sqrt(max(out, in)) ("match_rms_adamw"); muP's spectral condition asks for
    # sqrt(out/in) (Yang, Simon & Bernstein 2023, https://arxiv.org/abs/2310.17813): for a hidden
    # matrix a constant, for a readout (out fixed) m^-1/2. The powers are the ratios.
    "muon/original": {"hidden": 0.0, "readout": -0.5},
    "muon/match_rms_adamw": {"hidden": -0.5, "readout": -1.0},
}
"""The power of muP's width multiplier m on each role's learning rate, by optimizer update rule."""

SCHEDULE_KEYS = ("warmup_steps", "min_lr_ratio")  # the scheduler's, in the optimizer settings of older checkpoints


def register(name: str) -> Callable[[S], S]:
    """Class decorator: register an OptimizerSettings dataclass as ``optimizer.name=<name>``."""

    def decorator(cls: S) -> S:
        cls.name = name
        return OPTIMIZERS.register(name)(cls)

    return decorator


def build_optimizer(module: nn.Module, settings: Mapping[str, Any]) -> torch.optim.Optimizer:
    """The optimizer ``settings`` (conf/optimizer, as plain data) describe, over the trainable
    parameters of ``module`` (a task: its model and its heads)."""
    return optimizer_settings(settings).build(module)


def optimizer_settings(settings: Mapping[str, Any]) -> OptimizerSettings:
    """``settings`` checked: a ConfigError naming the field for an unknown optimizer name (with the
    valid ones), an unknown or missing setting, or a bad value. Needs no model, so a run can check
    its config before anything is built."""
    settings = dict(settings)
    name = settings.pop("name", None) or DEFAULT
    return OPTIMIZERS.get(name, field="optimizer.name").from_settings(settings)


def optimizer_name(settings: Mapping[str, Any]) -> str:
    """The registered name ``settings`` choose (``adamw`` for settings from before names)."""
    return settings.get("name") or DEFAULT


def check_same_optimizer(saved: Mapping[str, Any], settings: Mapping[str, Any]) -> None:
    """A ConfigError when a run resumes a checkpoint (its hyper-parameters' optimizer settings:
    ``saved``) with another optimizer: the saved optimizer state cannot be loaded into it."""
    before, now = optimizer_name(saved), optimizer_name(settings)
    if before != now:
        raise zoo.ConfigError(
            f"optimizer.name={now} cannot resume a checkpoint trained with optimizer.name={before} (its optimizer "
            f"state is {before}'s); resume with optimizer={before}, or start a new run with init_from=<checkpoint>"
        )


# ---- the settings --------------------------------------------------------------------------------
@dataclass(kw_only=True)
class OptimizerSettings:
    """One optimizer's settings (conf/optimizer/<name>.yaml less ``name``), checked in
    ``__post_init__``; ``build`` makes the optimizer."""

    name: ClassVar[str]  # set by @register
    title: ClassVar[str]  # how a model card or a log names it
    elementwise: ClassVar[bool] = True  # each entry's update reads only its own state (a sliced weight updates alike)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> OptimizerSettings:
        """``cls(**settings)``, with a ConfigError instead of a TypeError for a setting it does not
        have (e.g. Muon's ``momentum`` given to AdamW) or one it needs."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = [k for k in settings if k not in fields]
        if unknown:
            raise zoo.ConfigError(
                f"optimizer.{unknown[0]} is not a setting of optimizer={cls.name} (its settings: "
                f"{', '.join(fields)}); drop it or choose another optimizer ({', '.join(OPTIMIZERS.names())})"
            )
        needed = [n for n, f in fields.items() if f.default is dataclasses.MISSING]
        missing = [n for n in needed if n not in settings]
        if missing:
            raise zoo.ConfigError(f"optimizer.{missing[0]} is missing: optimizer={cls.name} needs {', '.join(needed)}")
        return cls(**settings)

    def build(self, module: nn.Module) -> torch.optim.Optimizer:
        raise NotImplementedError(f"{type(self).__name__} does not build an optimizer")


@register("adamw")
@dataclass(kw_only=True)
class AdamWSettings(OptimizerSettings):
    """conf/optimizer/adamw.yaml: AdamW over every trainable parameter, decaying matrices only."""

    title = "AdamW"
    lr: float
    weight_decay: float
    betas: tuple[float, float]
    eps: float = 1e-8
    fused: bool | None = None  # None: fused kernels when all parameters are on a GPU

    def __post_init__(self) -> None:
        self.lr = _number("lr", self.lr, "> 0 (the peak learning rate)", lambda v: v > 0)
        self.weight_decay = _number("weight_decay", self.weight_decay, ">= 0", lambda v: v >= 0)
        self.eps = _number("eps", self.eps, "> 0", lambda v: v > 0)
        betas = self.betas
        if not isinstance(betas, list | tuple) or len(betas) != 2:
            raise zoo.ConfigError(f"optimizer.betas={betas!r} must be two numbers in [0, 1), e.g. [0.9, 0.95]")
        rule = "in [0, 1), e.g. [0.9, 0.95]"
        self.betas = tuple(_number(f"betas[{i}]", b, rule, lambda v: 0 <= v < 1) for i, b in enumerate(betas))
        if self.fused is not None and not isinstance(self.fused, bool):
            raise zoo.ConfigError(
                f"optimizer.fused={self.fused!r} must be true, false or null (null: fused kernels on GPUs)"
            )

    def adamw(
        self,
        params: Iterable[nn.Parameter],
        embeddings: set[int],
        lr: float,
        mup: Mapping[int, tuple[str, float]] | None = None,
    ) -> torch.optim.AdamW:
        """AdamW over ``params`` in two groups: the matrices that are not embeddings (``embeddings``:
        their ids) decay, the rest (biases, norms, embeddings) do not. ``mup``: id -> (role, lr
        multiplier) of the parameters muP gives a learning rate of their own, each role a decaying
        group named ``adamw_mup_<role>`` after those two."""
        mup = mup or {}
        decay, no_decay, roles = [], [], {}
        for p in params:
            if id(p) in mup:
                roles.setdefault(mup[id(p)], []).append(p)
            else:
                (decay if p.ndim >= 2 and id(p) not in embeddings else no_decay).append(p)
        groups = [{"params": decay, "weight_decay": self.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        for (role, multiplier), chosen in roles.items():
            name = f"adamw_mup_{role}"
            groups.append({"params": chosen, "weight_decay": self.weight_decay, "lr": lr * multiplier, "name": name})
        every = [p for g in groups for p in g["params"]]
        fused = self.fused
        if fused is None:
            fused = all(p.is_cuda for p in every) and bool(every)
        return torch.optim.AdamW(groups, lr=lr, betas=self.betas, eps=self.eps, fused=fused or None)

    def build(self, module: nn.Module) -> torch.optim.AdamW:
        mup = mup_multipliers(module, MUP_POWERS["adamw"])
        return self.adamw(trainable(module), embedding_weights(module), self.lr, mup)


@register("muon")
@dataclass(kw_only=True)
class MuonSettings(AdamWSettings):
    """conf/optimizer/muon.yaml: Muon's settings, and AdamW's (inherited) for the parameters Muon
    does not take. ``weight_decay`` is both optimizers' (decoupled, times the learning rate);
    ``adamw_lr`` None is ``lr``: with ``adjust_lr_fn="match_rms_adamw"`` Muon's updates have
    AdamW's RMS (Liu et al. 2025, https://arxiv.org/abs/2502.16982), so one learning rate serves
    both."""

    elementwise: ClassVar[bool] = False  # orthogonalizes each weight matrix whole

    title = "Muon + AdamW"
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    adjust_lr_fn: str = "match_rms_adamw"
    adamw_lr: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.momentum = _number("momentum", self.momentum, "in [0, 1), e.g. 0.95", lambda v: 0 <= v < 1)
        if not isinstance(self.nesterov, bool):
            raise zoo.ConfigError(f"optimizer.nesterov={self.nesterov!r} must be true or false")
        steps = self.ns_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps < 100:
            raise zoo.ConfigError(
                f"optimizer.ns_steps={steps!r} must be a whole number from 1 to 99 (Newton-Schulz iterations; "
                "5 is usual)"
            )
        if self.adjust_lr_fn not in ADJUST_LR:
            raise zoo.ConfigError(f"optimizer.adjust_lr_fn={self.adjust_lr_fn!r} must be one of {', '.join(ADJUST_LR)}")
        if self.adamw_lr is not None:
            self.adamw_lr = _number("adamw_lr", self.adamw_lr, "> 0, or null for optimizer.lr", lambda v: v > 0)

    def build(self, module: nn.Module) -> MuonWithAdamW:
        hidden = hidden_matrices(module)
        if not hidden:
            raise zoo.ConfigError(
                "optimizer=muon found no trainable linear-layer weight in the blocks for Muon (the model is frozen, "
                "e.g. by adapter=lora, or flattened by FSDP); choose optimizer=adamw"
            )
        mup = mup_multipliers(module, MUP_POWERS[f"muon/{self.adjust_lr_fn}"])
        plain = [p for p in hidden if id(p) not in mup]
        groups = [{"params": plain, "name": "muon"}] if plain else []
        for role, multiplier in dict.fromkeys(mup[id(p)] for p in hidden if id(p) in mup):
            chosen = [p for p in hidden if mup.get(id(p)) == (role, multiplier)]
            groups.append({"params": chosen, "name": f"muon_mup_{role}", "lr": self.lr * multiplier})
        muon = torch.optim.Muon(
            groups,
            lr=self.lr,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
            nesterov=self.nesterov,
            ns_steps=self.ns_steps,
            adjust_lr_fn=self.adjust_lr_fn,
        )
        taken = {id(p) for p in hidden}
        rest = [p for p in trainable(module) if id(p) not in taken]
        adamw_lr = self.lr if self.adamw_lr is None else self.adamw_lr
        adamw = self.adamw(rest, embedding_weights(module), adamw_lr, mup_multipliers(module, MUP_POWERS["adamw"]))
        for group, name in zip(adamw.param_groups, ("adamw", "adamw_no_decay"), strict=False):
            group["name"] = name  # LearningRateMonitor logs lr-MuonWithAdamW/<name>
        return MuonWithAdamW(muon, adamw)


# ---- which parameters ----------------------------------------------------------------------------
def mup_multipliers(module: nn.Module, powers: Mapping[str, float]) -> dict[int, tuple[str, float]]:
    """id -> (role, m ** powers[role]) for the trainable parameters of each muP model in ``module``
    (its ``mup_groups``); empty when none is muP."""
    found: dict[int, tuple[str, float]] = {}
    for model in (m for m in module.modules() if isinstance(m, zoo.ZooModel)):
        width = model.mup_width
        for role, params in model.mup_groups().items():
            for p in params:
                if p.requires_grad:
                    found[id(p)] = (role, width ** powers[role])
    return found


def trainable(module: nn.Module) -> list[nn.Parameter]:
    """The parameters of ``module`` that train (each once, however often it is shared)."""
    return [p for p in module.parameters() if p.requires_grad]


def embedding_weights(module: nn.Module) -> set[int]:
    """The ids of the weights of every nn.Embedding in ``module`` (tokens, positions, segments)."""
    return {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}


def hidden_matrices(module: nn.Module) -> list[nn.Parameter]:
    """The trainable parameters Muon takes: the weights of the linear layers of each block's
    attention and FFN (the sublayers of ``ZooModel.branches``; an MoE's router too), in module order.

    What Muon's write-up keeps for AdamW stays out by construction: the embeddings, the LM head (tied
    or not), a pooler and task heads are outside the blocks; norms sit in the residual placements;
    biases are not a layer's weight. So do weights that are not one matrix (an MoE's stacked (E, out,
    in) experts: torch's Muon takes 2-D parameters only) and LoRA's factors (the adapter literature
    trains them with AdamW)."""
    found: dict[int, nn.Parameter] = {}
    for model in (m for m in module.modules() if isinstance(m, zoo.ZooModel)):
        for sublayer, _ in model.branches():
            for layer in (m for m in sublayer.modules() if isinstance(m, nn.Linear)):
                if layer.weight.requires_grad and layer.weight.ndim == 2:
                    found.setdefault(id(layer.weight), layer.weight)
    return list(found.values())


# ---- the combined optimizer ----------------------------------------------------------------------
class MuonWithAdamW(torch.optim.Optimizer):
    """Muon and AdamW stepped together as one optimizer.

    Why one object: Lightning's automatic optimisation steps one optimizer per training step, the
    LambdaLR schedule scales the ``lr`` of that optimizer's ``param_groups``, and exact resume saves
    and loads that optimizer's one ``state_dict``. So this class shares rather than copies: its
    ``param_groups`` are the group dicts of ``muon`` then those of ``adamw`` (the same objects), and
    its ``state`` is the one dict all three keep per-parameter state in (their parameters are
    disjoint). A scheduler's change of a group's lr is then what the inner optimizer reads;
    ``state_dict`` is an ordinary optimizer's; whatever moves optimizer state to a device (Lightning
    does on resume) moves both; ``load_state_dict`` is torch's, after which the inner optimizers are
    pointed at the loaded groups and state again. Two optimizers under automatic optimisation would
    each take a step per batch in turn (Lightning loops over them), not one together.
    """

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW) -> None:
        self.muon, self.adamw = muon, adamw
        super().__init__(muon.param_groups + adamw.param_groups, {})  # the dicts themselves: shared
        self._share()

    def _share(self) -> None:
        """Point the inner optimizers at this one's groups (Muon's first) and state."""
        n = len(self.muon.param_groups)
        self.muon.param_groups, self.adamw.param_groups = self.param_groups[:n], self.param_groups[n:]
        self.muon.state = self.adamw.state = self.state

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Evaluate ``closure`` (Lightning's forward and backward) once, then step Muon and AdamW."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's ``load_state_dict``; a ConfigError when ``state_dict`` is not this optimizer's
        (e.g. a checkpoint of an AdamW run resumed with optimizer=muon)."""
        muon_groups = ["ns_steps" in g for g in state_dict.get("param_groups", [])]
        if muon_groups != ["ns_steps" in g for g in self.param_groups]:
            raise zoo.ConfigError(
                "the checkpoint's optimizer state is not Muon + AdamW's (it trained with another optimizer); "
                "resume with the optimizer it trained with, or start a new run with init_from=<checkpoint>"
            )
        super().load_state_dict(state_dict)
        self._share()


def _number(field: str, value: Any, rule: str, ok: Callable[[float], bool]) -> float:
    """``value`` as a float when it is a finite number that ``ok`` accepts; a ConfigError naming
    ``optimizer.<field>`` and ``rule`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not ok(value):
        text = " (YAML reads 1e-3 as text: write 1.0e-3)" if isinstance(value, str) else ""
        raise zoo.ConfigError(f"optimizer.{field}={value!r} must be a number {rule}{text}")
    return float(value)


def warmup_cosine(warmup_steps: int, total_steps: int, min_ratio: float):
    """LR multiplier: linear from 1/warmup to 1, then half a cosine down to ``min_ratio``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor
