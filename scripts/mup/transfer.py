"""muP's learning-rate transfer on the default experiment (gpt_generator: a gpt-tiny decoder on the
standard library's source): a grid of AdamW learning rates at several widths, under the standard
parametrization and under muP (base width 64). The question (Yang et al. 2022, "Tensor Programs V",
https://arxiv.org/abs/2203.03466, figure 1): does the best learning rate stay put as the width grows,
and is the wider model better at it?

    python -m scripts.mup.transfer                  # docs/mup/transfer.png and transfer.json
    python -m scripts.mup.transfer --widths 64 128 256 512 --steps 200 --seeds 2

Each run is what zoo-train builds for ``experiment=gpt_generator``: its composed config, its data
module (instantiated once, the same batches for every run), its ``GeneratorTask`` and the optimizer
and schedule the task configures (``tasks.optim.build_optimizer``, ``warmup_cosine``), with
zoo-train's gradient clipping at 1.0; only Lightning's Trainer is left out (its start-up costs more
than a small run). The runs are shrunk to fit two CPU cores (``SHRINK``): a slice of the corpus,
sequences of 64 tokens, batches of 8, ``--steps`` steps with a tenth of warm-up, the loss on 16
validation batches at the end. Heads are 16 wide at every width (their number grows).

The grid is in half-decades (1e-3, 3e-3, 1e-2, ...). Where a width's best rate is at an edge of the
grid, the grid is extended there (``--extend`` times at most), so that each best rate found is a
minimum rather than a boundary. Rates whose loss is within ``--gap`` of the width's best are rerun
with ``--seeds`` initialisations (the data order is the same), and the mean decides. At width 64,
muP's base, the muP model is the standard one (tests/test_mup.py), so those runs are shared.
With ``--follow-from W``, the widths from W on start from three rates only, the best rate of the
width before and its two neighbours (extended at the edges as above): a cheaper search that still
brackets each best rate. Every finished run is written to transfer.json at once; ``--resume`` keeps
the runs of an earlier, interrupted study with the same setup. ``--parametrizations mup`` runs one
of the two (two processes, each with its own ``--out``, share a machine's cores); with their runs in
one transfer.json, ``--replot`` writes its summary and figure again without training.
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

from scripts.mup.common import BASE, HEAD_DIM, OUT, panels, save, write_json
from tasks import GeneratorTask
from tasks.cli.schemas import conf_dir, model_config, register_configs
from tasks.optim import build_optimizer, warmup_cosine

LRS = (1e-3, 3e-3, 1e-2, 3e-2)
SHRINK = ["data.source_args.max_files=300", "data.vocab_size=1024", "data.seq_len=64", "data.batch_size=8"]
VAL_BATCHES = 16
KEYS = {"standard": False, "mup": True}


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


def half_decade(lr: float, step: int) -> float:
    """The rate ``step`` half-decades from ``lr`` on the grid 1, 3, 10, 30, ... (1e-3 -1 -> 3e-4)."""
    return float(f"{10 ** (round(2 * math.log10(lr)) / 2 + step / 2):.0e}")


def grid_steps(lr: float, reference: float) -> int:
    """How many half-decades ``lr`` lies above ``reference``."""
    return round(2 * math.log10(lr / reference))


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def sweep_row(evaluate, lrs, *, extend: int, seeds: int, gap: float) -> dict[float, list[float]]:
    """{lr: [val loss per seed]} for one width and parametrization: the grid, extended where the
    best rate is at its edge, then more seeds for the rates within ``gap`` of the best."""
    row = {lr: [evaluate(lr, 0)] for lr in sorted(lrs)}
    for _ in range(extend):
        best, low, high = min(row, key=lambda lr: mean(row[lr])), min(row), max(row)
        if best not in (low, high) or not math.isfinite(mean(row[best])):
            break
        new = half_decade(best, -1 if best == low else 1)
        row[new] = [evaluate(new, 0)]
    row = dict(sorted(row.items()))
    least = min(mean(losses) for losses in row.values())
    for lr, losses in row.items():
        if mean(losses) - least <= gap:
            losses.extend(evaluate(lr, seed) for seed in range(1, seeds))
    return row


def rows_of(runs: list[dict]) -> dict[str, dict[int, dict[float, list[float]]]]:
    """The rows of transfer.json's runs: {parametrization: {width: {lr: [val loss per seed]}}}."""
    rows: dict[str, dict[int, dict[float, list[float]]]] = {key: {} for key in KEYS}
    for r in runs:
        loss = math.inf if r["val_loss"] is None else r["val_loss"]
        rows[r["parametrization"]].setdefault(r["width"], {}).setdefault(r["lr"], []).append(loss)
    if BASE in rows["standard"]:
        rows["mup"][BASE] = rows["standard"][BASE]  # the same model
    return {key: {w: dict(sorted(by_width[w].items())) for w in sorted(by_width)} for key, by_width in rows.items()}


def summary(rows: dict[str, dict[int, dict[float, list[float]]]]) -> dict:
    """Per parametrization: each width's best rate, its loss, how many half-decades it lies from
    the narrowest width's best, and every width's loss at the narrowest width's best rate."""
    found = {}
    for key, by_width in rows.items():
        narrowest = min(by_width)
        best = {w: min(row, key=lambda lr, row=row: mean(row[lr])) for w, row in by_width.items()}
        anchor = best[narrowest]
        found[key] = {
            "best_lr": {str(w): lr for w, lr in best.items()},
            "best_loss": {str(w): mean(by_width[w][lr]) for w, lr in best.items()},
            "best_lr_steps_from_narrowest": {str(w): grid_steps(lr, anchor) for w, lr in best.items()},
            f"loss_at_lr_{anchor:g}": {
                str(w): mean(row[anchor]) if anchor in row else None for w, row in by_width.items()
            },
        }
    return found


