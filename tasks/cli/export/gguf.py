"""``zoo-export format=gguf``: ``<out>/model.gguf``, the file llama.cpp, Ollama and LM Studio run, with
the task's tokenizer, special ids and whether llama.cpp puts bos before a text (``zoo.to_gguf``), beside
config.json (the export record) and the model card. Checked in the staged folder before it appears, when
transformers and accelerate are installed, by transformers' own GGUF loading (an independent reader):

- its logits on a padded batch equal zoo's reading of the same file (``zoo.read_gguf``) within 1e-4,
  whatever the dtype (names, layouts, metadata and dequantization agree);
- its logits differ from the checkpoint's by at most :data:`TOLERANCE` for f32, f16 and bf16;
- its greedy tokens equal the checkpoint's for f32 and f16. q8_0 and q4_0 trade accuracy by design:
  their logit difference and how many greedy tokens agree are reported, not refused.

Where ``llama-cpp-python`` is installed (it builds llama.cpp from source), llama.cpp itself runs the
staged file too, in a child process (tasks/cli/export/checker.py): its logits on the unpadded prompt are within
:data:`LLAMA_CPP_TOLERANCE` of the checkpoint's (llama.cpp keeps its KV cache in f16, so even an f32 file
moves the logits by f16 rounding) and, for f32 and f16, it decodes the checkpoint's greedy tokens; for
q8_0 and q4_0 the agreement is reported. A llama.cpp that crashes, hangs or cannot be imported leaves the
file written and unchecked (:class:`tasks.cli.export.checker.Unchecked`, exit status 3), or refused with
``checker.unchecked=refuse``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import zoo
from tasks import ZooTask
from tasks.cli.export.checker import RUNTIMES, CheckerFailed, Checking, Unchecked
from tasks.cli.export.hf import masked_diff
from tasks.data.tokenizers import added_around
from tasks.errors import UserError
from zoo.folders import atomic_folder
from zoo.gguf.archs import gemma2_scalar
from zoo.gguf.tokenizer import tokenizer_vocab
from zoo.io import atomic_write_text

FILE = "model.gguf"
PARITY = 1e-4  # transformers' reading of the file against zoo's reading of the same file
TOLERANCE = {"f32": (1e-4, False), "f16": (1e-2, True), "bf16": (5e-2, True)}
"""dtype -> (largest logit difference from the checkpoint, relative to the largest logit): f32 holds the
weights' own numbers; f16 and bf16 round each weight by up to 2^-11 and 2^-8 of it, which moves the
logits by about that fraction times the depth. q8_0 and q4_0 have none (reported)."""
SAME_TOKENS = ("f32", "f16")  # dtypes whose greedy tokens must be the checkpoint's
LLAMA_CPP_TOLERANCE = {"f32": 2e-2, "f16": 3e-2, "bf16": 6e-2}
"""dtype -> largest difference of llama.cpp's logits from the checkpoint's, relative to the largest logit
(measured on zoo's llama, qwen2 and gpt2 exports: at most 0.2% for f32, 0.4% for f16; on qwen3, gemma2,
olmo2 and mixtral f32 exports, tests/test_gguf_families.py: at most 0.12%)."""
NEW_TOKENS = 16
READER_SETTINGS: dict[str, Callable[[zoo.ModelConfig], dict[str, Any]]] = {
    "gpt2": lambda cfg: {"n_positions": cfg.max_seq_len, "n_inner": cfg.resolved_d_ff},
    "qwen3": lambda cfg: {"head_dim": cfg.resolved_head_dim},
    "gemma2": lambda cfg: {
        "attn_logit_softcapping": cfg.attn_softcap,
        "final_logit_softcapping": cfg.final_softcap,
        "query_pre_attn_scalar": gemma2_scalar(cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.resolved_head_dim),
    },
}
"""Config values transformers' GGUF reader does not take from the file (it maps gpt2.context_length and
gpt2.feed_forward_length to keys GPT2Config does not read; it reads no key_length, soft-caps or Gemma 2
score scale), given to ``from_pretrained`` as llama.cpp reads them; everything else transformers reads
from the file itself."""
UNREAD = {
    "olmo2": "transformers' GGUF loading has no olmo2",
    "mixtral": "transformers' GGUF loading reads a llama file with experts as a dense Llama",
}
"""The ARCHS records transformers' GGUF loading cannot read as llama.cpp does: their exports are checked
by llama.cpp alone (where llama-cpp-python is installed), and zoo-export says so."""


@dataclass(frozen=True)
class Checked:
    """What the check found: the logit difference from the checkpoint, and how many of ``tokens``
    greedy tokens (from the first) transformers' reading decodes as the checkpoint does."""

    diff: float
    agree: int
    tokens: int

    def tokens_said(self) -> str:
        if self.agree == self.tokens:
            return "same greedy tokens"
        return f"greedy tokens: the first {self.agree} of {self.tokens} agree"


