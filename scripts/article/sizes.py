"""Experiment 6: the presets' parameter counts against published figures; KV-cache bytes at 4K and 128K."""

from __future__ import annotations

from typing import Any

import torch

import zoo

from .common import Context, Result, ffn_parameters, pyplot, save_figure
from .page import md_table

NUMBER, NAME, TITLE = 6, "sizes", "The article's size table"
TRAINS = False
UNITS = 1
CLAIM = (
    "GPT-2 XL 1.5B (48 layers, 1600, 25 heads, d_k 64), GPT-3 175B, Llama 2 7B and 70B, Qwen2.5 72B (d_k 128); "
    "d_k is nearly always 64 or 128; about 2/3 of the parameters sit in the FFN; a 7B model's KV cache is about "
    "2.1 GB at 4096 tokens and about 66 GB at 128K (article sections 3, 6, 8)."
)
SETUP = (
    "`zoo.list_models()`, `zoo.stats(name)` (parameters counted on the meta device), `zoo.stats(name, "
    "seq_len=n, dtype=torch.bfloat16).kv_cache_bytes`. Published figures: the article's table where it has the "
    "model, otherwise the papers (column source in results.json)."
)
HEADERS = [
    "preset",
    "params (zoo, exact)",
    "published",
    "zoo / published",
    "layers/d_model/heads/d_k",
    "matches article row",
    "FFN share",
]
PUBLISHED_PARAMS: dict[str, tuple[float, str]] = {  # preset -> (published parameter count, where it comes from)
    "gpt2": (124e6, "Radford et al. 2019 / HF gpt2"),
    "gpt2-medium": (355e6, "Radford et al. 2019 / HF"),
    "gpt2-large": (774e6, "Radford et al. 2019 / HF"),
    "gpt2-xl": (1.5e9, "article table (1.5B)"),
    "gpt3-175b": (175e9, "article table (175B)"),
    "bert-base": (110e6, "Devlin et al. 2019"),
    "bert-large": (340e6, "Devlin et al. 2019"),
    "t5-small": (60e6, "Raffel et al. 2020"),
    "t5-base": (220e6, "Raffel et al. 2020"),
    "llama2-7b": (7e9, "article table (7B)"),
    "llama2-13b": (13e9, "Touvron et al. 2023"),
    "llama2-70b": (70e9, "article table (70B)"),
    "qwen2.5-72b": (72e9, "article table (72B)"),
}
ARTICLE_TABLE: dict[str, dict[str, int]] = {  # the article's section 3 table: layers, d_model, heads, d_k
    "gpt2-xl": {"n_layers": 48, "d_model": 1600, "n_heads": 25, "d_k": 64},
    "gpt3-175b": {"n_layers": 96, "d_model": 12288, "n_heads": 96, "d_k": 128},
    "llama2-7b": {"n_layers": 32, "d_model": 4096, "n_heads": 32, "d_k": 128},
    "llama2-70b": {"n_layers": 80, "d_model": 8192, "n_heads": 64, "d_k": 128},
    "qwen2.5-72b": {"n_layers": 80, "d_model": 8192, "n_heads": 64, "d_k": 128},
}
KV_MODELS = ("llama2-7b", "llama2-70b")


def meta_model(name: str) -> zoo.ZooModel:
    """Preset ``name`` built on the meta device (no memory, no initialisation)."""
    with torch.device("meta"):
        return zoo.build_model(zoo.get_config(name))


def preset_table() -> list[dict[str, Any]]:
    """One row per registered preset: sizes and exact parameter counts (meta device)."""
    out = []
    for name in zoo.list_models():
        model = meta_model(name)
        cfg, st, ffn = model.config, zoo.stats(model), ffn_parameters(model)
        published, source = PUBLISHED_PARAMS.get(name, (None, ""))
        out.append(
            {
                "name": name,
                "params": st.params,
                "non_embedding": st.non_embedding_params,
                "ffn": ffn,
                "ffn_share": ffn / st.non_embedding_params,
                "n_layers": cfg.n_layers,
                "d_model": cfg.d_model,
                "n_heads": cfg.n_heads,
                "d_k": cfg.resolved_head_dim,
                "kv_heads": cfg.resolved_n_kv_heads,
                "published": published,
                "source": source,
            }
        )
    return out


def kv_table() -> list[dict[str, Any]]:
    """``zoo.stats``' KV-cache bytes of one sequence of Llama 2 7B and 70B at 4K and 128K tokens, bf16 and fp16."""
    out = []
    for name in KV_MODELS:
        model = meta_model(name)
        for seq in (4096, 131072):
            for dtype in (torch.bfloat16, torch.float16):
                b = zoo.stats(model, seq_len=seq, dtype=dtype).kv_cache_bytes
                out.append(
                    {
                        "model": name,
                        "seq": seq,
                        "dtype": str(dtype).removeprefix("torch."),
                        "bytes": b,
                        "GB": b / 1e9,
                        "GiB": b / 2**30,
                    }
                )
    return out


def human(n: float) -> str:
    """``n`` in B, M or K with three significant digits."""
    return next((f"{n / s:.3g}{u}" for u, s in (("B", 1e9), ("M", 1e6), ("K", 1e3)) if n >= s), str(int(n)))


