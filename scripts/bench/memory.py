"""zoo-bench memory: the peak memory of one training step with and without activation checkpointing,
zoo beside Hugging Face ``transformers`` on the same GPT-2-like decoder, and zoo with its chunked loss.

    python scripts/bench/memory.py        # 12 layers, d 512, seq 512, batch 4: a few minutes on 2 CPU cores
    python scripts/bench/memory.py --vocab 8192 --loss-chunk 256 --out memory.json

Six variants, each in a fresh process: zoo with ``activation_checkpointing`` "none" and "all", HF
``GPT2LMHeadModel`` without and with its gradient checkpointing (``activation_checkpointing_enable()``,
formerly ``gradient_checkpointing_enable()``), and zoo "none" and "all" again with the output-layer loss
in chunks of ``--loss-chunk`` tokens (``zoo.chunked_cross_entropy``, what ``task.loss_chunk`` turns on:
the whole (B, T, V) logits never exist). All six compute the same function: the HF model is
built at random (seed 0) and zoo's copy of it comes from ``zoo.from_hf``; same batch, fp32, no
dropout, ``use_cache=False`` for HF, and one loss outside both models (next-token cross-entropy that
shifts the labels, not the logits, so no copy of the (B, T, V) logits is made). The losses printed
must agree.

One step is forward + loss + backward from a model without gradients (as ``zero_grad(set_to_none=True)``
leaves it), so the gradients made during backward count. The optimizer step is left out: AdamW's state
(twice the weights) is the same with or without checkpointing.

How memory is measured:

- CPU: growth of the process's peak resident set over the step: VmHWM after the step minus VmRSS before
  it, with VmHWM reset through /proc/self/clear_refs (Linux) once the model is built (the probe of
  ``hf_compare.py``). Resident memory counts every byte the step touches: tensors, autograd's buffers,
  oneDNN scratch. ``ru_maxrss`` cannot be reset and would hold the build's peak (the HF model and its
  zoo copy side by side), so it is not used. Freed memory that malloc keeps could hide growth (the step
  reusing blocks freed while building the model); the child runs with ``MALLOC_MMAP_THRESHOLD_=65536``
  so every allocation over 64 KiB is its own mapping, returned to the system when freed, and RSS
  follows the live tensors. (Checked once against the tensor-level peak of
  ``torch.distributed._tools.mem_tracker.MemTracker``: each variant within 35 MiB above it.)
- CUDA: ``torch.cuda.max_memory_allocated()`` over the step minus ``memory_allocated()`` before it.

Reported per variant: that growth in MiB, its ratio to the same side's plain step (no checkpointing,
whole logits) and zoo/HF at the same checkpointing (HF always with whole logits); the loss; seconds for
the one step, a rough hint of the recompute's cost only (one step, page faults from the malloc setting;
hf_compare.py measures speed).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # a checkout's scripts/bench/ is no package: its sibling is imported from here
    sys.path.insert(0, str(HERE))

from hf_compare import _peak_rss, _reset_peak_rss, hf_model, machine_info  # noqa: E402

import zoo  # noqa: E402

# (side, activation checkpointing, loss): the loss over the "whole" (B, T, V) logits, or "chunked"
VARIANTS = (
    ("zoo", "none", "whole"),
    ("zoo", "all", "whole"),
    ("hf", "none", "whole"),
    ("hf", "all", "whole"),
    ("zoo", "none", "chunked"),
    ("zoo", "all", "chunked"),
)
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072"}


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of (B, T, V) logits against the next token; the last position has none (ignored)."""
    labels = F.pad(ids[:, 1:], (0, 1), value=-100)  # (B, T): shifting the labels leaves the logits uncopied
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def build(side: str, checkpointed: bool, args: argparse.Namespace):
    """The model of one variant in train mode, and a function from token ids to logits."""
    torch.manual_seed(0)
    hf = hf_model("gpt2", layers=args.layers, d=args.d_model, heads=args.heads, vocab=args.vocab, ctx=args.length)
    if side == "hf":
        if checkpointed:
            enable = getattr(hf, "activation_checkpointing_enable", None) or hf.gradient_checkpointing_enable
            enable()
        model = hf.to(args.device).train()
        return model, lambda ids: model(input_ids=ids, use_cache=False).logits
    converted = zoo.from_hf(hf)
    cfg = converted.config.replace(activation_checkpointing="all" if checkpointed else "none")
    with torch.device("meta"):
        ours = zoo.build_model(cfg)
    ours.load_state_dict(converted.state_dict(), assign=True)
    del hf, converted
    ours = ours.to(args.device).train()
    return ours, ours


