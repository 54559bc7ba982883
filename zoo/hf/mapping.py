"""What every HF family shares: the :class:`Family` record, the registry :data:`FAMILIES`, and the
two weight mappers a family's weight map runs on.

A family describes its weights once, as a list of moves between zoo names and HF names
(``copy``: one tensor each side; ``fuse``: one zoo matmul from several HF ones, rows stacked in
order; ``stack``: one zoo tensor of n matrices, a mixture of experts' (n, out, in), from n groups of HF
linears). :class:`Importer` runs the moves from a HF state dict to zoo's, :class:`Exporter` runs the
same moves back, so the two directions cannot drift apart.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from zoo.config import ModelConfig
from zoo.io import CheckpointError
from zoo.registry import Registry

FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)  # what a weight may hold
GELU = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}  # HF ACT2FN name -> gelu_approximate


@dataclass(frozen=True)
class Family:
    """How zoo reads and writes one HF ``model_type``: the record :data:`FAMILIES` holds under that name.

    ``config`` reads a HF config (any object with its attributes) into a ModelConfig; ``weights``
    moves the tensors through a mapper and returns the config fitted to the heads found;
    ``write_config`` is the inverse of ``config`` (the HF config.json of a zoo config) and
    ``unfit`` lists the settings of a zoo config that the family's transformers classes cannot
    compute (empty: exportable). ``defaults`` are the HF config class's defaults for the attributes
    ``config`` reads, so a config.json (which leaves defaults out) is read without transformers.
    """

    config: Callable[[Any], ModelConfig]
    weights: Callable[[Mapper, ModelConfig], ModelConfig]
    backbone: tuple[str, ...]  # top-level modules of the backbone: an unused parameter under one is an error
    prefix: str = ""  # the backbone's name inside a task model (HF's base_model_prefix)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    write_config: Callable[[ModelConfig], dict[str, Any]] | None = None
    unfit: Callable[[ModelConfig], list[str]] | None = None
    ignored: tuple[str, ...] = ()  # saved buffers that carry no weights (old GPT-2's attn.bias, position_ids)
    architecture: Callable[[ModelConfig, bool], HFClass | None] | None = None
    """The transformers class ``to_hf`` writes for a config, with or without a sequence-classification
    head (None: the family has no such class)."""
    auto_classes: Mapping[str, str] = field(default_factory=dict)
    """Each transformers class ``architecture`` may write -> the Auto class that loads it (a model
    card's loading code and, through :data:`PIPELINE_TAGS`, its ``pipeline_tag``)."""


CAUSAL_LM = "AutoModelForCausalLM"
PIPELINE_TAGS = {  # the Hub's pipeline_tag of a folder each Auto class loads
    CAUSAL_LM: "text-generation",
    "AutoModelForSeq2SeqLM": "text2text-generation",
    "AutoModelForMaskedLM": "fill-mask",
    "AutoModelForSequenceClassification": "text-classification",
    "AutoModel": "feature-extraction",
}


@dataclass(frozen=True)
class HFClass:
    """What ``to_hf`` writes: transformers class ``name``, its backbone under the family's ``prefix``
    or not, the config its weight map runs with (the parts that class has), and tensors the class
    has but the zoo model lacks, written as zeros (name -> shape; e.g. BERT's token types)."""

    name: str
    prefixed: bool
    config: ModelConfig
    zeros: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


FAMILIES: Registry[Family] = Registry("HF model_type")  # filled by zoo.hf.families


class Mapper:
    """One direction of a family's weight map; ``base`` is the backbone's prefix (``"transformer."``)."""

    importing: bool
    base: str

    def copy(self, zoo: str, hf: str, *, bias: bool = False, transpose: bool = False) -> None:
        """zoo.weight (and .bias) <-> hf.weight (and .bias). ``transpose``: HF's ``Conv1D`` stores (in, out)."""
        raise NotImplementedError

    def fuse(self, zoo: str, hfs: Sequence[str], *, bias: bool = False, sizes: Sequence[int] | None = None) -> None:
        """One zoo linear <-> the rows of several HF linears stacked in order (q|k|v, k|v, gate|up);
        ``sizes``: the HF parts' output sizes (default: equal parts)."""
        raise NotImplementedError

    def stack(self, zoo: str, hfs: Sequence[Sequence[str]]) -> None:
        """zoo.weight, n matrices stacked (n, out, in) <-> n groups of HF linears: matrix i is the rows
        of the weights of ``hfs[i]`` stacked in order, equal parts (Mixtral's expert i: [w1; w3] is its
        [gate; up], [w2] its down projection)."""
        raise NotImplementedError

    def tensor(self, zoo: str, hf: Sequence[str]) -> None:
        """A single tensor (not a module's weight): the first of the HF names present when reading,
        the first name when writing."""
        raise NotImplementedError

    def has(self, hf: str, cfg_says: bool) -> bool:
        """Whether an optional part is there: the HF weights decide when reading, the config when writing."""
        raise NotImplementedError

    def lm_head(self, cfg: ModelConfig, embedding: str) -> ModelConfig:
        raise NotImplementedError

    def tied_head(self, hf: str, embedding: str, what: str) -> None:
        """A head HF ties to the embedding (BERT's MLM decoder); zoo always ties it."""
        raise NotImplementedError


class Importer(Mapper):
    """HF tensors (a model's parameters or a checkpoint's state dict) -> zoo's state dict in ``out``.
    A tensor saved once for two names (tied weights) is found under either name.

    Every tensor taken must be floating point and, where ``expected`` (zoo name -> shape, those of
    the model the config describes) knows its zoo tensor, of that shape: else a CheckpointError
    names the file holding it (``files``: HF name -> file; default ``owner``) and the config.json
    fields (``fields``) whose value the shape disagrees with. The tensors may be meta tensors (read
    from safetensors headers): then everything is checked before a weight is read."""

    importing = True

    def __init__(
        self,
        tensors: Mapping[str, Tensor],
        base: str,
        owner: str,
        *,
        expected: Mapping[str, tuple[int, ...]] | None = None,
        fields: Mapping[str, Any] | None = None,
        files: Mapping[str, str] | None = None,
    ) -> None:
        self.params, self.base, self.owner = dict(tensors), base, owner
        self.expected, self.fields, self.files = dict(expected or {}), dict(fields or {}), dict(files or {})
        self.used: set[str] = set()
        self.out: dict[str, Tensor] = {}

    def take(self, name: str, shape: Sequence[int] | None = None) -> Tensor:
        """A detached copy of tensor ``name`` (a full name, base prefix included), checked to be
        floating point and of ``shape`` (HF's layout) when given."""
        if name not in self.params:
            raise CheckpointError(
                f"zoo.from_hf: {self.owner} has no parameter {name!r}; the weights do not match its config.json"
            )
        tensor = self.params[name]
        if tensor.dtype not in FLOATS:
            raise CheckpointError(
                f"{self.files.get(name, self.owner)}: {name} holds {str(tensor.dtype)[6:]} values; "
                f"a model's weights are floating point (float32, float16, bfloat16): the file is "
                f"damaged or holds no weights"
            )
        if shape is not None and tuple(tensor.shape) != tuple(shape):
            raise CheckpointError(self._misfit(name, tuple(tensor.shape), tuple(shape)))
        self.used.add(name)
        return tensor.detach().clone()

    def _want(self, zoo: str, transpose: bool = False) -> tuple[int, ...] | None:
        shape = self.expected.get(zoo)
        return shape[::-1] if shape is not None and transpose else shape

    def _misfit(self, name: str, got: tuple[int, ...], want: tuple[int, ...]) -> str:
        where = self.files.get(name, self.owner)
        if len(got) == 2 and got == want[::-1]:
            return (
                f"{where}: {name} is stored transposed (shape {got}; config.json's sizes make it {want}); the "
                f"file is damaged or was not written by transformers: use the folder's original weights"
            )
        differ = {w for g, w in zip(got, want, strict=False) if g != w} if len(got) == len(want) else set(want)
        named = [
            f"{key}={value}"
            for key, value in self.fields.items()
            if type(value) is int and value in differ and not key.endswith("_token_id")
        ]
        by = f"config.json's {', '.join(named)}" if named else "config.json's sizes"
        return (
            f"{where}: {name} has shape {got} but {by} make{'s' if len(named) == 1 else ''} it {want}; "
            f"config.json and the weights come from different models: use the config.json saved with them"
        )

    def tied(self, a: str, b: str) -> bool:
        """Whether two parameters are one tensor (tied weights); meta tensors only when they are the same object."""
        pa, pb = self.params[a], self.params[b]
        return pa is pb or (not pa.is_meta and pa.data_ptr() == pb.data_ptr() and pa.shape == pb.shape)

    def copy(self, zoo: str, hf: str, *, bias: bool = False, transpose: bool = False) -> None:
        weight = self.take(f"{hf}.weight", self._want(f"{zoo}.weight", transpose))
        self.out[f"{zoo}.weight"] = weight.t().contiguous() if transpose else weight
        if bias:
            self.out[f"{zoo}.bias"] = self.take(f"{hf}.bias", self._want(f"{zoo}.bias"))

    def fuse(self, zoo: str, hfs: Sequence[str], *, bias: bool = False, sizes: Sequence[int] | None = None) -> None:
        for suffix in ("weight", "bias") if bias else ("weight",):
            whole = self._want(f"{zoo}.{suffix}")
            rows = list(sizes) if sizes else [whole[0] // len(hfs)] * len(hfs) if whole else [None] * len(hfs)
            parts = [
                self.take(f"{hf}.{suffix}", None if whole is None else (n, *whole[1:]))
                for hf, n in zip(hfs, rows, strict=True)
            ]
            self.out[f"{zoo}.{suffix}"] = torch.cat(parts)  # (sum out, in)

    def stack(self, zoo: str, hfs: Sequence[Sequence[str]]) -> None:
        whole = self._want(f"{zoo}.weight")  # (n, out, in)
        matrices = []
        for group in hfs:
            part = None if whole is None else (whole[1] // len(group), whole[2])
            matrices.append(torch.cat([self.take(f"{hf}.weight", part) for hf in group]))  # (out, in)
        self.out[f"{zoo}.weight"] = torch.stack(matrices)  # (n, out, in)

    def tensor(self, zoo: str, hf: Sequence[str]) -> None:
        present = [name for name in hf if name in self.params]
        self.out[zoo] = self.take(present[0] if present else hf[0], self._want(zoo))
        self.used.update(present)  # the others are the same tensor under a tied name

    def has(self, hf: str, cfg_says: bool) -> bool:
        return hf in self.params

    def lm_head(self, cfg: ModelConfig, embedding: str) -> ModelConfig:
        """Tie zoo's LM head when HF's ``lm_head`` is the embedding tensor (or was saved as it), else
        copy it. A model without an LM head gets zoo's tied one (its outputs before the head are exact)."""
        if "lm_head.weight" not in self.params:
            if not cfg.tie_embeddings:
                warnings.warn(
                    f"zoo.from_hf: {self.owner} has no lm_head and its config does not tie it; zoo's "
                    "LM head is tied to the embeddings, so only hidden states match",
                    stacklevel=4,
                )
            return cfg.replace(tie_embeddings=True)
        if self.tied("lm_head.weight", embedding):
            self.used.add("lm_head.weight")
            return cfg.replace(tie_embeddings=True)
        self.copy("lm_head", "lm_head")
        return cfg.replace(tie_embeddings=False)

    def tied_head(self, hf: str, embedding: str, what: str) -> None:
        if hf not in self.params:  # saved once, under the embedding's name
            return
        a, b = self.params[hf], self.params[embedding]
        if not (self.tied(hf, embedding) or a.is_meta or (a.shape == b.shape and torch.equal(a, b))):
            raise CheckpointError(
                f"zoo.from_hf: {what} is not tied to the word embeddings; zoo's head always uses the embedding matrix"
            )
        self.used.add(hf)

    def check_leftovers(self, backbone: tuple[str, ...], ignored: tuple[str, ...]) -> None:
        """Unused backbone tensors mean a feature zoo lacks or a config.json that describes fewer
        layers than the weights hold (an error); unused ones outside the backbone are a task head
        that zoo's library model leaves out (a warning)."""
        taken = {_identity(self.params[n]) for n in self.used}
        names = [
            n
            for n, t in self.params.items()
            if n not in self.used and _identity(t) not in taken and not n.endswith(ignored)
        ]
        weights = [n for n in names if n.removeprefix(self.base).split(".")[0] in backbone]
        if weights:
            raise CheckpointError(
                f"zoo.from_hf: {self.owner} has backbone weights zoo cannot place: {weights[:8]}; "
                f"its config.json describes fewer layers or parts than the weights hold"
            )
        if names:
            heads = sorted({n.rsplit(".", 1)[0] for n in names})
            warnings.warn(
                f"zoo.from_hf: {self.owner}'s task head ({', '.join(heads)}) is not part of zoo's "
                "library model and was left out; tasks build their own heads",
                stacklevel=3,
            )


def _identity(tensor: Tensor) -> tuple[Any, ...]:
    """What makes two names one tensor: the same storage and shape (a meta tensor is only itself)."""
    return (id(tensor),) if tensor.is_meta else (tensor.data_ptr(), tuple(tensor.shape))


class Exporter(Mapper):
    """zoo's state dict -> HF tensors in ``out`` (contiguous, one tensor per name; a tied HF weight is
    left out, as transformers saves it: its config ties it again on load)."""

    importing = False

    def __init__(self, state: Mapping[str, Tensor], base: str) -> None:
        self.state, self.base = dict(state), base
        self.out: dict[str, Tensor] = {}

    def _put(self, name: str, tensor: Tensor) -> None:
        self.out[name] = tensor.detach().contiguous().clone()

    def copy(self, zoo: str, hf: str, *, bias: bool = False, transpose: bool = False) -> None:
        weight = self.state[f"{zoo}.weight"]
        self._put(f"{hf}.weight", weight.t() if transpose else weight)
        if bias:
            self._put(f"{hf}.bias", self.state[f"{zoo}.bias"])

    def fuse(self, zoo: str, hfs: Sequence[str], *, bias: bool = False, sizes: Sequence[int] | None = None) -> None:
        for suffix in ("weight", "bias") if bias else ("weight",):
            whole = self.state[f"{zoo}.{suffix}"]
            parts = torch.split(whole, list(sizes) if sizes else whole.shape[0] // len(hfs))
            for hf, part in zip(hfs, parts, strict=True):
                self._put(f"{hf}.{suffix}", part)

    def stack(self, zoo: str, hfs: Sequence[Sequence[str]]) -> None:
        whole = self.state[f"{zoo}.weight"]  # (n, out, in)
        for matrix, group in zip(whole, hfs, strict=True):
            for hf, part in zip(group, matrix.chunk(len(group)), strict=True):
                self._put(f"{hf}.weight", part)

    def tensor(self, zoo: str, hf: Sequence[str]) -> None:
        self._put(hf[0], self.state[zoo])

    def has(self, hf: str, cfg_says: bool) -> bool:
        return cfg_says

    def lm_head(self, cfg: ModelConfig, embedding: str) -> ModelConfig:
        if not cfg.tie_embeddings:  # a tied zoo model written untied: its head is the embedding
            self._put("lm_head.weight", self.state.get("lm_head.weight", self.state["embed.weight"]))
        return cfg

    def tied_head(self, hf: str, embedding: str, what: str) -> None:
        pass  # tie_word_embeddings=True in the written config ties it on load


# ---- config readers' helpers -----------------------------------------------------------------------
def activation(name: str, *, gated: bool, field: str) -> dict[str, str]:
    """An HF activation name (and whether it gates a GLU) -> zoo's ``ffn`` and ``gelu_approximate``."""
    if name == "relu" and not gated:
        return {"ffn": "relu"}
    if name in GELU:
        return {"ffn": "geglu" if gated else "gelu", "gelu_approximate": GELU[name]}
    if name in ("silu", "swish") and gated:
        return {"ffn": "swiglu"}
    supported = ", ".join([*GELU, "silu"] if gated else ["relu", *GELU])
    raise ValueError(
        f"{field}: activation {name!r} ({'gated' if gated else 'not gated'}) has no zoo FFN; supported: {supported}"
    )


def token_id(c: Any, name: str) -> int | None:
    """A special token id from the config; lists give their first id; ids outside the vocabulary
    (as in a shrunk test config) are dropped with a warning."""
    value = getattr(c, name, None)
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    if value is None:
        return None
    if not 0 <= value < c.vocab_size:
        warnings.warn(
            f"zoo.from_hf_config: {name}={value} lies outside vocab_size={c.vocab_size}; left unset", stacklevel=4
        )
        return None
    return int(value)


def first(*values: int | None) -> int:
    return next(v for v in values if v is not None)
