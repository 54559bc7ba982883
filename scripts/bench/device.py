"""GPU training throughput and MFU of a zoo decoder preset beside transformers' twin of it, eager and compiled:
the benchmark of scripts/gpu_check.sh (on a CPU, with a tiny preset, its dry run).

    python scripts/bench/device.py --preset gpt2 --batch 16 --length 1024 --steps 10 --json gpu_bench.json
    python scripts/bench/device.py --preset gpt2 --compile on --variants zoo zoo-loss-outside zoo-chunked zoo-blocks hf
    python scripts/bench/device.py --preset gpt-tiny --batch 2 --length 64 --steps 2 --device cpu --compile off

One process, one set of weights: the zoo preset built with seed 0 and written as a HF folder (``zoo.to_hf``),
which transformers loads (``GPT2LMHeadModel`` for the gpt presets). Every variant trains its own copy on the
same batch: bf16 autocast, fused AdamW, TF32 and SDPA on a GPU; fp32 on a CPU. A step is the loss, its
backward and the optimizer step. Variants (``--variants``):

- ``zoo``: the forward and the loss, ``F.cross_entropy(logits.float())``, as one function; compiled, the
  logits' upcast, softmax and their backward fuse into the graph instead of making (N, V) fp32 copies;
- ``zoo-loss-outside``: the model compiled alone (``model.compile()``, what ``compile: true`` does in zoo-train
  today), the loss eager after it (compiled only);
- ``zoo-chunked``: the loss ``zoo.chunked_cross_entropy`` (``--loss-chunk`` rows at a time, each chunk
  checkpointed, task.loss_chunk), compiled with the forward;
- ``zoo-blocks``: per-block (regional) compilation: each block compiled, and the head with the loss;
  embeddings and the final norm eager (compiled only);
- ``zoo-unpadded-vocab``: the ``zoo`` variant with the embedding and head rows of the true vocabulary alone
  (``vocab_multiple_of=1``; the gpt presets pad theirs to a multiple of 128, 50,257 -> 50,304 rows: aligned
  rows, whole tensor-core tiles): what the padding gains (the same loss either way);
- ``hf``: transformers' own training call, ``model(input_ids, labels=..., shift_labels=...).loss`` (the same
  targets), as one function.

Rounds alternate in rotating order, so drift hits every variant; the first calls (compilation) are not
timed. Reported per row: median tokens/s and its spread over rounds, model TFLOP/s and MFU in both conventions
(``zoo.stats``'s training FLOPs per token over the device's dense peak, ``zoo.stats.peak_flops``: ``mfu`` with
attention counted whole, ``mfu_causal`` with causal self-attention at half; model TFLOP/s counts it whole;
both count the true vocabulary, not the padding rows), peak memory of the step
(its model's weights, gradients and optimizer state plus what the step allocates), the ratio to ``hf`` at the
same compile setting, the graphs and graph breaks of what is compiled (``torch._dynamo.explain``, CPU too),
the kernels inductor generated for them (CPU too), CUDA kernels launched per step (torch.profiler, GPU only)
and the seconds the first call took (compilation).
The goals of the compiled ``zoo`` rows: MFU >= 45% (attention counted whole) and >= 1.3x ``hf`` compiled, each
said met or not.

A variant that fails (transformers' twin on a version without a keyword this script passes, a compile error,
out of memory) is a row with its ``error`` and no figures, printed as one line; every other variant is still
measured and written, and the script exits 1.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

import zoo
from zoo.io import atomic_write_text
from zoo.models import DecoderModel
from zoo.stats import peak_flops

VARIANTS = ("zoo", "zoo-loss-outside", "zoo-chunked", "zoo-blocks", "zoo-unpadded-vocab", "hf")
COMPILED_ONLY = ("zoo-loss-outside", "zoo-blocks")  # eager, these are the zoo variant
GOAL_MFU, GOAL_VS_HF = 0.45, 1.3


@dataclass
class Run:
    """One variant at one compile setting: its model copy, optimizer and step."""

    variant: str
    compile: bool
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss: Callable[[], torch.Tensor]  # the step's loss, compiled where the variant compiles
    traced: list[Callable[[], Any]]  # what it compiles, uncompiled: for torch._dynamo.explain
    rates: list[float]
    peak_bytes: int = 0
    first_call_s: float = 0.0
    generated_kernels: int | None = None  # kernels inductor wrote for its graphs (Triton on a GPU, C++ on a CPU)


def hf_twin(model: zoo.ZooModel, folder: str) -> torch.nn.Module:
    """transformers' model of the same weights: ``model`` written with ``zoo.to_hf`` and loaded back, in train
    mode, on SDPA, its loss named (no warning inside a compiled forward)."""
    from transformers import AutoModelForCausalLM

    zoo.to_hf(model, folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    hf.loss_type = "ForCausalLM"  # named: transformers' warning about an unnamed one breaks the compiled graph
    return hf.train()


def build_runs(
    zoo_model: zoo.ZooModel,
    hf: torch.nn.Module | None,
    ids: torch.Tensor,
    variants: list[str],
    compiles: tuple[bool, ...],
    *,
    loss_chunk: int,
    cuda: bool,
) -> list[Run]:
    """A Run per variant and compile setting, each on its own copy of the weights (compiling a block or a
    model changes it in place). ``ids``: (B, T + 1); the targets are the next tokens."""
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()  # (B, T) each
    runs = []
    for variant in variants:
        for compiled in compiles:
            if variant in COMPILED_ONLY and not compiled:
                continue
            model = copy.deepcopy(hf if variant == "hf" else zoo_model)
            if variant == "zoo-unpadded-vocab":
                model = model.with_vocab_multiple(None)
            loss, traced = _loss(variant, model, x, y, compiled=compiled, loss_chunk=loss_chunk)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
            runs.append(Run(variant, compiled, model, optimizer, loss, traced, []))
    return runs


def _loss(
    variant: str, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, compiled: bool, loss_chunk: int
) -> tuple[Callable[[], torch.Tensor], list[Callable[[], Any]]]:
    """(the step's loss, the functions it compiles) of a variant; x, y: (B, T) inputs and targets."""

    def cross_entropy(logits: torch.Tensor) -> torch.Tensor:  # (B, T, V) -> mean loss in fp32
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    compile = torch.compile if compiled else (lambda fn: fn)
    if variant in ("zoo", "zoo-unpadded-vocab"):
        whole = lambda: cross_entropy(model(x))  # noqa: E731
        return compile(whole), [whole]
    if variant == "zoo-chunked":
        chunked = lambda: zoo.chunked_cross_entropy(model.features(x), model.logits, y, chunk=loss_chunk)  # noqa: E731
        return compile(chunked), [chunked]
    if variant == "zoo-loss-outside":
        forward = torch.compile(model)  # shares the parameters; model.compile() in zoo-train
        return (lambda: cross_entropy(forward(x))), [lambda: model(x)]
    if variant == "zoo-blocks":
        blocks = list(model.decoder.blocks)
        inputs = model.decoder.prepare(x).local
        head = lambda h: cross_entropy(model.logits(h))  # noqa: E731
        compiled_head = torch.compile(head)
        for block in blocks:
            block.compile()
        h = torch.zeros(*x.shape, model.config.d_model, device=x.device)
        return (lambda: compiled_head(model.features(x))), [lambda: blocks[0](h, inputs), lambda: head(h)]
    hf_loss = lambda: model(input_ids=x, labels=y, shift_labels=y).loss  # noqa: E731
    return compile(hf_loss), [hf_loss]


def explain(fns: list[Callable[[], Any]], autocast: torch.autocast) -> tuple[int, int]:
    """(graphs, graph breaks) dynamo makes of ``fns`` (traced without compiling, under ``autocast``)."""
    graphs = breaks = 0
    for fn in fns:
        with autocast:
            result = torch._dynamo.explain(fn)()
        graphs, breaks = graphs + result.graph_count, breaks + result.graph_break_count
    return graphs, breaks


def cuda_kernels(step: Callable[[], None]) -> int | None:
    """CUDA kernels one call of ``step`` launches (torch.profiler); None where the profiler cannot tell."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        return sum(1 for event in prof.events() if event.device_type == DeviceType.CUDA)
    except RuntimeError as error:  # an optional figure: the run's timings matter more
        print(f"note: no kernel count ({error})")
        return None


def bench_device(
    preset: str,
    *,
    batch: int,
    length: int,
    steps: int,
    rounds: int,
    compiles: tuple[bool, ...],
    device: str,
    variants: list[str],
    loss_chunk: int = 4096,
    warmup: int = 2,
) -> list[dict[str, Any]]:
    """One row per variant and compile setting (see the module's docstring)."""
    from torch._inductor import metrics

    cuda = device.startswith("cuda")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    cfg = zoo.get_config(preset)
    longer = {"max_seq_len": length} if cfg.max_seq_len is not None and length > cfg.max_seq_len else {}
    zoo_model = zoo.create_model(preset, seed=0, **longer).train()
    if not isinstance(zoo_model, DecoderModel):
        raise SystemExit(f"scripts/bench/device.py trains decoders (next-token loss); {preset} is {cfg.arch}")
    hf, failed = None, []
    shape = {"preset": preset, "batch": batch, "length": length}
    if "hf" in variants:
        try:
            with tempfile.TemporaryDirectory() as folder:
                hf = hf_twin(zoo_model, str(Path(folder) / "hf")).to(device)
        except Exception as error:  # an older transformers: the twin is reported failed, zoo's rows stay
            failed += [_failed("hf", compiled, error, **shape) for compiled in compiles]
            variants = [v for v in variants if v != "hf"]
    zoo_model.to(device)
    ids = torch.randint(0, cfg.vocab_size, (batch, length + 1), generator=torch.Generator().manual_seed(0))
    runs = build_runs(zoo_model, hf, ids.to(device), variants, compiles, loss_chunk=loss_chunk, cuda=cuda)
    del zoo_model, hf
    autocast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=cuda)
    structure = {}
    for run in runs:
        try:
            structure[id(run)] = explain(run.traced, autocast) if run.compile else (None, None)
        except Exception:  # a trace that fails is no figure, not the end of the benchmark
            structure[id(run)] = (None, None)
    torch._dynamo.reset()  # explain's traces are not the compiled ones
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step(run: Run) -> None:
        with autocast:
            loss = run.loss()
        loss.backward()
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)

    for run in list(runs):  # first calls: compilation (forward and backward graphs), lazy optimizer state
        sync()
        metrics.reset()
        start = time.perf_counter()
        try:
            step(run)
            sync()
        except Exception as error:  # e.g. a keyword this transformers lacks: that run alone is lost
            failed.append(_failed(run.variant, run.compile, error, **shape))
            runs.remove(run)
            run.model = run.optimizer = None
            if cuda:
                torch.cuda.empty_cache()
            continue
        run.first_call_s = time.perf_counter() - start
        run.generated_kernels = metrics.generated_kernel_count if run.compile else None
    for run in runs:  # after every compilation: its worker processes may hold the CPU for a while
        for _ in range(warmup):
            step(run)
    for r in range(rounds):
        for run in runs[r % len(runs) :] + runs[: r % len(runs)]:
            held = _held_bytes(run)
            if cuda:
                sync()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            start = time.perf_counter()
            for _ in range(steps):
                step(run)
            sync()
            run.rates.append(batch * length * steps / (time.perf_counter() - start))
            if cuda:
                run.peak_bytes = max(run.peak_bytes, held + torch.cuda.max_memory_allocated() - base)
    kernels = {id(run): cuda_kernels(lambda run=run: step(run)) if cuda else None for run in runs}
    name = torch.cuda.get_device_name() if cuda else platform.processor() or "cpu"
    peak = _peak(name, device) if cuda else None
    counted = zoo.stats(cfg.replace(**longer) if longer else cfg, seq_len=length)
    flops = (counted.flops_per_token_train, counted.flops_per_token_train_causal)
    rows = [_row(run, preset, name, batch, length, steps, flops, peak, structure, kernels) for run in runs]
    rows += [{**row, "device": name} for row in failed]
    _compare(rows)
    return rows