def figure(rows: dict, setup: dict, path: Path) -> None:
    plt, fig, axes = panels()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for key, by_width in rows.items():
        ax = axes[key]
        for color, (width, row) in zip(colors, sorted(by_width.items()), strict=False):
            lrs = sorted(row)
            losses = [mean(row[lr]) if math.isfinite(mean(row[lr])) else float("nan") for lr in lrs]
            ax.plot(lrs, losses, marker="o", color=color, label=f"width {width}")
            best = min(lrs, key=lambda lr, row=row: mean(row[lr]))
            ax.plot([best], [mean(row[best])], marker="*", markersize=14, color=color)
        ax.set(xscale="log", xlabel="AdamW learning rate")
    save(
        fig,
        axes,
        ylabel=f"val/loss after {setup['steps']} steps (star: best)",
        title="Learning-rate transfer on gpt_generator (python -m scripts.mup.transfer)",
        path=path,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--lrs", type=float, nargs="+", default=list(LRS))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=1, help="initialisations for the rates near the best")
    parser.add_argument("--gap", type=float, default=0.05, help="how near the best a rate must be to get --seeds")
    parser.add_argument("--extend", type=int, default=2, help="half-decades the grid may grow past each edge")
    parser.add_argument("--follow-from", type=int, help="from this width on, start at the last best rate ±1 step")
    parser.add_argument("--parametrizations", nargs="+", choices=list(KEYS), default=list(KEYS))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on 2 shared cores)")
    parser.add_argument("--resume", action="store_true", help="keep the runs of transfer.json with the same setup")
    parser.add_argument("--replot", action="store_true", help="transfer.json's runs summed up again")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    register_configs()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    cfg = composed()
    data = instantiate(cfg.data, _convert_="all", _recursive_=False)
    data.setup("fit")
    setup = {
        "experiment": "gpt_generator",
        "overrides": SHRINK,
        "steps": args.steps,
        "base": BASE,
        "head_dim": HEAD_DIM,
        "optimizer": "adamw",
        "val_batches": VAL_BATCHES,
    }
    path = args.out / "transfer.json"
    runs: list[dict] = []
    if (args.resume or args.replot) and path.exists():
        earlier = json.loads(path.read_text())
        runs = [r for r in earlier["runs"] if earlier["setup"] == setup]
        print(f"resuming: {len(runs)} runs of {path}")
    done = {(r["parametrization"], r["width"], r["lr"], r["seed"]): r for r in runs}
    rows: dict[str, dict[int, dict[float, list[float]]]] = {key: {} for key in args.parametrizations}
    command = "python -m scripts.mup.transfer " + " ".join(
        [f"--widths {' '.join(map(str, args.widths))}", f"--steps {args.steps}", f"--seeds {args.seeds}"]
        + ([f"--follow-from {args.follow_from}"] if args.follow_from else [])
    )

    def record() -> dict:
        done_rows = {key: {w: row for w, row in by_width.items() if row} for key, by_width in rows.items()}
        return {
            "command": command,
            "date": time.strftime("%Y-%m-%d"),
            "setup": setup,
            "search": {
                "lrs": args.lrs,
                "follow_from": args.follow_from,
                "extend": args.extend,
                "seeds": args.seeds,
                "gap": args.gap,
            },
            "val_loss": {
                key: {str(w): {f"{lr:g}": mean(v) for lr, v in row.items()} for w, row in by_width.items()}
                for key, by_width in done_rows.items()
            },
            "summary": summary({k: v for k, v in done_rows.items() if v}),
            "seconds": round(time.perf_counter() - start),
            "run_seconds": round(sum(r["seconds"] for r in runs)),  # what the runs took, one after another
            "runs": runs,
        }

    if args.replot:
        rows = rows_of(runs)
        write_json(path, record())
        figure(rows, setup, args.out / "transfer.png")
        print(json.dumps(record()["summary"], indent=1))
        return
    for width in args.widths:
        for key in args.parametrizations:
            mup = KEYS[key]
            same = "standard" if width == BASE else key  # at the base width muP is the standard model

            def evaluate(lr: float, seed: int, width=width, mup=mup, same=same, key=key) -> float:
                if (same, width, lr, seed) not in done:
                    began = time.perf_counter()
                    loss = run(cfg, data, width, lr, mup=mup and same == key, steps=args.steps, seed=seed)
                    done[same, width, lr, seed] = {
                        "parametrization": same,
                        "width": width,
                        "lr": lr,
                        "seed": seed,
                        "val_loss": loss,
                        "seconds": round(time.perf_counter() - began, 1),
                    }
                    runs.append(done[same, width, lr, seed])
                    write_json(path, record())
                    print(
                        f"{key} width {width} lr {lr:g} seed {seed}: val loss {loss:.4f} "
                        f"({done[same, width, lr, seed]['seconds']} s; {time.perf_counter() - start:.0f} s in all)",
                        flush=True,
                    )
                loss = done[same, width, lr, seed]["val_loss"]
                return math.inf if loss is None else loss

            lrs = args.lrs
            if args.follow_from and width >= args.follow_from and rows[key]:
                last = rows[key][max(rows[key])]
                centre = min(last, key=lambda lr, last=last: mean(last[lr]))
                lrs = [half_decade(centre, step) for step in (-1, 0, 1)]
            rows[key][width] = sweep_row(evaluate, lrs, extend=args.extend, seeds=args.seeds, gap=args.gap)
        write_json(path, record())
        figure({k: v for k, v in rows.items() if v}, setup, args.out / "transfer.png")
    print(json.dumps(record()["summary"], indent=1))


if __name__ == "__main__":
    main()
