"""Experiment 5: generation time with and without the KV cache, and the cache's bytes against
``zoo.stats`` (the article's formula: 2 x layers x kv_heads x head_dim x length x bytes x batch)."""

from __future__ import annotations

import math
import time
from typing import Any

import torch

import zoo

from .common import Context, Result, plain_log_x, pyplot, save_figure
from .page import md_table

NUMBER, NAME, TITLE = 5, "kv_cache", "KV cache: time and memory"
TRAINS = False
UNITS = 5  # one per generation length
CLAIM = (
    "Without a cache generating t tokens recomputes every prefix, O(t^2) in total; with it each step is O(t) "
    "work on the new token; the cache costs 2 x layers x heads x d_head x length x bytes (article section 8)."
)
SETUP = (
    "A llama-tiny layout (RoPE, 4 layers, d_model 128, 4 heads, 2 KV heads, vocab 1024, random weights), "
    "`model.generate(prompt, t, use_cache=True|False, eos_token_id=None)` from a 1-token prompt, greedy, one "
    "thread. Memory: the keys and values held by `zoo.Cache` after a forward of t tokens at batch 2, against "
    "the formula as `zoo.stats(...).kv_cache_bytes` computes it."
)
HEADERS = ["tokens t", "s with cache", "s without", "ms/token with", "ms/token without", "speed-up"]
LAYOUT = dict(vocab_size=1024, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=2048)


def measured_cache_bytes(cache: zoo.Cache) -> tuple[int, int]:
    """(bytes of the keys and values held, bytes allocated) summed over every layer's cache tensors."""
    allocated = sum(
        c.k.numel() * c.k.element_size() + c.v.numel() * c.v.element_size()
        for c in cache.modules()
        if isinstance(c, zoo.KVCache) and c.k is not None
    )
    return cache.nbytes(), allocated


def fill_cache(model: zoo.ZooModel, seq_len: int, batch: int = 1) -> zoo.Cache:
    """Run ``seq_len`` tokens through ``model`` with a fresh cache and return the cache."""
    cache = model.new_cache(seq_len)
    ids = torch.randint(5, model.config.vocab_size, (batch, seq_len))
    with torch.no_grad():
        model(ids, cache=cache)
    return cache


def time_generation(model: zoo.ZooModel, new_tokens: int, use_cache: bool, repeats: int = 1) -> float:
    """Best-of-``repeats`` seconds for zoo's greedy ``generate`` to add ``new_tokens`` to a 1-token prompt."""
    prompt = torch.tensor([[7]])
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = model.generate(prompt, new_tokens, use_cache=use_cache, eos_token_id=None)
        best = min(best, time.perf_counter() - start)
        assert out.shape[1] == 1 + new_tokens
    return best


def cache_memory(lengths: list[int], batch: int = 2) -> list[dict[str, Any]]:
    """Bytes held and allocated by the cache after ``n`` tokens, and ``zoo.stats``' figure, in fp32 and bf16."""
    memory = []
    for dtype in (torch.float32, torch.bfloat16):
        model = zoo.create_model("llama-tiny", seed=0, **LAYOUT).to(dtype).eval()
        for n in lengths:
            used, allocated = measured_cache_bytes(fill_cache(model, n, batch=batch))
            stats = zoo.stats(model.config, seq_len=n, batch_size=batch, dtype=dtype).kv_cache_bytes
            memory.append(
                {
                    "dtype": str(dtype).removeprefix("torch."),
                    "seq": n,
                    "measured": used,
                    "allocated": allocated,
                    "zoo_stats": stats,
                }
            )
    return memory