def run(ctx: Context) -> Result:
    """Preset parameter counts against published figures; Llama-2-7B KV-cache bytes at 4K and 128K."""
    ctx.step("6: count parameters of every preset (meta device)")
    table = preset_table()
    rows = []
    for r in table:
        ratio = r["params"] / r["published"] if r["published"] else None
        article = ARTICLE_TABLE.get(r["name"])
        shape_ok = "" if article is None else "yes" if all(article[k] == r[k] for k in article) else "NO"
        rows.append(
            [
                r["name"],
                f"{r['params']:,}",
                human(r["published"]) if r["published"] else "-",
                f"{ratio:.3f}" if ratio else "-",
                f"{r['n_layers']}/{r['d_model']}/{r['n_heads']}/{r['d_k']}",
                shape_ok,
                f"{r['ffn_share']:.2f}",
            ]
        )
    kv = kv_table()
    kv7 = {k["seq"]: k for k in kv if k["model"] == "llama2-7b" and k["dtype"] == "bfloat16"}
    ratios = [r["params"] / r["published"] for r in table if r["published"]]
    shapes_ok = all(row[5] == "yes" for row in rows if row[5])
    counts_ok = shapes_ok and min(ratios) > 0.9 and max(ratios) < 1.1 and round(kv7[4096]["GB"], 1) == 2.1
    agreement = ("agrees" if abs(kv7[131072]["GB"] - 66) < 1.3 else "partial") if counts_ok else "does not"
    return Result(
        NUMBER,
        TITLE,
        CLAIM,
        SETUP,
        HEADERS,
        rows,
        _figure(ctx, table),
        _observed(table, ratios, shapes_ok, kv7),
        agreement,
        data={"presets": table, "kv": kv},
    )


def page_tables(record: dict[str, Any]) -> list[str]:
    """The page's table of KV-cache sizes of one sequence."""
    rows = [
        [k["model"], k["seq"], k["dtype"], f"{k['bytes']:,}", f"{k['GB']:.2f}", f"{k['GiB']:.2f}"]
        for k in record["data"]["kv"]
    ]
    return [
        "KV cache of one sequence:",
        "",
        md_table(["model", "tokens", "dtype", "bytes", "GB (1e9)", "GiB"], rows),
        "",
    ]


def _figure(ctx: Context, table: list[dict[str, Any]]) -> str:
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(11, 4.5))
    pub = [r for r in table if r["published"]]
    x = list(range(len(pub)))
    left.bar(
        x,
        [r["params"] / r["published"] for r in pub],
        color=["tab:red" if r["name"] in ARTICLE_TABLE else "tab:blue" for r in pub],
    )
    left.axhline(1.0, color="black", linewidth=0.8)
    for i, r in enumerate(pub):
        left.text(i, r["params"] / r["published"], human(r["params"]), ha="center", va="bottom", fontsize=7)
    left.set_xticks(x, [r["name"] for r in pub], rotation=60, ha="right", fontsize=8)
    left.set(
        ylim=(0.9, 1.08),
        ylabel="exact count / published figure",
        title="Preset parameters vs published (red: in the article's table)",
    )
    seqs = [2**k for k in range(10, 18)]
    for name, style in zip(KV_MODELS, ("-o", "--s"), strict=True):
        model = meta_model(name)
        kv = [zoo.stats(model, seq_len=s, dtype=torch.bfloat16).kv_cache_bytes / 1e9 for s in seqs]
        right.plot(seqs, kv, style, label=f"{name} (bf16)")
    right.scatter([4096, 131072], [2.1, 66], color="red", zorder=5, label="article: 2.1 GB, ~66 GB")
    right.set(
        xscale="log",
        yscale="log",
        xlabel="context length (tokens)",
        ylabel="KV cache, GB (1e9 bytes)",
        title="KV cache of one sequence",
    )
    right.legend(fontsize=8)
    right.grid(True, which="both", alpha=0.3)
    return save_figure(ctx.out / "6_sizes.png", fig)


def _observed(table: list[dict[str, Any]], ratios: list[float], shapes_ok: bool, kv7: dict[int, dict[str, Any]]) -> str:
    exact = {r["name"]: r["params"] for r in table}
    share = {r["name"]: r["ffn_share"] for r in table}
    plain = [r["ffn_share"] for r in table if r["name"].startswith(("gpt2", "gpt3", "bert"))]
    return (
        f"{len(table)} presets; counts over published figures range {min(ratios):.3f}-{max(ratios):.3f} "
        f"(published figures are rounded: GPT-2 XL counts {human(exact['gpt2-xl'])}, Llama 2 7B "
        f"{human(exact['llama2-7b'])}, 70B {human(exact['llama2-70b'])}). Layers/d_model/heads/d_k of the "
        f"article's five rows: {'all match' if shapes_ok else 'a mismatch'}. FFN share of non-embedding "
        f"parameters: {min(plain):.2f}-{max(plain):.2f} for GPT/BERT (the article's 'about 2/3'), "
        f"{share['llama2-7b']:.2f} for Llama 2 7B, {share['llama2-70b']:.2f} and {share['qwen2.5-72b']:.2f} for "
        f"the GQA models (smaller K/V projections), {share['t5-base']:.2f} for T5 (cross-attention). Llama-2-7B "
        f"KV cache (bf16): {kv7[4096]['bytes']:,} bytes = {kv7[4096]['GB']:.2f} GB at 4K (article: 2.1 GB); "
        f"{kv7[131072]['bytes']:,} bytes = {kv7[131072]['GB']:.1f} GB = {kv7[131072]['GiB']:.0f} GiB at 128K "
        "(article: about 66 GB, which is neither unit's value; 66 GB is 126K tokens)."
    )
