"""zoo-generate: what a checkpoint does with a prompt, by its task: continue it (generator),
translate it (translator), label it (classifier) or fill its <mask> tokens (mlm)."""

from __future__ import annotations

import sys

import hydra
import torch
from omegaconf import DictConfig

from tasks.cli.common import conf_dir, load_task, quote_free_text


@torch.no_grad()
def respond(task, task_name: str, cfg: DictConfig) -> str:
    prompt = str(cfg.prompt)
    if task_name == "generator":
        kwargs = dict(do_sample=cfg.do_sample, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p) \
            if cfg.do_sample else dict(do_sample=False)
        return task.generate_text(prompt, cfg.max_new_tokens, seed=cfg.seed, **kwargs)
    if task_name == "translator":
        task.num_beams, task.max_new_tokens = cfg.num_beams, cfg.max_new_tokens
        return task.translate([prompt])[0]
    if task_name == "classifier":
        ids = torch.tensor([task.tokenizer.encode(prompt).ids])
        probs = task(ids).softmax(-1)[0]
        top = probs.topk(min(cfg.top, len(probs)))
        return "\n".join(f"{task.label_names[int(i)]}\t{float(p):.3f}" for p, i in zip(top.values, top.indices,
                                                                                         strict=True))
    if task_name == "mlm":
        filled = task.fill_mask(prompt, top_k=cfg.top)
        if not filled:
            return "no <mask> token in the prompt"
        return "\n".join(f"<mask> #{n + 1}: " + ", ".join(f"{tok} ({p:.3f})" for tok, p in options)
                         for n, options in enumerate(filled))
    raise ValueError(f"unknown task {task_name!r}")


@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="generate")
def main(cfg: DictConfig) -> str:
    torch.manual_seed(cfg.seed)
    task, info = load_task(cfg.ckpt_path)
    text = respond(task, info["task"], cfg)
    print(text)
    return text


def cli() -> None:
    sys.argv = [sys.argv[0], *quote_free_text(sys.argv[1:])]
    main()


if __name__ == "__main__":
    cli()