def _failed(variant: str, compiled: bool, error: BaseException, **shape: Any) -> dict[str, Any]:
    """The row of a variant that could not run: what failed, in one line, and no figures."""
    message = (str(error).strip().splitlines() or [""])[0][:300]
    return {
        "model": "hf" if variant == "hf" else "zoo",
        "variant": variant,
        "compile": compiled,
        **shape,
        "error": f"{type(error).__name__}: {message}",
        "tokens_per_s": None,
        "mfu": None,
        "mfu_causal": None,
    }


def _held_bytes(run: Run) -> int:
    """Bytes its model's weights and optimizer state hold between steps (what a lone run would also hold)."""
    tensors = list(run.model.parameters()) + [
        t for state in run.optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)
    ]
    return sum(t.numel() * t.element_size() for t in tensors)


def _peak(name: str, device: str) -> float | None:
    """The device's dense bf16 peak: zoo's table (H100, H200), else Lightning's."""
    from lightning.fabric.utilities.throughput import get_available_flops

    return peak_flops(name, torch.bfloat16) or get_available_flops(torch.device(device), torch.bfloat16)


def _row(
    run: Run,
    preset: str,
    device: str,
    batch: int,
    length: int,
    steps: int,
    flops_per_token: tuple[int, int],
    peak: float | None,
    structure: dict[int, tuple[int | None, int | None]],
    kernels: dict[int, int | None],
) -> dict[str, Any]:
    tokens_per_s = statistics.median(run.rates)
    graphs, breaks = structure[id(run)]
    whole, causal = flops_per_token  # training FLOPs per token: attention counted whole, causal at half
    return {
        "model": "hf" if run.variant == "hf" else "zoo",
        "variant": run.variant,
        "compile": run.compile,
        "preset": preset,
        "device": device,
        "batch": batch,
        "length": length,
        "steps": steps,
        "rounds": len(run.rates),
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_spread": [min(run.rates), max(run.rates)],
        "step_ms": batch * length / tokens_per_s * 1e3,
        "model_tflops_per_s": tokens_per_s * whole / 1e12,
        "mfu": tokens_per_s * whole / peak if peak else None,
        "mfu_causal": tokens_per_s * causal / peak if peak else None,
        "peak_memory_gib": run.peak_bytes / 2**30 if run.peak_bytes else None,
        "graphs": graphs,
        "graph_breaks": breaks,
        "inductor_kernels": run.generated_kernels,
        "cuda_kernels_per_step": kernels[id(run)],
        "first_call_s": run.first_call_s,
        "vs_hf": None,
        "goal_mfu": None,
        "mfu_met": None,
        "goal_vs_hf": None,
        "vs_hf_met": None,
    }


