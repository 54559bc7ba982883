"""What the experiments share: the context they run in, the record they return, training through
zoo-train's own ``train()``, reading its metrics, and the figure helpers."""

from __future__ import annotations

import csv
import logging
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

import zoo

console = Console()
JOB_NAME = "zoo-article"  # Hydra's job name for the compose calls


@dataclass
class Context:
    """What every experiment gets: where to write, how big to run, the shared progress display."""

    out: Path
    work: Path
    quick: bool = False
    progress: Progress | None = None
    tokenizer: Path | None = None  # one BPE tokenizer shared by every training run (trained once)

    def step(self, text: str) -> None:
        """Advance the progress display by one unit and say what runs next."""
        if self.progress is not None:
            self.progress.update(self.progress.task_ids[0], advance=1, description=text)
        else:
            console.log(text)


VERDICTS = ("agrees", "partial", "does not", "not separable at this scale")
"""What an experiment may say of its claim: the numbers agree with it, agree in part, contradict it, or
cannot decide it here (the seeds' intervals overlap): the last is not a "no"."""


@dataclass
class Result:
    """One experiment's record: what ``results.json`` keeps and the results page shows."""

    number: int
    title: str
    claim: str
    setup: str
    headers: list[str]
    rows: list[list[Any]]
    figure: str
    observed: str
    agreement: str  # one of VERDICTS
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.agreement not in VERDICTS:
            raise ValueError(f"agreement={self.agreement!r} must be one of {VERDICTS}")

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def quiet() -> None:
    """Keep Lightning's per-run chatter out of the driver's output (the progress bar says what runs)."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "lightning_utilities"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", category=UserWarning)


def compose_train(overrides: Sequence[str]) -> Any:
    """zoo-train's config (``conf/train.yaml``) with ``overrides``, through Hydra's compose API; the
    caller has run ``tasks.cli.schemas.register_configs()`` once (driver.run does)."""
    from hydra import compose, initialize_config_dir

    from tasks.cli.schemas import conf_dir

    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3", job_name=JOB_NAME):
        return compose("train", overrides=list(overrides))


def train_run(ctx: Context, experiment: str, name: str, overrides: Sequence[str]) -> Path:
    """Train ``experiment=<experiment>`` with ``overrides`` through zoo-train's ``train()``.

    Returns the run directory (a fresh one: an earlier run's directory is never read back or deleted).
    Quick mode shrinks the run to a few steps.
    """
    from tasks.cli.train.training import train
    from tasks.run.run_dirs import claim_fresh

    run_dir = claim_fresh(ctx.work / experiment / re.sub(r"[^\w.-]+", "_", name))  # a name Hydra's grammar takes
    args = [
        f"experiment={experiment}",
        *overrides,
        f"paths.output_dir={run_dir}",
        "test=false",
        "callbacks=none",
        "logger=csv",
        "++trainer.enable_progress_bar=false",
        "++trainer.enable_checkpointing=false",
        "++trainer.enable_model_summary=false",
    ]
    if ctx.tokenizer is not None:
        args.append(f"data.tokenizer_path={ctx.tokenizer}")
    if ctx.quick:
        args += [
            "trainer.max_steps=6",
            "trainer.val_check_interval=3",
            "trainer.limit_val_batches=2",
            "trainer.log_every_n_steps=1",
            "data.source_args.max_files=40",
            "data.vocab_size=512",
            "task.sample_tokens=2",
            "trainer.num_sanity_val_steps=0",
        ]
    train(compose_train(args))
    return run_dir


def shared_tokenizer(ctx: Context) -> Path:
    """Train the byte-level BPE of the ablation experiments once, on their training split."""
    from hydra.utils import instantiate

    path = ctx.work / "tokenizer.json"
    extra = ["data.source_args.max_files=40", "data.vocab_size=512"] if ctx.quick else []
    cfg = compose_train(["experiment=ablation_positions", *extra, "paths.output_dir=/unused"])
    datamodule = instantiate(cfg.data, _convert_="all")
    datamodule.setup("fit")
    ctx.work.mkdir(parents=True, exist_ok=True)
    datamodule.tokenizer.save(str(path))
    return path


def read_metrics(run_dir: Path, key: str) -> list[tuple[int, float]]:
    """(step, value) pairs of one metric from the run's CSV log (``logs/metrics.csv``)."""
    rows = []
    with open(run_dir / "logs" / "metrics.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row.get(key) not in (None, ""):
                rows.append((int(row["step"]), float(row[key])))
    return rows


def ffn_parameters(model: zoo.ZooModel) -> int:
    """Parameters inside the FFN sub-modules of every block."""
    from zoo.ffn import MLP

    return sum(p.numel() for m in model.modules() if isinstance(m, MLP) for p in m.parameters())


# ---- figures --------------------------------------------------------------------------------------
def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(path: Path, fig: Any) -> str:
    """Write ``fig`` to ``path`` and close it; the file name is what the page links."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path.name


def plain_log_x(ax: Any, ticks: Sequence[int]) -> None:
    """A log x axis labelled only at ``ticks`` (no 2x10^2-style minor labels)."""
    from matplotlib.ticker import NullFormatter

    ax.set_xticks(list(ticks), [str(t) for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
