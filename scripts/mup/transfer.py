"""muP's learning-rate transfer on the default experiment (gpt_generator: a gpt-tiny decoder on the
standard library's source): a grid of AdamW learning rates at several widths, under the standard
parametrization and under muP (base width 64). The question (Yang et al. 2022, "Tensor Programs V",
https://arxiv.org/abs/2203.03466, figure 1): does the best learning rate stay put as the width grows,
and is the wider model better at it?

    python -m scripts.mup.transfer                  # docs/mup/transfer.png and transfer.json
    python -m scripts.mup.transfer --widths 64 128 256 512 --steps 200   # a larger grid

Each run is what zoo-train builds for ``experiment=gpt_generator``: its composed config, its data
module (instantiated once, the same batches for every run), its ``GeneratorTask`` and the optimizer
and schedule the task configures (``tasks.optim.build_optimizer``, ``warmup_cosine``), with
zoo-train's gradient clipping at 1.0; only Lightning's Trainer is left out (its start-up costs more
than a small run). The runs are shrunk to fit two CPU cores (``SHRINK``): a slice of the corpus,
sequences of 64 tokens, batches of 8, ``--steps`` steps with a tenth of warm-up, the loss on 16
validation batches at the end. Heads are 16 wide at every width (their number grows).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tasks import GeneratorTask
from tasks.cli.schemas import conf_dir, model_config, register_configs
from tasks.optim import build_optimizer, warmup_cosine

OUT = Path(__file__).resolve().parents[2] / "docs" / "mup"
BASE = 64
HEAD_DIM = 16
LRS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
SHRINK = ["data.source_args.max_files=300", "data.vocab_size=1024", "data.seq_len=64", "data.batch_size=8"]
VAL_BATCHES = 16


def composed() -> object:
    """zoo-train's config for the default experiment, shrunk."""
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose("train", overrides=["experiment=gpt_generator", *SHRINK, "paths.output_dir=unused"])


def run(cfg, data, width: int, lr: float, *, mup: bool, steps: int, seed: int = 0) -> float:
    """The mean validation loss after ``steps`` steps (inf when the loss diverged)."""
    model = model_config(cfg.model).replace(
        d_model=width,
        n_heads=width // HEAD_DIM,
        head_dim=HEAD_DIM,
        mup_base_d_model=BASE if mup else None,
        **data.model_sizes(),
    )
    torch.manual_seed(seed)
    optimizer = {**OmegaConf.to_container(cfg.optimizer), "lr": lr}
    task = GeneratorTask(model=model.to_dict(), optimizer=optimizer)
    opt = build_optimizer(task, task.optimizer_settings)  # what configure_optimizers builds
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(max(1, steps // 10), steps, 0.1))
    batches = iter(data.train_dataloader())
    task.train()
    for _ in range(steps):
        loss = task.train_loss(next(batches))
        if not torch.isfinite(loss):
            return math.inf
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(task.parameters(), 1.0)  # trainer.gradient_clip_val
        opt.step()
        schedule.step()
    task.eval()
    with torch.no_grad():
        losses = [task.train_loss(b).item() for b, _ in zip(data.val_dataloader(), range(VAL_BATCHES), strict=False)]
    mean = sum(losses) / len(losses)
    return mean if math.isfinite(mean) else math.inf


def best(losses: dict[str, float]) -> str:
    return min(losses, key=losses.get)


def figure(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    titles = ("standard parametrization", "muP (base width 64)")
    for ax, key, title in zip(axes, ("standard", "mup"), titles, strict=True):
        for width, losses in record["val_loss"][key].items():
            lrs = [float(lr) for lr in losses]
            ax.plot(
                lrs,
                [losses[lr] if math.isfinite(losses[lr]) else float("nan") for lr in losses],
                marker="o",
                label=f"width {width}",
            )
        ax.set(xscale="log", xlabel="AdamW learning rate", title=title)
    axes[0].set_ylabel(f"val/loss after {record['setup']['steps']} steps")
    axes[1].legend()
    fig.suptitle("Learning-rate transfer on gpt_generator (python -m scripts.mup.transfer)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--lrs", type=float, nargs="+", default=list(LRS))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    register_configs()
    torch.set_num_threads(2)
    start = time.perf_counter()
    cfg = composed()
    data = instantiate(cfg.data, _convert_="all", _recursive_=False)
    data.setup("fit")
    losses: dict[str, dict[str, dict[str, float]]] = {"standard": {}, "mup": {}}
    for width in args.widths:
        for key, mup in (("standard", False), ("mup", True)):
            row = losses[key].setdefault(str(width), {})
            for lr in args.lrs:
                row[f"{lr:g}"] = run(cfg, data, width, lr, mup=mup, steps=args.steps)
                print(
                    f"{key} width {width} lr {lr:g}: val loss {row[f'{lr:g}']:.4f} "
                    f"({time.perf_counter() - start:.0f} s)",
                    flush=True,
                )
    record = {
        "command": "python -m scripts.mup.transfer "
        + " ".join([f"--widths {' '.join(map(str, args.widths))}", f"--steps {args.steps}"]),
        "date": time.strftime("%Y-%m-%d"),
        "setup": {
            "experiment": "gpt_generator",
            "overrides": SHRINK,
            "widths": args.widths,
            "lrs": args.lrs,
            "steps": args.steps,
            "base": BASE,
            "head_dim": HEAD_DIM,
            "optimizer": "adamw",
            "seed": 0,
        },
        "val_loss": losses,
        "best_lr": {key: {w: best(row) for w, row in rows.items()} for key, rows in losses.items()},
        "best_loss": {key: {w: min(row.values()) for w, row in rows.items()} for key, rows in losses.items()},
        "seconds": round(time.perf_counter() - start),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "transfer.json").write_text(json.dumps(record, indent=1) + "\n")
    figure(record, args.out / "transfer.png")
    print(json.dumps({k: record[k] for k in ("best_lr", "best_loss", "seconds")}, indent=1))


if __name__ == "__main__":
    main()