def _compare(rows: list[dict[str, Any]]) -> None:
    """Each row's ratio to ``hf`` at its compile setting; the goals on the compiled zoo rows."""
    hf = {row["compile"]: row["tokens_per_s"] for row in rows if row["model"] == "hf" and not row.get("error")}
    for row in rows:
        if row.get("error"):
            continue
        if row["compile"] in hf:
            row["vs_hf"] = row["tokens_per_s"] / hf[row["compile"]]
        if row["model"] == "zoo" and row["compile"]:
            row["goal_mfu"], row["goal_vs_hf"] = GOAL_MFU, GOAL_VS_HF
            row["mfu_met"] = None if row["mfu"] is None else row["mfu"] >= GOAL_MFU
            row["vs_hf_met"] = None if row["vs_hf"] is None else row["vs_hf"] >= GOAL_VS_HF


def time_steps(step: Callable[[], None], steps: int, *, warmup: int, cuda: bool) -> float:
    """Seconds for ``steps`` calls of ``step`` after ``warmup`` untimed ones (and compilation), the
    device synchronised around the timed ones (scripts/bench/flex.py times its runs so)."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return time.perf_counter() - start


def bench_device_training(
    preset: str, *, batch: int, length: int, steps: int, compile: bool, device: str
) -> dict[str, Any]:
    """The ``zoo`` variant's row alone, at one compile setting, one round."""
    return bench_device(
        preset, batch=batch, length=length, steps=steps, rounds=1, compiles=(compile,), device=device, variants=["zoo"]
    )[0]


