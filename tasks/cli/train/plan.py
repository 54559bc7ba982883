"""What a zoo-train run starts from, read and checked once from its composed config before anything
is built or written: the checkpoint it resumes (``ckpt_path=``), the weights it starts from
(``init_from=``: a zoo-train checkpoint, an HF folder or a GGUF file), the tokenizer those weights
were trained with, the checked model config, and the run directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig
from tokenizers import Tokenizer

import zoo
from tasks.cli.loading import read_checkpoint
from tasks.cli.pretrained import PretrainedSource, adopt_model, as_checkpoint, is_pretrained_source, pretrained_source
from tasks.cli.train.checks import check_composition, check_export
from tasks.data.tokenizers import Specials, read_tokenizer


@dataclass(frozen=True)
class RunPlan:
    """Args:
    run_dir: the run directory (``paths.output_dir``).
    writes: whether this process writes there (rank 0; a DDP run starts this script once per rank).
    model: the composed model config, checked; the sizes the data decides come later.
    ckpt_path: the checkpoint the run resumes (None: a new run), and ``resume`` what it holds.
    start: the weights the run starts from (``init_from``), in a checkpoint's layout; None: random.
    pretrained: whether ``start`` is a pretrained model (an HF folder, a GGUF file): it keeps its vocabulary.
    tokenizer: the tokenizer the weights were trained with and its special ids; None: the data
        module trains or loads its own.
    """

    run_dir: Path
    writes: bool
    model: zoo.ModelConfig
    ckpt_path: str | None
    resume: dict[str, Any] | None
    start: dict[str, Any] | None
    pretrained: bool
    tokenizer: tuple[Tokenizer, Specials] | None


def plan_run(cfg: DictConfig) -> RunPlan:
    """The plan of the run ``cfg`` describes; a bad combination, value or file stops it here, before
    any data is read. A pretrained ``init_from`` (unless the run resumes) makes its config ``cfg.model``."""
    from_source = is_pretrained_source(cfg.init_from)  # init_from=<HF folder, GGUF file>: model and tokenizer
    source = pretrained_source(cfg.init_from) if from_source and not cfg.ckpt_path else None  # (unless resuming)
    pretrained = adopt_model(cfg, source) if source else None  # the source's config becomes cfg.model
    model = check_composition(cfg)
    check_export(cfg, model)
    resume = read_checkpoint(cfg.ckpt_path, "ckpt_path") if cfg.ckpt_path else None
    start = read_checkpoint(cfg.init_from, "init_from") if cfg.init_from and not from_source else None
    run_dir, writes = Path(cfg.paths.output_dir), rank_zero_only.rank == 0
    return RunPlan(
        run_dir=run_dir,
        writes=writes,
        model=model,
        ckpt_path=cfg.ckpt_path,
        resume=resume,
        start=as_checkpoint(pretrained) if pretrained else start,
        pretrained=source is not None,
        tokenizer=weights_tokenizer(cfg, resume or start, source, None if writes else run_dir),
    )


def weights_tokenizer(
    cfg: DictConfig, checkpoint: dict[str, Any] | None, source: PretrainedSource | None, rank_dir: Path | None
) -> tuple[Tokenizer, Specials] | None:
    """The tokenizer the weights were trained with (a checkpoint's, or a pretrained source's); in a DDP
    process of rank > 0 (``rank_dir``: the run directory) the one rank 0 saved; None: the data's own."""
    if checkpoint:
        return checkpoint_tokenizer(checkpoint, cfg), checkpoint_specials(checkpoint)
    if source:
        return source.tokenizer()
    if rank_dir is not None and (rank_dir / "tokenizer.json").is_file():  # ranks > 0 start after rank 0 saved it
        return read_tokenizer(rank_dir / "tokenizer.json"), Specials.zoo()  # one tokenizer for every rank
    return None


def checkpoint_tokenizer(checkpoint: dict[str, Any], cfg: DictConfig) -> Tokenizer:
    """The tokenizer stored in a checkpoint; an explicit, different data.tokenizer_path is refused."""
    text = checkpoint.get("tokenizer_json")
    if not isinstance(text, str):
        raise zoo.CheckpointError("the checkpoint holds no tokenizer; pass a checkpoint written by zoo-train")
    tokenizer = Tokenizer.from_str(text)
    given = cfg.data.get("tokenizer_path")
    if given and read_tokenizer(given).to_str() != tokenizer.to_str() and not cfg.init_partial:
        raise zoo.ConfigError(
            f"data.tokenizer_path={given} differs from the tokenizer the checkpoint was trained "
            f"with; drop data.tokenizer_path (the checkpoint's is used) or set init_partial=true"
        )
    return tokenizer


def checkpoint_specials(checkpoint: dict[str, Any]) -> Specials:
    """The special ids of the checkpoint's tokenizer: zoo's own unless it recorded others (an HF folder's)."""
    record = checkpoint.get("tokenizer_specials")
    return Specials.from_record(record) if record else Specials.zoo()
