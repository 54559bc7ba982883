"""muP's coordinate check (Yang et al. 2022, "Tensor Programs V", https://arxiv.org/abs/2203.03466,
appendix D.1): how far the logits and each block's output move in a few optimizer steps, against
width, under the standard parametrization and under muP.

A decoder of 2 layers with heads 16 wide (their number grows with the width), trained for a few
AdamW steps at one learning rate on one batch of random tokens; the movement is the mean
|activation after - activation before| over a fixed input. Under muP it stays flat across widths;
under the standard parametrization it grows with width, which is why the best learning rate moves.

    python -m scripts.mup.coord_check                     # docs/mup/coord_check.png and coord_check.json
    python -m scripts.mup.coord_check --optimizer muon    # the same under Muon: coord_check_muon.png/.json

The model is built with ``zoo.build_model`` and trained by ``tasks.optim.build_optimizer``: what a
user of the library or zoo-train gets.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

import zoo
from scripts.mup.common import BASE, HEAD_DIM, OUT, panels, save, write_json
from tasks.cli.schemas import conf_dir
from tasks.optim import build_optimizer

WIDTHS = (64, 128, 256, 512)


def model_config(width: int, *, mup: bool, vocab: int = 256, n_layers: int = 2) -> zoo.ModelConfig:
    """The checked decoder at ``width``: heads of HEAD_DIM, FFN 4 x width; muP's base is BASE."""
    return zoo.ModelConfig(
        vocab_size=vocab,
        d_model=width,
        n_layers=n_layers,
        n_heads=width // HEAD_DIM,
        head_dim=HEAD_DIM,
        d_ff=4 * width,
        max_seq_len=64,
        mup_base_d_model=BASE if mup else None,
    )


def movement(
    width: int,
    *,
    mup: bool,
    steps: int = 5,
    lr: float = 1e-2,
    seed: int = 0,
    batch: int = 4,
    seq_len: int = 16,
    optimizer: dict | None = None,
) -> dict[str, float]:
    """Mean |Δ activation| after ``steps`` optimizer steps at ``lr``: of the logits (``logits``) and of
    each block's output (``block0``, ``block1``, ...), on the batch it trained on."""
    torch.manual_seed(seed)
    cfg = model_config(width, mup=mup)
    model = zoo.build_model(cfg, seed=seed)
    settings = {"name": "adamw", "lr": lr, "weight_decay": 0.0, "betas": [0.9, 0.95], **(optimizer or {})}
    opt = build_optimizer(model, settings)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), generator=torch.Generator().manual_seed(seed))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]

    def activations() -> dict[str, torch.Tensor]:
        seen: dict[str, torch.Tensor] = {}
        hooks = [
            block.register_forward_hook(lambda _m, _i, out, i=i: seen.__setitem__(f"block{i}", out.detach()))
            for i, block in enumerate(model.decoder.blocks)
        ]
        with torch.no_grad():
            seen["logits"] = model(inputs)
        for hook in hooks:
            hook.remove()
        return seen

    before = activations()
    for _ in range(steps):
        loss = F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = activations()
    return {name: (after[name] - before[name]).abs().mean().item() for name in before}


def check(widths=WIDTHS, *, seeds=(0,), **settings) -> dict[str, dict[int, dict[str, float]]]:
    """{"standard"|"mup": {width: {activation: movement, mean over seeds}}}."""
    found: dict[str, dict[int, dict[str, float]]] = {}
    for name, mup in (("standard", False), ("mup", True)):
        found[name] = {}
        for width in widths:
            runs = [movement(width, mup=mup, seed=s, **settings) for s in seeds]
            found[name][width] = {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}
    return found


def growth(by_width: dict[int, dict[str, float]], name: str) -> float:
    """How many times as far ``name`` moves at the widest width as at the narrowest."""
    widths = sorted(by_width)
    return by_width[widths[-1]][name] / by_width[widths[0]][name]


MUON = {  # conf/optimizer/muon.yaml's settings, without weight decay (as AdamW's here) and at the check's lr
    key: value
    for key, value in OmegaConf.to_container(OmegaConf.load(Path(conf_dir()) / "optimizer" / "muon.yaml")).items()
    if key != "lr"
} | {"weight_decay": 0.0}
OPTIMIZERS = {"adamw": None, "muon": MUON}
NAMES = {"adamw": "AdamW", "muon": "Muon"}


def figure(found: dict, path: Path, optimizer: str = "adamw") -> None:
    import matplotlib.ticker

    _, fig, axes = panels()
    names = list(next(iter(found["mup"].values())))
    for key, ax in axes.items():
        widths = sorted(found[key])
        for name in names:
            ax.plot(widths, [found[key][w][name] for w in widths], marker="o", label=name)
        ax.set(xscale="log", yscale="log", xlabel="width (d_model)")
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    save(
        fig,
        axes,
        ylabel=f"mean |Δ activation| after 5 {NAMES[optimizer]} steps",
        title="Coordinate check: zoo decoder, 2 layers, head size 16, lr 1e-2 "
        f"(python -m scripts.mup.coord_check{'' if optimizer == 'adamw' else ' --optimizer ' + optimizer})",
        path=path,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adamw")
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    start = time.perf_counter()
    found = check(seeds=tuple(range(args.seeds)), optimizer=OPTIMIZERS[args.optimizer])
    suffix = "" if args.optimizer == "adamw" else f"_{args.optimizer}"
    record = {
        "command": "python -m scripts.mup.coord_check" + (f" --optimizer {args.optimizer}" if suffix else ""),
        "date": time.strftime("%Y-%m-%d"),
        "setup": {
            "widths": list(WIDTHS),
            "base": BASE,
            "head_dim": HEAD_DIM,
            "n_layers": 2,
            "steps": 5,
            "lr": 1e-2,
            "optimizer": OPTIMIZERS[args.optimizer] or "adamw",
            "seeds": args.seeds,
            "batch": 4,
            "seq_len": 16,
        },
        "movement": found,
        "growth_512_over_64": {k: {n: growth(found[k], n) for n in found[k][WIDTHS[0]]} for k in found},
        "seconds": round(time.perf_counter() - start, 1),
    }
    write_json(args.out / f"coord_check{suffix}.json", record)
    figure(found, args.out / f"coord_check{suffix}.png", args.optimizer)
    for key, ratios in record["growth_512_over_64"].items():
        print(key, {n: round(r, 2) for n, r in ratios.items()})
    print(f"{record['seconds']} s; wrote {args.out / f'coord_check{suffix}.json'} and coord_check{suffix}.png")


if __name__ == "__main__":
    main()