def require_gguf() -> None:
    """format=gguf needs the ``real`` extra's gguf (llama.cpp's own writer)."""
    if importlib.util.find_spec("gguf") is None:
        raise UserError(
            "format=gguf needs the package gguf (llama.cpp's own reader and writer), which is not "
            'installed; install the real extra: pip install -e ".[real]"'
        )


def gguf_problem(task: ZooTask) -> None:
    """Refuse, in one line naming the component, a task whose model llama.cpp does not compute
    (``zoo.gguf_exportable``), that has a head of its own, or whose tokenizer llama.cpp cannot reproduce."""
    zoo.gguf_exportable(task.model)
    own = [*task.export_modules()] or (["its classifier head"] if task.hf_classifier() is not None else [])
    if own:
        raise UserError(
            f"format=gguf holds a language model alone, not {type(task).__name__}'s own "
            f"{', '.join(own)}; export this run with format=safetensors or format=hf"
        )
    try:
        tokenizer_vocab(task.export_tokenizer(), task.model.config.vocab_size)
    except zoo.ConfigError as error:
        raise zoo.ConfigError(f"format=gguf: the run's {error}") from None


def export_gguf(
    task: ZooTask,
    out: Path,
    dtype: str,
    config: dict[str, Any],
    card: str | None,
    checking: Checking | None = None,
) -> tuple[float, str]:
    """Write ``out`` (model.gguf, config.json last, the card) through ``atomic_folder``, checked in the
    staged folder; the logit difference from the checkpoint and the line zoo-export prints. An Unchecked,
    after the folder took its place, when llama.cpp could not check the file and ``checking`` keeps it."""
    checking = checking or Checking()
    tokenizer, specials = task.export_tokenizer(), task.special_tokens
    before, _ = added_around(tokenizer)
    failed = None
    with atomic_folder(out, merge=True, last=["config.json"]) as stage:
        arch = zoo.to_gguf(
            task.model,
            stage / FILE,
            dtype=dtype,
            tokenizer=tokenizer,
            specials=specials.record(),
            add_bos=specials.bos is not None and before == [specials.bos],
            chat_template=specials.chat_template,
            name=f"zoo {config['task']}",
        )
        atomic_write_text(stage / "config.json", json.dumps(config, indent=2))
        if card is not None:
            atomic_write_text(stage / "README.md", card)
        unread = UNREAD.get(zoo.gguf_exportable(task.model))
        checked = None if unread else check_gguf(task, stage, arch, dtype)
        try:
            by_llama_cpp = check_llama_cpp(task, stage / FILE, dtype, checking, shown=out / FILE)
        except CheckerFailed as crashed:
            by_llama_cpp, failed = None, checking.unchecked(crashed)  # refusing: a UserError, nothing written
    where = f"exported {out}/{FILE} (llama.cpp {arch}, {dtype})"
    if by_llama_cpp is not None:
        where += f"; llama.cpp runs it: max abs diff {by_llama_cpp.diff:.3g}, {by_llama_cpp.tokens_said()}"
    if checked is None:
        why = unread or "transformers' GGUF loading needs transformers and accelerate"
        diff, said = float("nan"), f"{where} (not checked by transformers: {why})"
    else:
        diff = checked.diff
        said = f"{where}; transformers' GGUF reload vs zoo: max abs diff {diff:.3g}, {checked.tokens_said()}"
    if failed is not None:
        raise Unchecked(failed, said=said)
    return diff, said


def check_gguf(task: ZooTask, folder: Path, arch: str, dtype: str) -> Checked | None:
    """transformers' reading of ``folder/model.gguf`` against zoo's reading of it and the checkpoint
    (see the module's docstring); a UserError when one disagrees. None when transformers is not installed."""
    if any(importlib.util.find_spec(package) is None for package in ("transformers", "accelerate")):
        return None
    model = task.model
    theirs = hf_reading(folder, arch, model.config)
    read = zoo.read_gguf(folder / FILE, tokenizer=False).model
    inputs = type(model).example_inputs(model.config)
    mask = inputs["attention_mask"]
    with torch.no_grad():
        want, mine = model(**inputs).float(), read(**inputs).float()
        got = theirs(input_ids=inputs["input_ids"], attention_mask=mask).logits.float()
    parity = masked_diff(mine, got, mask)
    if parity > PARITY:
        raise UserError(
            f"format=gguf: transformers reads the {arch} file as other logits than zoo reads it (max abs "
            f"diff {parity:.3g} > {PARITY}); nothing was written. Please report this composition"
        )
    diff = masked_diff(want, got, mask)
    if dtype in TOLERANCE:
        limit, relative = TOLERANCE[dtype]
        limit *= max(1.0, want.abs().max().item()) if relative else 1.0
        if diff > limit:
            raise UserError(
                f"format=gguf: gguf.dtype={dtype} moves the logits by {diff:.3g} from the checkpoint's "
                f"(more than {limit:.3g}); nothing was written. Choose gguf.dtype=f32"
            )
    prompt = inputs["input_ids"][1:]  # the unpadded row
    steps = NEW_TOKENS if model.max_positions is None else min(NEW_TOKENS, model.max_positions - prompt.shape[1])
    ours = greedy(lambda ids: model(ids, torch.ones_like(ids)), prompt, steps)
    decoded = greedy(lambda ids: theirs(input_ids=ids).logits, prompt, steps)
    return Checked(diff, agreed(ours, decoded, dtype, "transformers' reading of"), steps)