def run(ctx: Context) -> Result:
    """Generation time with and without the cache, and cache bytes measured against zoo.stats."""
    lengths = [8, 16, 32] if ctx.quick else [32, 64, 128, 256, 512]
    model = zoo.create_model("llama-tiny", seed=0, **LAYOUT).eval()
    time_generation(model, 8, True)  # warm-up
    timing: dict[str, dict[int, float]] = {"cache": {}, "no cache": {}}
    for n in lengths:
        ctx.step(f"5: generate {n} tokens")
        timing["cache"][n] = time_generation(model, n, True)
        timing["no cache"][n] = time_generation(model, n, False)
    memory = cache_memory(lengths)
    rows = [
        [
            n,
            f"{timing['cache'][n]:.3f}",
            f"{timing['no cache'][n]:.3f}",
            f"{1e3 * timing['cache'][n] / n:.2f}",
            f"{1e3 * timing['no cache'][n] / n:.2f}",
            f"{timing['no cache'][n] / timing['cache'][n]:.1f}x",
        ]
        for n in lengths
    ]
    n0, n1 = lengths[0], lengths[-1]
    slope = {k: math.log(timing[k][n1] / timing[k][n0]) / math.log(n1 / n0) for k in timing}
    exact = all(m["measured"] == m["zoo_stats"] for m in memory)
    observed = (
        f"Total time grows as t^{slope['cache']:.2f} with the cache and t^{slope['no cache']:.2f} without "
        f"(log-log slope from {n0} to {n1} tokens); at {n1} tokens the cache is "
        f"{timing['no cache'][n1] / timing['cache'][n1]:.1f}x faster. Cache bytes equal the formula "
        f"{'exactly in every case' if exact else 'NOT in every case'} (fp32 and bf16, batch 2, GQA with 2 "
        "KV heads for 4 query heads). The allocated buffers can be larger: capacity doubles when it "
        "runs out."
    )
    agreement = "agrees" if exact and slope["no cache"] > slope["cache"] + 0.4 else "partial"
    return Result(
        NUMBER,
        TITLE,
        CLAIM,
        SETUP,
        HEADERS,
        rows,
        _figure(ctx, timing, memory, lengths),
        observed,
        agreement,
        data={
            "timing": {k: {str(n): v for n, v in d.items()} for k, d in timing.items()},
            "memory": memory,
            "slopes": slope,
        },
    )


def page_tables(record: dict[str, Any]) -> list[str]:
    """The page's table of cache bytes: measured against zoo.stats, per dtype and length."""
    rows = [
        [
            m["dtype"],
            m["seq"],
            m["measured"],
            m["zoo_stats"],
            m["allocated"],
            "yes" if m["measured"] == m["zoo_stats"] else "NO",
        ]
        for m in record["data"]["memory"]
    ]
    return [
        "Cache bytes, measured against the formula:",
        "",
        md_table(["dtype", "tokens", "measured bytes", "formula (zoo.stats)", "allocated", "equal"], rows),
        "",
    ]


def _figure(ctx: Context, timing: dict[str, dict[int, float]], memory: list[dict[str, Any]], lengths: list[int]) -> str:
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(10, 4))
    for key, style in (("cache", "-o"), ("no cache", "--s")):
        left.plot(lengths, [timing[key][n] for n in lengths], style, label=f"use_cache={key == 'cache'}")
    n0, n1 = lengths[0], lengths[-1]
    for key, power, style in (("cache", 1, ":"), ("no cache", 2, "-.")):
        left.plot(
            [n0, n1],
            [timing[key][n1] * (n0 / n1) ** power, timing[key][n1]],
            style,
            color="grey",
            linewidth=1,
            label=f"reference slope t^{power}",
        )
    left.set(
        xscale="log",
        yscale="log",
        xlabel="tokens generated t",
        ylabel="total seconds",
        title="Greedy generation time (zoo generate)",
    )
    for dt, marker in (("float32", "o"), ("bfloat16", "s")):
        pts = [m for m in memory if m["dtype"] == dt]
        right.plot([m["seq"] for m in pts], [m["measured"] / 2**20 for m in pts], marker, label=f"measured {dt}")
        right.plot([m["seq"] for m in pts], [m["zoo_stats"] / 2**20 for m in pts], "-", color="grey", linewidth=0.8)
    right.set(
        xscale="log",
        yscale="log",
        xlabel="cached tokens",
        ylabel="MiB (keys + values)",
        title="Cache bytes: measured (markers) vs formula (lines)",
    )
    for ax in (left, right):
        plain_log_x(ax, lengths)
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    return save_figure(ctx.out / "5_kv_cache.png", fig)
