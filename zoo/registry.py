"""Name -> component registries.

Every component family (norm, position, ffn, ...) has one :class:`Registry`, filled by its
``register`` decorator. Configs hold names; models resolve them here at build time.

Register a component of your own with the same decorator the built-ins use::

    import zoo

    @zoo.register("norm", "scalenorm")
    class ScaleNorm(zoo.norm.Norm):
        @classmethod
        def from_config(cls, cfg: zoo.ModelConfig, dim: int) -> "ScaleNorm": ...

A family's registry takes subclasses of its base only (``Registry.bind``: :class:`zoo.norm.Norm`,
``Placement``, ``Position``, ``Sublayer`` for an FFN, ``AttentionKernel``, ``Mask``, ``ZooModel``), each a
:class:`Component`: every registered class answers ``check`` and ``reads``, and a wrong class is refused
when it is registered.

A component that reads a setting only some components read (``rope_base``, ``window``: not the
sizes or ``norm_eps``, which every model reads) declares it, ``reads = frozenset({"rope_base"})``;
``ModelConfig.validate`` refuses such a setting, away from its default, where no chosen component
declares it (:func:`readers`).

Packages can also ship components as plug-ins: declare an entry point in the ``zoo.plugins`` group
that points at a module; zoo imports it the first time a registry is read, and the module's
``@zoo.register`` decorators do the rest.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

if TYPE_CHECKING:
    from zoo.config import ModelConfig

T = TypeVar("T")

PLUGIN_GROUP = "zoo.plugins"


class ConfigError(ValueError):
    """A model configuration that cannot work. The message names the field and the fix."""


class Component:
    """What every registered component class answers (the base of each family's base class): the
    settings it reads besides the sizes every model reads (``reads``; see :func:`readers`), and a
    ``check`` of a config it cannot work with (``ModelConfig.validate`` calls it)."""

    reads: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Raise ConfigError for settings this component cannot work with."""


class Registry(Generic[T]):
    """A named family of components. Unknown names fail with the valid names and the closest one. A
    registry bound to a base class (``bind``) registers its subclasses only."""

    def __init__(self, family: str) -> None:
        self.family = family
        self._items: dict[str, T] = {}
        self.base: type | None = None

    def bind(self, base: type) -> None:
        """Take only subclasses of ``base`` from now on (the family's base class, once it is defined)."""
        self.base = base

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.family} {name!r} is already registered ({self._items[name]!r})")
            base = self.base
            if base is not None and not (isinstance(obj, type) and issubclass(obj, base)):
                raise TypeError(
                    f"{self.family} {name!r}: {obj!r} is not a subclass of {base.__module__}.{base.__qualname__}; "
                    f"register a subclass of it"
                )
            self._items[name] = obj
            return obj

        return decorator

    def unregister(self, name: str) -> T:
        """Remove ``name`` and return what it named (a test's or a session's own component);
        an unknown name is a ConfigError listing the valid ones."""
        obj = self.get(name)
        del self._items[name]
        return obj

    def get(self, name: str, *, field: str | None = None) -> T:
        _load_plugins()
        if name in self._items:
            return self._items[name]
        field = field or self.family
        valid = ", ".join(sorted(self._items))
        prefixes = sorted((n for n in self._items if str(name).startswith(n)), key=len)  # pre_norm -> pre
        close = prefixes[-1:] or difflib.get_close_matches(str(name), self._items, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{field}={name!r} is not a registered {self.family}; valid names: {valid}.{hint}")

    def names(self, pattern: str = "*") -> list[str]:
        _load_plugins()
        return sorted(n for n in self._items if fnmatch.fnmatch(n, pattern))

    def __contains__(self, name: object) -> bool:
        _load_plugins()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.family!r}, {self.names()})"


NORM: Registry[type[Component]] = Registry("norm")  # zoo.norm.Norm
NORM_PLACEMENT: Registry[type[Component]] = Registry("norm_placement")  # zoo.norm.Placement
POSITION: Registry[type[Component]] = Registry("position")  # zoo.position.Position
FFN: Registry[type[Component]] = Registry("ffn")  # zoo.sublayer.Sublayer
ATTENTION: Registry[type[Component]] = Registry("attention")  # zoo.kernels.AttentionKernel
MASK: Registry[type[Component]] = Registry("mask")  # zoo.mask.Mask
ARCH: Registry[type[Component]] = Registry("arch")  # zoo.zoo_model.ZooModel
MODELS: Registry[Callable[[], ModelConfig]] = Registry("model")  # presets: a function returning a config

REGISTRIES: dict[str, Registry[type[Component]]] = {
    r.family: r for r in (POSITION, NORM, NORM_PLACEMENT, FFN, ATTENTION, MASK, ARCH)
}


def register(family: str, name: str) -> Callable[[T], T]:
    """Decorator that registers ``obj`` under ``name`` in the registry of ``family``."""
    if family == "model":
        return MODELS.register(name)
    if family not in REGISTRIES:
        raise ValueError(f"unknown component family {family!r}; valid: {', '.join(REGISTRIES)}, model")
    return REGISTRIES[family].register(name)


def reads(component: type[Component]) -> frozenset[str]:
    """The component settings ``component`` reads: ModelConfig fields that only some components of
    a family read (``rope_base``, ``window``...), declared as its ``reads`` class attribute. Sizes and
    the settings every model reads (``d_model``, ``norm_eps``, ``dropout``...) are not listed; a class
    that declares none reads none (:class:`Component`'s default)."""
    return component.reads


def readers() -> dict[str, list[tuple[str, str]]]:
    """Each component setting some registered component reads -> (family, name) of every one that
    does, e.g. ``{"window": [("mask", "document"), ("mask", "sliding_window")], ...}``."""
    found: dict[str, list[tuple[str, str]]] = {}
    for family, registry in REGISTRIES.items():
        for name in registry.names():
            for field in sorted(reads(registry.get(name))):
                found.setdefault(field, []).append((family, name))
    return found


def list_components() -> dict[str, list[str]]:
    """Every component family and its registered names."""
    return {family: reg.names() for family, reg in REGISTRIES.items()}


_plugins_loaded = False


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in entry_points(group=PLUGIN_GROUP):
        ep.load()