def hf_reading(folder: Path, arch: str, cfg: zoo.ModelConfig) -> Any:
    """transformers' model of ``folder/model.gguf`` in float32 (its own GGUF loading, quietly)."""
    import transformers
    from transformers.utils import logging

    logging.disable_progress_bar()
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:  # its tensor conversion draws a progress bar of its own on stderr
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            return transformers.AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=FILE, dtype=torch.float32, **READER_SETTINGS.get(arch, lambda cfg: {})(cfg)
            ).eval()
    finally:
        logging.set_verbosity(verbosity)


def agreed(ours: list[int], decoded: list[int], dtype: str, reader: str) -> int:
    """How many greedy tokens, from the first, ``reader`` the file decodes as the checkpoint does; a
    UserError where they differ for a dtype that must give the same tokens (:data:`SAME_TOKENS`)."""
    agree = next((i for i, (a, b) in enumerate(zip(ours, decoded, strict=True)) if a != b), len(ours))
    if dtype in SAME_TOKENS and agree < len(ours):
        raise UserError(
            f"format=gguf: {reader} the {dtype} file decodes other greedy tokens than the checkpoint "
            f"({decoded} vs {ours}); nothing was written. Please report this"
        )
    return agree


def greedy(logits_of: Callable[[Tensor], Tensor], prompt: Tensor, steps: int) -> list[int]:
    """``steps`` greedy tokens after the (1, T) ``prompt``, each from a full forward pass of ``logits_of``."""
    ids = prompt
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.cat([ids, logits_of(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)  # (1, T + 1)
    return ids[0, prompt.shape[1] :].tolist()


def check_llama_cpp(task: ZooTask, file: Path, dtype: str, checking: Checking, *, shown: Path) -> Checked | None:
    """llama.cpp's own run of ``file`` (in a child process: ``checking``) against the checkpoint (see the
    module's docstring); a UserError when it disagrees, a CheckerFailed naming ``shown`` when it crashes,
    hangs or cannot be imported. None where ``llama_cpp`` (llama-cpp-python) is not installed."""
    runtime = RUNTIMES["llama.cpp"]
    if not runtime.installed():
        return None
    model = task.model
    prompt = type(model).example_inputs(model.config)["input_ids"][1:]  # (1, T): the unpadded row
    steps = NEW_TOKENS if model.max_positions is None else min(NEW_TOKENS, model.max_positions - prompt.shape[1])
    ran = checking.run(
        runtime, file, shown=shown, prompt=prompt[0].tolist(), steps=steps, threads=torch.get_num_threads()
    )
    theirs, decoded = torch.as_tensor(ran["logits"]).float(), ran["tokens"]  # (T, V), steps ids
    with torch.no_grad():
        want = model(prompt, torch.ones_like(prompt))[0].float()  # (T, V)
    if theirs.shape != want.shape:
        raise UserError(
            f"format=gguf: llama.cpp's run of the {dtype} file gives logits of shape {tuple(theirs.shape)}, not "
            f"{tuple(want.shape)}; nothing was written. Please report this composition"
        )
    diff = (want - theirs).abs().max().item()
    limit = LLAMA_CPP_TOLERANCE.get(dtype)
    if limit is not None and diff > limit * max(1.0, want.abs().max().item()):
        raise UserError(
            f"format=gguf: llama.cpp's run of the {dtype} file gives logits {diff:.3g} from the checkpoint's "
            f"(more than {limit:.0%} of the largest); nothing was written. Please report this composition"
        )
    ours = greedy(lambda ids: model(ids, torch.ones_like(ids)), prompt, steps)
    return Checked(diff, agreed(ours, decoded, dtype, "llama.cpp's run of"), steps)
