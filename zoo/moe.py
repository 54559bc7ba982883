"""The mixture-of-experts FFN (``ffn=moe``): a router sends each token to ``moe_top_k`` of ``n_experts``
SwiGLU experts and sums their outputs, weighted by the router (Shazeer et al. 2017,
https://arxiv.org/abs/1701.06538; Mixtral, Jiang et al. 2024, https://arxiv.org/abs/2401.04088).

Notation: N tokens (B * T, flattened), D d_model, F an expert's width (``resolved_d_ff``, as for
``swiglu``), E ``n_experts``, k ``moe_top_k``.

    p(x) = softmax(W_r x)                                   (E,) router probabilities
    y(x) = sum over e in top_k(p(x)) of w_e(x) SwiGLU_e(x)  [+ SwiGLU_shared(x)]

with w_e = p_e / (sum of the k chosen p) when ``moe_renormalize`` (Mixtral), else w_e = p_e (Qwen2-MoE's
``norm_topk_prob=False``). ``moe_shared_expert`` adds one more SwiGLU of width F that every token
passes (DeepSeekMoE, Dai et al. 2024, https://arxiv.org/abs/2401.06066).

Dispatch is dropless: no capacity factor (MegaBlocks, Gale et al. 2022,
https://arxiv.org/abs/2211.15841). The N * k (token, expert) assignments are sorted by expert and each
expert runs once on the rows sent to it, so every token reaches its k experts and no token's output
depends on the other tokens of the batch: causality and cached decoding hold as for a dense FFN.
The group sizes depend on the data; a graph traced for export (ONNX) runs every expert on every
token instead, weighting the unchosen ones by 0: the same outputs at E / k times the expert FLOPs.

The router's losses of the last forward, weighted by their coefficients, are what ``aux_losses``
returns (the task adds them to the training loss; a coefficient of 0 leaves its loss out). Both are
over the batch's real positions: the block passes the keep-mask of its new positions
(``AttentionInputs.keep``, ``reads_padding``), and padded ones, routed like the others (their outputs
are never used), count in neither f_e, P_e nor the z-loss's mean.

- ``moe_aux_loss``: load balancing, E * sum_e f_e P_e, f_e the fraction of the N * k assignments that
  went to expert e, P_e the mean router probability of e (Switch Transformer, Fedus et al. 2021,
  https://arxiv.org/abs/2101.03961, eq. 4; with k > 1 the fractions of assignments, summing to 1);
  1 when routing is uniform.
- ``moe_z_loss``: mean over tokens of logsumexp(router logits)^2 (ST-MoE, Zoph et al. 2022,
  https://arxiv.org/abs/2202.08906, eq. 5): keeps the router's logits small.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.config import ModelConfig
from zoo.ffn import SwiGLU
from zoo.registry import FFN, ConfigError
from zoo.sublayer import FeedForward


class ExpertLinear(nn.Module):
    """E linear maps of one shape, stacked: ``weight`` (E, out, in), ``bias`` (E, out) or None.

    A leaf module with ``reset_parameters``, so ``ZooModel.init_weights`` redraws it as it draws an
    ``nn.Linear``: weight normal(0, ``std``) (the config's ``init_std``), bias zero. It is not an
    ``nn.Linear``: LoRA, which acts on those, leaves it alone (``MoE.adapter_note``); the int8 quantizer
    stores it as ``zoo.quantize.Int8ExpertLinear``."""

    def __init__(self, n: int, in_features: int, out_features: int, *, bias: bool, std: float) -> None:
        super().__init__()
        self.in_features, self.out_features, self.std = in_features, out_features, std
        self.weight = nn.Parameter(torch.empty(n, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(n, out_features)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=self.std)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: Tensor, expert: int) -> Tensor:
        """x: (n, in) rows sent to ``expert`` -> (n, out)."""
        return F.linear(x, self.weight[expert], None if self.bias is None else self.bias[expert])

    def extra_repr(self) -> str:
        n = self.weight.shape[0]
        return f"{n} x ({self.in_features} -> {self.out_features}), bias={self.bias is not None}"


def expert_stacks(model: nn.Module) -> list[tuple[nn.Module, str, ExpertLinear]]:
    """Every stacked expert layer under ``model`` as (its parent, its name there, the layer): what
    ``zoo.quantize`` replaces with an int8 copy (an ExpertLinear's subclass is left alone)."""
    return [
        (module, name, child)
        for module in model.modules()
        for name, child in module.named_children()
        if type(child) is ExpertLinear
    ]


class Experts(nn.Module):
    """E SwiGLU experts (Shazeer 2020, https://arxiv.org/abs/2002.05202) of width F: ``fc`` (E, 2F, D)
    holds each expert's [gate; up] rows (the layout of zoo's fused GLU ``fc``), ``proj`` (E, D, F) its
    down projection."""

    def __init__(self, n: int, d_model: int, d_ff: int, *, bias: bool, std: float) -> None:
        super().__init__()
        self.fc = ExpertLinear(n, d_model, 2 * d_ff, bias=bias, std=std)
        self.proj = ExpertLinear(n, d_ff, d_model, bias=bias, std=std)

    def forward(self, x: Tensor, expert: int) -> Tensor:
        """x: (n, D) rows sent to ``expert`` -> (n, D)."""
        gate, up = self.fc(x, expert).chunk(2, dim=-1)  # (n, F) each
        return self.proj(F.silu(gate) * up, expert)

    def per_expert(self) -> int:
        """Parameters of one expert."""
        return sum(p[0].numel() for p in self.parameters())


@FFN.register("moe")
class MoE(FeedForward):
    """Top-k routed SwiGLU experts, dropless, with an optional shared expert (see the module docstring)."""

    gated: ClassVar[bool] = True  # its experts are GLUs: d_ff resolves as for swiglu
    reads_padding: ClassVar[bool] = True  # its losses skip padded positions
    reads: ClassVar[frozenset[str]] = frozenset(
        {"n_experts", "moe_top_k", "moe_renormalize", "moe_shared_expert", "moe_aux_loss_coef", "moe_z_loss_coef"}
    )

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        n_experts: int,
        top_k: int,
        renormalize: bool = True,
        shared_expert: bool = False,
        aux_loss_coef: float = 0.0,
        z_loss_coef: float = 0.0,
        bias: bool = False,
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        self.n_experts, self.top_k, self.renormalize = n_experts, top_k, renormalize
        self.aux_loss_coef, self.z_loss_coef = aux_loss_coef, z_loss_coef
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = Experts(n_experts, d_model, d_ff, bias=bias, std=init_std)
        self.shared = SwiGLU(d_model, d_ff, act=F.silu, bias=bias) if shared_expert else None
        self._losses: dict[str, Tensor] = {}

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Raise ConfigError for settings the router cannot use (ModelConfig.validate calls it)."""
        if cfg.moe_top_k > cfg.n_experts:
            raise ConfigError(
                f"moe_top_k={cfg.moe_top_k} exceeds n_experts={cfg.n_experts}: each token picks moe_top_k "
                f"of the experts; set moe_top_k <= {cfg.n_experts} or raise n_experts"
            )
        for name in ("moe_aux_loss_coef", "moe_z_loss_coef"):
            value = getattr(cfg, name)
            if not value >= 0:
                raise ConfigError(f"{name}={value} must be >= 0 (0 turns that loss off)")

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> MoE:
        return cls(
            cfg.d_model,
            cfg.resolved_d_ff,
            n_experts=cfg.n_experts,
            top_k=cfg.moe_top_k,
            renormalize=cfg.moe_renormalize,
            shared_expert=cfg.moe_shared_expert,
            aux_loss_coef=cfg.moe_aux_loss_coef,
            z_loss_coef=cfg.moe_z_loss_coef,
            bias=cfg.bias,
            init_std=cfg.init_std,
        )

    # ---- the hooks init, DeepNorm and the counters ask ---------------------------------------------
    def residual_projections(self) -> list[nn.Module]:  # type: ignore[override]  # modules with a .weight
        """The experts' stacked down projections (init draws all E with the depth-scaled std) and the
        shared expert's."""
        return [self.experts.proj, *([] if self.shared is None else self.shared.residual_projections())]

    def value_weights(self) -> list[Tensor]:
        """Every expert weight (stacked, whole) and the shared expert's; not the router, which, like
        attention's q and k, only forms scores (which experts, how much)."""
        shared = [] if self.shared is None else self.shared.value_weights()
        return [self.experts.fc.weight, self.experts.proj.weight, *shared]

    def mup_matrices(self) -> dict[str, list[Tensor]]:
        """The experts (stacked) and the shared expert are hidden; the router, (E, D) with E fixed as the
        width grows, is a readout: muP's output-weight rule (Tensor Programs V, table 3) without a
        multiplier on its logits, so nothing is left to fold at export."""
        hidden = [p for name, p in self.named_parameters() if p.ndim >= 2 and not name.startswith("router.")]
        return {"hidden": hidden, "readout": [self.router.weight]}

    def inactive_parameters(self) -> int:
        """Parameters one token does not use: those of the E - k experts it is not routed to
        (``zoo.stats`` counts the rest as active)."""
        return (self.n_experts - self.top_k) * self.experts.per_expert()

    def adapter_note(self) -> str:
        """Where LoRA reaches: the experts are stacked tensors, not ``nn.Linear`` layers."""
        shared = r", the shared expert '.*ffn\.shared\.(fc|proj)'" if self.shared is not None else ""
        return (
            "ffn=moe's experts are stacked (E, out, in) weights that LoRA cannot wrap: target its router "
            rf"'.*ffn\.router'{shared}, or train the experts whole with trainable=['.*ffn\.experts']"
        )

    def aux_losses(self) -> dict[str, Tensor]:
        return dict(self._losses)

    def __getstate__(self) -> dict[str, Any]:
        """A copy (pickle, deepcopy) leaves the last forward's losses behind: they belong to its graph."""
        return {**self.__dict__, "_losses": {}}

    # ---- forward -----------------------------------------------------------------------------------
    def route(self, logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Router logits (N, E) -> (probabilities (N, E) in float32, weights (N, k), chosen experts (N, k))."""
        probs = logits.float().softmax(dim=-1)  # (N, E)
        weights, chosen = probs.topk(self.top_k, dim=-1)  # (N, k) each, largest first
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return probs, weights, chosen

    def forward(self, x: Tensor, keep: Tensor | None = None) -> Tensor:
        """x: (B, T, D) -> (B, T, D); keeps the router's weighted losses for ``aux_losses``, over the
        positions that ``keep`` (B, T) marks True (None: all)."""
        flat = x.reshape(-1, x.shape[-1])  # (N, D)
        logits = self.router(flat)  # (N, E)
        probs, weights, chosen = self.route(logits)
        counts = torch.bincount(chosen.flatten(), minlength=self.n_experts)  # (E,) assignments per expert
        dispatch = self._dense if _exporting() else self._dispatch
        out = dispatch(flat, weights, chosen, counts)
        if self.shared is not None:
            out = out + self.shared(flat)
        kept = None if keep is None else keep.reshape(-1).to(probs.dtype)  # (N,) 1 = a real position
        self._losses = self._router_losses(logits, probs, chosen, counts, kept) if flat.shape[0] else {}
        return out.view_as(x)

    def _dispatch(self, x: Tensor, weights: Tensor, chosen: Tensor, counts: Tensor) -> Tensor:
        """x (N, D) through each token's k experts, weighted and summed: the N * k assignments grouped by
        expert (a stable sort), each expert run once on its group, the rows added back to their tokens."""
        expert_of = chosen.flatten()  # (N*k,) assignment i belongs to token i // k
        order = expert_of.argsort(stable=True)  # (N*k,) assignments grouped by expert, ascending
        token = order // self.top_k  # (N*k,) the token of each grouped assignment
        groups = x[token].split(counts.tolist())  # E pieces of (n_e, D)
        rows = [self.experts(group, e) for e, group in enumerate(groups) if group.shape[0]]
        if not rows:
            return torch.zeros_like(x)
        y = torch.cat(rows) * weights.flatten()[order, None].to(x.dtype)  # (N*k, D)
        return torch.zeros_like(x).index_add(0, token, y)  # (N, D)

    def _dense(self, x: Tensor, weights: Tensor, chosen: Tensor, counts: Tensor) -> Tensor:
        """What ``_dispatch`` computes with no shape that depends on the routing, for a graph traced once
        and run on any input (ONNX): every expert on every token, weighted by the token's routing
        weight for it (0 for the experts it did not choose). E / k times the experts' FLOPs."""
        gates = torch.zeros(x.shape[0], self.n_experts, dtype=x.dtype, device=x.device)  # (N, E)
        gates = gates.scatter(1, chosen, weights.to(x.dtype))
        out = torch.zeros_like(x)
        for e in range(self.n_experts):
            out = out + gates[:, e, None] * self.experts(x, e)  # (N, D)
        return out

    def _router_losses(
        self, logits: Tensor, probs: Tensor, chosen: Tensor, counts: Tensor, kept: Tensor | None
    ) -> dict[str, Tensor]:
        """The weighted load-balancing and z-losses (module docstring), those whose coefficient is not 0,
        over the positions where ``kept`` (N,) is 1 (None: every position). Padded positions are
        weighted by 0, not selected out, so a traced graph has no shape that depends on the padding."""
        n = None if kept is None else kept.sum().clamp(min=1)  # real positions (all padded: losses 0)
        losses = {}
        if self.aux_loss_coef:
            if kept is None:
                share = counts.to(probs.dtype) / counts.sum()  # f_e: (E,) fraction of the assignments
                mean_probs = probs.mean(dim=0)  # P_e: (E,)
            else:
                picks = F.one_hot(chosen, self.n_experts).sum(dim=1).to(probs.dtype)  # (N, E) picks per expert
                share = (picks * kept[:, None]).sum(dim=0) / (n * self.top_k)
                mean_probs = (probs * kept[:, None]).sum(dim=0) / n
            balance = self.n_experts * (share * mean_probs).sum()  # E * sum_e f_e P_e
            losses["moe_aux_loss"] = self.aux_loss_coef * balance
        if self.z_loss_coef:
            z = torch.logsumexp(logits.float(), dim=-1).square()  # (N,)
            losses["moe_z_loss"] = self.z_loss_coef * (z.mean() if kept is None else (z * kept).sum() / n)
        return losses

    def extra_repr(self) -> str:
        return f"top_k={self.top_k}, renormalize={self.renormalize}"


def _exporting() -> bool:
    """Whether an exporter traces the model (its graph must hold for every routing); torch.compile
    runs the sorted dispatch, breaking the graph where the group sizes are read."""
    return torch.onnx.is_in_onnx_export() or torch.jit.is_tracing() or torch.compiler.is_exporting()