def probe(args: argparse.Namespace) -> dict[str, Any]:
    """In this (fresh) process: build one variant, run one step, return what it cost."""
    side, policy, loss_kind = args.probe.split(":")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, forward = build(side, policy == "all", args)
    ids = torch.randint(5, args.vocab, (args.batch, args.length), generator=torch.Generator().manual_seed(0))
    ids = ids.to(args.device)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    cuda = args.device.startswith("cuda")
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _reset_peak_rss()
    start = time.perf_counter()
    if loss_kind == "chunked":  # only zoo: its final hidden states, then the loss a chunk of logits at a time
        labels = F.pad(ids[:, 1:], (0, 1), value=-100)  # (B, T), as in next_token_loss
        loss = zoo.chunked_cross_entropy(model.features(ids), model.logits, labels, chunk=args.loss_chunk)
    else:
        loss = next_token_loss(forward(ids), ids)
    loss.backward()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if cuda else _peak_rss()
    assert all(p.grad is not None for p in model.parameters()), "a parameter got no gradient"
    return {
        "side": side,
        "checkpointing": policy,
        "loss_kind": loss_kind,
        "peak_mib": (peak - before) / 2**20,
        "loss": loss.item(),
        "seconds": seconds,
        "weights_mib": weights / 2**20,
    }


def in_fresh_process(script: Path, args: argparse.Namespace, probe: str) -> dict[str, Any]:
    """``script --probe <probe>`` with the settings of ``args`` (all but --out) in a fresh process with the
    malloc setting above; its result read from the last line it prints."""
    argv = [
        f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if v is not None and k not in ("out", "probe")
    ]
    cmd = [sys.executable, str(script), *argv, "--probe", probe]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **MALLOC_ENV})
    if done.returncode:
        raise RuntimeError(f"{script.name} --probe {probe} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def with_ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each result with its peak over the same side's plain step (no checkpointing, whole logits) and, for
    zoo, over HF's at the same checkpointing."""
    peak = {(r["side"], r["checkpointing"], r["loss_kind"]): r["peak_mib"] for r in results}
    for r in results:
        r["vs_plain"] = r["peak_mib"] / peak[(r["side"], "none", "whole")]
        r["zoo_vs_hf"] = r["peak_mib"] / peak[("hf", r["checkpointing"], "whole")] if r["side"] == "zoo" else None
    return results


def goals(results: list[dict[str, Any]]) -> dict[str, bool]:
    """The issue's two goals: zoo checkpointed <= 0.5x zoo plain, and below HF with its checkpointing;
    for zoo's checkpointing alone and with the chunked loss."""
    peak = {(r["side"], r["checkpointing"], r["loss_kind"]): r["peak_mib"] for r in results}
    plain, hf = peak[("zoo", "none", "whole")], peak[("hf", "all", "whole")]
    out = {}
    for loss_kind, name in (("whole", "zoo checkpointed"), ("chunked", "zoo checkpointed + chunked loss")):
        out[f"{name} <= 0.5x zoo plain"] = peak[("zoo", "all", loss_kind)] <= 0.5 * plain
        out[f"{name} < HF checkpointed"] = peak[("zoo", "all", loss_kind)] < hf
    return out


def print_table(out: dict[str, Any]) -> None:
    a = out["config"]
    title = (
        f"peak memory of one training step (forward + backward) on {a['device']}: {a['layers']} layers, "
        f"d {a['d_model']}, vocab {a['vocab']}, batch {a['batch']} x {a['length']}"
    )
    table = Table(title=title)
    for column in ("model", "checkpointing", "logits", "peak MiB", "vs plain", "zoo/HF", "loss", "seconds"):
        table.add_column(column, justify="left" if column in ("model", "checkpointing", "logits") else "right")
    for r in out["results"]:
        zoo_vs_hf = f"{r['zoo_vs_hf']:.2f}x" if r["side"] == "zoo" else ""
        logits = f"chunks of {a['loss_chunk']}" if r["loss_kind"] == "chunked" else "whole"
        table.add_row(
            "zoo" if r["side"] == "zoo" else "HF GPT2",
            r["checkpointing"],
            logits,
            f"{r['peak_mib']:,.0f}",
            f"{r['vs_plain']:.2f}x",
            zoo_vs_hf,
            f"{r['loss']:.5f}",
            f"{r['seconds']:.1f}",
        )
    console = Console(width=120)
    console.print(table)
    console.print(
        f"weights: {out['results'][0]['weights_mib']:,.0f} MiB (the gradients made during backward "
        "count in the peak; the weights do not)"
    )
    for goal, met in out["goals"].items():
        console.print(f"goal {goal}: {'met' if met else 'NOT met'}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/bench/memory.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=50257, help="GPT-2's by default")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--loss-chunk", type=int, default=512, help="tokens per chunk of the chunked-loss variants (default: 512)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)  # side:policy:loss, in the fresh process
    return parser


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Every variant in its own process; the table printed, the JSON written; what was measured returned."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(args)))
        return {}
    script = Path(__file__).resolve()
    results = with_ratios([in_fresh_process(script, args, ":".join(variant)) for variant in VARIANTS])
    out = {
        "machine": machine_info(parser),
        "config": {k: v for k, v in vars(args).items() if k != "probe"},
        "method": "CUDA max_memory_allocated" if args.device.startswith("cuda") else "VmHWM - VmRSS, fresh process",
        "results": results,
        "goals": goals(results),
    }
    print_table(out)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    run()