def report(rows: list[dict[str, Any]]) -> None:
    console = Console(width=160)  # the whole table in a log too
    for row in rows:
        if row.get("error"):
            compiled = "compiled" if row["compile"] else "eager"
            console.print(f"{row['variant']} {compiled} FAILED: {row['error']}", markup=False, highlight=False)
    rows = [row for row in rows if not row.get("error")]
    if not rows:
        return
    first = rows[0]
    table = Table(title=f"{first['preset']} on {first['device']}, batch {first['batch']} x {first['length']}")
    table.add_column("variant", no_wrap=True)
    columns = ("compile", "tokens/s (min..max)", "step ms", "MFU", "MFU causal", "TFLOP/s", "peak GiB", "vs hf")
    for column in (*columns, "graphs/breaks"):
        table.add_column(column, justify="right")
    for column in ("inductor kernels", "CUDA kernels/step", "first call s"):
        table.add_column(column, justify="right")

    def show(value: Any, form: str) -> str:
        return "n/a" if value is None else format(value, form)

    for row in rows:
        low, high = row["tokens_per_s_spread"]
        graphs = "-" if row["graphs"] is None else f"{row['graphs']}/{row['graph_breaks']}"
        table.add_row(
            row["variant"],
            "on" if row["compile"] else "off",
            f"{row['tokens_per_s']:,.0f} ({low:,.0f}..{high:,.0f})",
            f"{row['step_ms']:.1f}",
            show(row["mfu"], ".1%"),
            show(row["mfu_causal"], ".1%"),
            f"{row['model_tflops_per_s']:.1f}",
            show(row["peak_memory_gib"], ".2f"),
            show(row["vs_hf"], ".2f"),
            graphs,
            show(row["inductor_kernels"], "d"),
            show(row["cuda_kernels_per_step"], "d"),
            f"{row['first_call_s']:.1f}",
        )
    console.print(table)
    console.print("MFU: attention FLOPs counted whole (PaLM, nanoGPT); MFU causal: causal self-attention at half")
    for row in rows:
        if row["goal_mfu"] is None:
            continue
        mfu = "n/a (no peak FLOP/s for this device)" if row["mfu_met"] is None else _met(row["mfu_met"])
        ratio = "n/a (no compiled hf row)" if row["vs_hf_met"] is None else _met(row["vs_hf_met"])
        console.print(f"goals of {row['variant']} compiled: MFU >= {GOAL_MFU:.0%}: {mfu}; >= {GOAL_VS_HF}x hf: {ratio}")


