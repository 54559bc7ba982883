"""Hugging Face models in and out.

    model = zoo.from_hf("path/to/folder")  # or "hf:org/name", or a loaded transformers model
    cfg = zoo.from_hf_config(hf.config)  # the config alone
    zoo.hf_exportable(model.config)  # "gpt2", "llama", ...; a ConfigError names what no HF class computes
    zoo.to_hf(model, "out")  # a folder transformers' Auto classes load, no trust_remote_code

Supported ``model_type``s: ``bert``, ``gemma2``, ``gpt2``, ``llama``, ``mistral``, ``mixtral``, ``modernbert``,
``olmo2``, ``qwen2``, ``qwen3``, ``t5``, one :class:`Family` record each in the registry :data:`FAMILIES`
(zoo/hf/gpt2.py, bert.py, t5.py, rope_decoders.py, gemma2.py, mixtral.py, olmo2.py, modernbert.py).
A family's weight map runs in both directions (zoo/hf/mapping.py); HF's separate projections are
fused into zoo's single matmuls by stacking rows and split again on the way out. ``transformers`` is
optional: a folder is read and written with safetensors and JSON alone.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.config import ModelConfig
from zoo.folders import atomic_folder
from zoo.hf import families as _families  # noqa: F401  (fill FAMILIES)
from zoo.hf import gemma2 as _gemma2  # noqa: F401  (registers gemma2 after rope_decoders' families)
from zoo.hf import mixtral as _mixtral  # noqa: F401  (registers mixtral)
from zoo.hf import modernbert as _modernbert  # noqa: F401  (registers modernbert)
from zoo.hf import olmo2 as _olmo2  # noqa: F401  (registers olmo2)
from zoo.hf import rope_decoders as _rope_decoders  # noqa: F401
from zoo.hf.folder import is_hf_folder, read_config, read_tensors, resolve, tensor_headers, weight_files, write_json
from zoo.hf.mapping import FAMILIES, PIPELINE_TAGS, Exporter, Family, HFClass, Importer
from zoo.io import CheckpointError, atomic_write_with
from zoo.models import ZooModel
from zoo.pretrained import DEPTHS, meta_model
from zoo.registry import ConfigError

__all__ = [
    "FAMILIES",
    "Family",
    "auto_class",
    "family_class",
    "from_hf",
    "from_hf_config",
    "hf_exportable",
    "is_hf_folder",
    "pipeline_tag",
    "resolve",
    "stored_dtypes",
    "to_hf",
]


def from_hf_config(hf_config: Any) -> ModelConfig:
    """A validated :class:`ModelConfig` with the sizes and components of a ``transformers`` config
    (or any object with its attributes, such as a read config.json).

    Heads depend on the model class, not on its config: a BERT config gives ``pooler=True`` and
    ``mlm_head=False`` (the ``BertModel`` layout), and a decoder's head tying follows
    ``tie_word_embeddings``. :func:`from_hf` adjusts both to the weights the model actually has.

    Raises:
        ValueError: for a model type not registered in ``FAMILIES``, or a setting of a supported
            one that zoo cannot reproduce (named in the message).
    """
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in FAMILIES:
        raise ValueError(
            f"model_type={model_type!r} is not supported by zoo.from_hf; supported model types: "
            f"{', '.join(FAMILIES.names())}"
        )
    return FAMILIES.get(model_type).config(hf_config).validate()


def from_hf(source: nn.Module | str | os.PathLike, *, dtype: torch.dtype | None = torch.float32) -> ZooModel:
    """The zoo model computing what a HF model computes, in eval mode, its weights loaded with
    ``load_state_dict(strict=True)`` and cast to ``dtype``: float32 unless told (a bf16 folder's
    logits are about 0.5 away from its float32 ones); ``dtype=None`` keeps each tensor's stored dtype
    (:func:`stored_dtypes` says which those are).

    ``source`` is a loaded ``transformers`` model (weights copied, same device), a folder as
    ``save_pretrained`` writes it (config.json + model.safetensors, sharded safetensors or
    pytorch_model.bin, read weights-only), or ``hf:<repo id>`` fetched through ``huggingface_hub``.
    Bare models (``GPT2Model``, ``BertModel``, ``LlamaModel``...), LM models (``GPT2LMHeadModel``,
    ``BertForMaskedLM``, ``T5ForConditionalGeneration``, ``LlamaForCausalLM``, ``Qwen2ForCausalLM``)
    and task models wrapping those backbones are read; task heads are left out with a warning.

    A folder is checked before a weight is read: config.json's values have transformers' types,
    its index names only shards beside it, and every tensor's shape and dtype (from the safetensors
    headers) fit the model config.json describes; else a CheckpointError names the file and field.
    """
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype={dtype}: zoo.from_hf casts weights to a floating dtype (or dtype=None keeps them)")
    return _from_hf(source).to(dtype) if dtype is not None else _from_hf(source)


def stored_dtypes(source: nn.Module | str | os.PathLike) -> set[torch.dtype]:
    """The floating dtypes a HF model or folder stores its weights in (a folder: read from the
    safetensors headers or, for pytorch_model.bin, from the weights), before :func:`from_hf` casts them."""
    if isinstance(source, nn.Module):
        tensors = dict(source.named_parameters())
    else:
        files = weight_files(resolve(source))
        tensors = tensor_headers(files)[0]
    return {t.dtype for t in tensors.values() if t.dtype.is_floating_point}


def _from_hf(source: nn.Module | str | os.PathLike) -> ZooModel:
    """:func:`from_hf` in the dtypes the weights are stored in."""
    if isinstance(source, nn.Module):
        prefix = "" if getattr(source, "base_model", source) is source else source.base_model_prefix
        tensors = dict(source.named_parameters(remove_duplicate=False))
        return _convert(source.config, tensors, prefix, type(source).__name__)
    folder = resolve(source)
    hf_config, files = read_config(folder), weight_files(folder)
    headers, where = tensor_headers(files)
    prefix = FAMILIES.get(hf_config.model_type).prefix
    prefix = prefix if prefix and any(n.startswith(f"{prefix}.") for n in headers) else ""
    fields = vars(hf_config)  # config.json over the family's defaults
    with warnings.catch_warnings():  # the checking pass: its warnings are the loading pass's
        warnings.simplefilter("ignore")
        _convert(hf_config, headers, prefix, str(folder), fields=fields, files=where, load=False)
    return _convert(hf_config, read_tensors(files, headers), prefix, str(folder), fields=fields, files=where)


def _convert(
    hf_config: Any,
    tensors: dict[str, torch.Tensor],
    prefix: str,
    owner: str,
    *,
    fields: dict[str, Any] | None = None,
    files: dict[str, str] | None = None,
    load: bool = True,
) -> ZooModel:
    """The zoo model of ``hf_config`` holding ``tensors`` (HF names), or, without ``load``, only the
    checks (``tensors`` may be meta tensors)."""
    cfg = _config(hf_config, owner, fields)
    family = FAMILIES.get(hf_config.model_type)
    source = f"{owner}/config.json" if fields is not None else owner
    for depth in DEPTHS:  # a layer count beyond the tensors held is refused before any model is built
        n = getattr(cfg, depth)
        if n is not None and n > len(tensors):
            named = [f"{k}={v}" for k, v in (fields or {}).items() if v == n and "layer" in k] or [f"{depth}={n}"]
            raise CheckpointError(
                f"{source}: {named[0]} describes more layers than the weights hold tensors "
                f"({len(tensors)}); use the config.json saved with these weights"
            )
    expected = {name: tuple(t.shape) for name, t in meta_model(cfg, source).state_dict().items()}
    base = f"{prefix}." if prefix else ""
    weights = Importer(tensors, base, owner, expected=expected, fields=fields, files=files)
    cfg = family.weights(weights, cfg)
    weights.check_leftovers(family.backbone, family.ignored)
    model = meta_model(cfg, source)  # no allocation: the copied HF tensors become the parameters
    for name, tensor in model.state_dict().items():  # the heads the first model lacked
        got = weights.out.get(name)
        if got is not None and got.shape != tensor.shape:
            raise CheckpointError(
                f"{owner}: the weights give {name} the shape {tuple(got.shape)} but config.json's "
                f"sizes make it {tuple(tensor.shape)}; use the config.json saved with them"
            )
    if not load:
        return model
    model.load_state_dict(weights.out, strict=True, assign=True)
    unset = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if unset:
        raise RuntimeError(f"zoo.from_hf left tensors without values: {unset[:5]}")
    return model.eval()


def _config(hf_config: Any, owner: str, fields: dict[str, Any] | None) -> ModelConfig:
    """:func:`from_hf_config`; for a folder (``fields`` given), a size no model can take is a
    CheckpointError naming its config.json."""
    if fields is None:
        return from_hf_config(hf_config)
    try:
        return from_hf_config(hf_config)
    except (TypeError, OverflowError, ConfigError) as error:
        raise CheckpointError(
            f"{owner}/config.json: its sizes make no model ({error}); use the config.json saved with these weights"
        ) from None


def hf_exportable(cfg: ModelConfig) -> str:
    """The HF ``model_type`` whose transformers classes compute ``cfg``'s model exactly.

    Raises:
        ConfigError: naming the settings no supported family computes (those of the closest one)
            and the formats that take any composition (zoo's safetensors folder, ONNX).
    """
    found = {name: FAMILIES.get(name).unfit(cfg) for name in FAMILIES.names() if FAMILIES.get(name).unfit}
    for name, problems in found.items():
        if not problems:
            return name
    name, problems = min(found.items(), key=lambda item: (item[1][0].startswith("arch="), len(item[1])))
    raise ConfigError(
        f"model.{problems[0].split(' (')[0]}: no transformers class computes this {cfg.arch}; the "
        f"closest, {name}, differs in {'; '.join(problems)}. Export it with format=safetensors or "
        f"format=onnx, or change those settings"
    )


def family_class(cfg: ModelConfig, *, classifier: bool = False) -> str:
    """The transformers class :func:`to_hf` writes for ``cfg`` (with a sequence-classification head)."""
    return _hf_class(cfg, classifier)[2].name


def auto_class(hf_class: str) -> str | None:
    """The Auto class of transformers that loads a folder of ``hf_class`` (a class zoo writes: its
    family's record says; None for another)."""
    families = (FAMILIES.get(name) for name in FAMILIES.names())
    return next((f.auto_classes[hf_class] for f in families if hf_class in f.auto_classes), None)


def pipeline_tag(hf_class: str) -> str | None:
    """The Hub's ``pipeline_tag`` of a folder of ``hf_class`` (None for a class zoo does not write)."""
    return PIPELINE_TAGS.get(auto_class(hf_class) or "")


def _hf_class(cfg: ModelConfig, classifier: bool) -> tuple[str, Family, HFClass]:
    name = hf_exportable(cfg)
    family = FAMILIES.get(name)
    written = family.architecture(cfg, classifier)
    if written is None:
        raise ConfigError(
            f"model.arch={cfg.arch}: transformers has no sequence-classification class zoo writes for "
            "this model; export it with format=safetensors or format=onnx"
        )
    if classifier and not cfg.pooler:
        raise ConfigError(
            "model.pooler=false: BertForSequenceClassification classifies the pooled first token; "
            "train the classifier with model.pooler=true, or export with format=safetensors or onnx"
        )
    return name, family, written


def to_hf(
    model: ZooModel,
    folder: str | os.PathLike,
    *,
    classifier: nn.Linear | None = None,
    label_names: list[str] | None = None,
    files: dict[str, str] | None = None,
    check: Callable[[Path], None] | None = None,
) -> str:
    """Write ``model`` as a HF model folder: config.json, model.safetensors (HF names, tied weights
    once), generation_config.json for a model that generates, and ``files`` (name -> text: tokenizer
    files, a model card). ``classifier``: a linear head over BERT's pooled output, written as
    ``BertForSequenceClassification`` with ``label_names``. The folder appears whole or not at all;
    an existing non-empty ``folder`` is refused. ``check(tmp)`` runs on the finished folder before it
    takes its name (raise to leave nothing behind). Returns the transformers class written. A muP model
    is written as the standard model that computes the same logits (``ZooModel.without_mup``), a model
    with padded vocabulary rows with its true vocabulary alone (``ZooModel.with_vocab_multiple(None)``).
    A failed write (a full disk) is an OSError naming the file of ``folder`` it was writing.

    Raises:
        ConfigError: for a composition no transformers class computes (see :func:`hf_exportable`),
            before anything is written.
    """
    from safetensors.torch import save_file

    model = model.without_mup()  # muP's multipliers folded into weights: transformers knows none
    model = model.with_vocab_multiple(None)  # the true vocabulary: padding rows (vocab_multiple_of) left out
    cfg = model.config
    name, family, written = _hf_class(cfg, classifier is not None)
    _check_files(files or {})
    state = dict(model.state_dict())
    dtype = next(model.parameters()).dtype
    for tensor, shape in written.zeros.items():
        state.setdefault(tensor, torch.zeros(shape, dtype=dtype))
    exporter = Exporter(state, f"{family.prefix}." if written.prefixed else "")
    family.weights(exporter, written.config)
    config = {
        "model_type": name,
        "architectures": [written.name],
        "torch_dtype": str(dtype).removeprefix("torch."),
        **family.write_config(written.config),
    }
    if classifier is not None:
        labels = _check_classifier(classifier, label_names, cfg)
        exporter.out["classifier.weight"] = classifier.weight.detach().contiguous().clone()
        exporter.out["classifier.bias"] = classifier.bias.detach().contiguous().clone()
        config |= {"id2label": dict(enumerate(labels)), "label2id": {label: i for i, label in enumerate(labels)}}
    with atomic_folder(folder) as tmp:
        write_json(tmp / "config.json", config)
        atomic_write_with(
            tmp / "model.safetensors", lambda path: save_file(exporter.out, str(path), metadata={"format": "pt"})
        )
        if type(model).decoding is not None:
            write_json(tmp / "generation_config.json", _generation_config(cfg, config))
        for file, text in (files or {}).items():
            (Path(tmp) / file).write_text(text)
        if check is not None:
            check(tmp)
    return written.name


def _check_classifier(head: nn.Linear, label_names: list[str] | None, cfg: ModelConfig) -> list[str]:
    """The label names of a classifier head that BertForSequenceClassification can hold."""
    if head.in_features != cfg.d_model or head.bias is None:
        raise ValueError(
            f"classifier: an nn.Linear({cfg.d_model}, n_labels) with a bias is what "
            f"BertForSequenceClassification holds, not {head}"
        )
    labels = list(label_names) if label_names is not None else [f"LABEL_{i}" for i in range(head.out_features)]
    if len(labels) != head.out_features:
        raise ValueError(f"label_names: {len(labels)} names for a head of {head.out_features} outputs")
    return labels


def _check_files(files: dict[str, str]) -> None:
    """Extra files are plain names inside the folder, never paths out of it or over its own files."""
    for name in files:
        if Path(name).name != name or name in ("", ".", "..", "config.json", "model.safetensors"):
            raise ValueError(f"files: {name!r} is not a plain file name for the export folder")


def _generation_config(cfg: ModelConfig, config: dict[str, Any]) -> dict[str, Any]:
    keys = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
    return {key: config[key] for key in keys if config.get(key) is not None}
