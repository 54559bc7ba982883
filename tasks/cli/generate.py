"""zoo-generate: what a checkpoint does with a prompt, by its task: continue it (generator),
translate it (translator), label it (classifier) or fill its <mask> tokens (mlm).

``prompt=`` passes through literally (``${...}`` is text, not an interpolation). A mistake (no or a
damaged checkpoint, an empty prompt, a setting out of range) ends in one ``zoo: …`` line, exit 2; a
generation cut short by the model's positions prints one ``zoo: warning: …`` line after the text.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

import zoo
from tasks import ZooTask
from tasks.cli.common import conf_dir, literal, load_task, quote_free_text, user_errors
from tasks.errors import UserError
from zoo.generation import GenerationLimitWarning, PromptError


def given(cfg: DictConfig, key: str, example: str) -> None:
    """A UserError unless the user gave ``key`` (it is ``???`` or null in the YAML)."""
    if OmegaConf.is_missing(cfg, key) or literal(cfg, key) is None:
        raise UserError(f"{key}= is required: {example}")


def prompt_of(task: ZooTask, cfg: DictConfig) -> str:
    """``prompt=`` exactly as given; a UserError when it is missing or gives the tokenizer nothing."""
    given(cfg, "prompt", 'the text to answer, e.g. prompt="def fib(n):"')
    prompt = literal(cfg, "prompt")
    if not task.tokenizer.encode(prompt, add_special_tokens=False).ids:
        raise UserError("prompt= gives no tokens; give some text")
    return prompt


def top_of(cfg: DictConfig) -> int:
    """``top=``: how many labels or tokens to show, at least one."""
    top = cfg.top
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise UserError(f"top={top!r} must be a whole number >= 1 (how many labels or tokens to show)")
    return top


def fitting_ids(task: ZooTask, prompt: str) -> list[int]:
    """The prompt's token ids (special tokens included) for an encoder; a UserError when they are
    more than its positions can number."""
    ids = task.tokenizer.encode(prompt).ids
    limit = task.model.max_positions
    if limit is not None and len(ids) > limit:
        raise UserError(f"prompt= is {len(ids)} tokens long but this model numbers at most {limit} positions "
                        f"(max_seq_len); shorten it")
    return ids


def continue_text(task: ZooTask, prompt: str, cfg: DictConfig) -> str:
    sampling = dict(do_sample=True, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p) \
        if cfg.do_sample else dict(do_sample=False)
    return task.generate_text(prompt, cfg.max_new_tokens, seed=cfg.seed, **sampling)


def translate(task: ZooTask, prompt: str, cfg: DictConfig) -> str:
    task.num_beams, task.max_new_tokens = cfg.num_beams, cfg.max_new_tokens
    return task.translate([prompt])[0]


def classify(task: ZooTask, prompt: str, cfg: DictConfig) -> str:
    probs = task(torch.tensor([fitting_ids(task, prompt)])).softmax(-1)[0]
    top = probs.topk(min(top_of(cfg), len(probs)))
    return "\n".join(f"{task.label_names[int(i)]}\t{float(p):.3f}" for p, i in zip(top.values, top.indices,
                                                                                     strict=True))


def fill_mask(task: ZooTask, prompt: str, cfg: DictConfig) -> str:
    top = top_of(cfg)
    fitting_ids(task, prompt)
    filled = task.fill_mask(prompt, top_k=top)
    if not filled:
        return "no <mask> token in the prompt"
    return "\n".join(f"<mask> #{n + 1}: " + ", ".join(f"{tok} ({p:.3f})" for tok, p in options)
                     for n, options in enumerate(filled))


ANSWERS: dict[str, Callable[[ZooTask, str, DictConfig], str]] = {
    "generator": continue_text, "translator": translate, "classifier": classify, "mlm": fill_mask}
"""How each task answers a prompt, by the task name a checkpoint records."""


@torch.no_grad()
def respond(task: ZooTask, task_name: str, cfg: DictConfig) -> str:
    """The answer of ``task`` to ``cfg.prompt``; a UserError for a task zoo-generate cannot answer
    and for a prompt the model cannot read."""
    answer = ANSWERS.get(task_name)
    if answer is None:
        raise UserError(f"the checkpoint's task {task_name!r} is not one zoo-generate answers ({', '.join(ANSWERS)});"
                        f" pass a checkpoint of one of those")
    prompt = prompt_of(task, cfg)
    try:
        return answer(task, prompt, cfg)
    except PromptError as error:
        raise UserError(f"prompt=: {error}") from None


@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="generate")
@user_errors
def main(cfg: DictConfig) -> str:
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int):
        raise UserError(f"seed={cfg.seed!r} must be a whole number")
    torch.manual_seed(cfg.seed)
    given(cfg, "ckpt_path", "a zoo-train checkpoint, e.g. ckpt_path=outputs/<run>/checkpoints/last.ckpt")
    task, info = load_task(cfg.ckpt_path)
    if task.tokenizer_json is None:
        raise zoo.CheckpointError(f"{cfg.ckpt_path} holds no tokenizer; pass a checkpoint that zoo-train wrote")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GenerationLimitWarning)
        text = respond(task, info["task"], cfg)
    print(text)
    for warning in caught:
        if issubclass(warning.category, GenerationLimitWarning):
            print(f"zoo: warning: {warning.message}", file=sys.stderr)
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
    return text


def cli() -> None:
    sys.argv = [sys.argv[0], *quote_free_text(sys.argv[1:])]
    main()


if __name__ == "__main__":
    cli()
