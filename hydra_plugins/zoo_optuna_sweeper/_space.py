"""The search space of a sweep: ``hydra.sweeper.params`` and the command line's sweeps, parsed with
Hydra's override grammar, as Optuna distributions (and back to override text for each trial)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, Transformer
from hydra.errors import OverrideParseException
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from hydra_plugins.zoo_optuna_sweeper._files import SweepError, first_line


@dataclass
class Param:
    """One searched override: its Optuna distribution and, for a choice, each option's override text."""

    key: str  # the override's key element, prefix included: "optimizer.lr", "model/position", "+foo"
    distribution: BaseDistribution
    choice_texts: list[str] | None = None

    def override(self, value: Any) -> str:
        if self.choice_texts is not None:
            index = int(self.distribution.to_internal_repr(value))
            return f"{self.key}={self.choice_texts[index]}"
        return f"{self.key}={value!r}" if isinstance(value, float) else f"{self.key}={value}"

    def grid_values(self) -> list[Any]:
        dist = self.distribution
        if isinstance(dist, CategoricalDistribution):
            return list(dist.choices)
        if isinstance(dist, IntDistribution):
            return list(range(dist.low, dist.high + 1, dist.step))
        if isinstance(dist, FloatDistribution) and dist.step is not None:
            n = round((dist.high - dist.low) / dist.step)
            return [float(Decimal(str(dist.low)) + i * Decimal(str(dist.step))) for i in range(n + 1)]
        raise SweepError(f"sampler=grid needs choice() or range() params; {self.key} is a continuous interval")


@dataclass
class SearchSpace:
    """The searched params and the overrides every trial gets, from ``hydra.sweeper.params`` and the
    command line (whose sweeps join the search and whose fixed values win over ``params``)."""

    params: dict[str, Param]
    fixed: list[str]

    @classmethod
    def parse(
        cls, params: Mapping[str, Any] | None, arguments: Sequence[str], config_loader: Any = None
    ) -> SearchSpace:
        lines = [override_line(key, value) for key, value in (params or {}).items()]
        parser = OverridesParser.create(config_loader=config_loader)
        searched: dict[str, Param] = {}
        fixed: dict[str, str] = {}
        for override in parse_each(parser, [*lines, *arguments]):
            name = override.key_or_group + (f"@{override.package}" if override.package else "")
            searched.pop(name, None)
            fixed.pop(name, None)
            if override.is_sweep_override():
                searched[name] = to_param(override)
            else:
                fixed[name] = override.input_line or f"{override.get_key_element()}={override.get_value_string()}"
        return cls(searched, list(fixed.values()))

    def distributions(self) -> dict[str, BaseDistribution]:
        return {name: p.distribution for name, p in self.params.items()}

    def overrides(self, values: Mapping[str, Any]) -> list[str]:
        return [*self.fixed, *(p.override(values[name]) for name, p in self.params.items())]

    def grid(self) -> dict[str, list[Any]]:
        return {name: p.grid_values() for name, p in self.params.items()}

    def digest(self) -> str:
        """8 hex digits naming this search: the same for the same params and fixed overrides."""
        text = repr(sorted(self.fixed)) + repr(
            sorted((n, repr(p.distribution), p.choice_texts) for n, p in self.params.items())
        )
        return hashlib.sha1(text.encode()).hexdigest()[:8]


def parse_each(parser: OverridesParser, lines: Sequence[str]) -> list[Override]:
    """The overrides, a line that is not override syntax (a ``params`` entry) a SweepError naming it."""
    overrides = []
    for line in lines:
        try:
            overrides += parser.parse_overrides([line])
        except OverrideParseException as error:
            raise SweepError(
                f"hydra.sweeper.params: {line!r} is not override syntax ({first_line(error)}); "
                f"write e.g. interval(1e-4, 1e-2), choice(a, b) or range(1, 4)"
            ) from None
    return overrides


def override_line(key: str, value: Any) -> str:
    """One ``params`` entry as an override: a string is override syntax, a YAML list a choice, and
    anything else a fixed value."""
    if isinstance(value, str):
        return f"{key}={value}"
    if isinstance(value, list):
        return f"{key}=choice({','.join(Transformer.str(v) for v in value)})"
    return f"{key}={Transformer.str(value)}"


def to_param(override: Override) -> Param:
    """A sweep override -> an Optuna distribution: choice -> categorical, range -> int/float with
    that step, interval -> float (``tag(log, ...)``: log scale; ``tag(int, ...)``: integers)."""
    key, sweep = override.get_key_element(), override.value()
    tags = set(getattr(sweep, "tags", ()) or ())
    unknown = tags - {"log", "int"}
    if unknown:
        raise SweepError(f"{key}: unknown tag(s) {sorted(unknown)}; the sweeper reads 'log' and 'int'")
    if override.is_choice_sweep():
        choices = [None if v is None else Transformer.encode(v) for v in override.sweep_iterator()]
        return Param(key, CategoricalDistribution(choices), list(override.sweep_string_iterator()))
    if override.is_range_sweep():
        values = sorted(override.sweep_iterator())
        if not values:
            raise SweepError(f"{key}: {override.get_value_string()} is empty")
        step = abs(sweep.step)
        if "log" in tags and step != 1:
            raise SweepError(f"{key}: a log-scale range needs step 1 (Optuna's rule), not {step}")
        if all(isinstance(v, int) for v in values):
            return Param(key, IntDistribution(values[0], values[-1], log="log" in tags, step=step))
        high = float(Decimal(str(values[0])) + (len(values) - 1) * Decimal(str(step)))
        return Param(key, FloatDistribution(float(values[0]), high, step=float(step)))
    if override.is_interval_sweep():
        low, high, log_scale = sweep.start, sweep.end, "log" in tags
        if "int" in tags:
            return Param(key, IntDistribution(int(low), int(high), log=log_scale))
        return Param(key, FloatDistribution(float(low), float(high), log=log_scale))
    raise SweepError(f"{key}: {override.get_value_string()} is not a sweep the Optuna sweeper reads")