def _met(met: bool) -> str:
    return "met" if met else "NOT met"


def device_main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Training throughput and MFU of zoo and transformers, eager and compiled (scripts/gpu_check.sh)."""
    parser = argparse.ArgumentParser(
        prog="scripts/bench/device.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="gpt2", help="a zoo decoder preset (transformers loads its to_hf folder)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, in rotating order over the variants")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--compile",
        choices=("off", "on", "both"),
        default="both",
        help="torch.compile off, on, or both rows per variant (inductor on a CPU takes minutes)",
    )
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=["zoo", "hf"])
    parser.add_argument("--loss-chunk", type=int, default=4096, help="rows per chunk of zoo-chunked's loss")
    parser.add_argument("--json", default="gpu_bench.json", help="write the rows here (its folder is created)")
    args = parser.parse_args(argv)
    rows = bench_device(
        args.preset,
        batch=args.batch,
        length=args.length,
        steps=args.steps,
        rounds=args.rounds,
        compiles={"off": (False,), "on": (True,), "both": (False, True)}[args.compile],
        device=args.device,
        variants=args.variants,
        loss_chunk=args.loss_chunk,
    )
    report(rows)
    atomic_write_text(args.json, json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    sys.exit(1 if any(row.get("error") for row in device_main()) else 0)  # the rows that ran are written
