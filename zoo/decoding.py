"""How each form generates: next-token logits one step at a time, for ``generate`` (zoo.generation).

A form's class names its strategy (``ZooModel.decoding``, a name in :data:`DECODINGS`, so that building
a model imports no decoding module): a decoder continues a left-padded prompt;
an encoder-decoder encodes a right-padded source once and decodes a target from its start token.
Shapes: B rows (prompts, times beams), T tokens so far, V vocabulary, S source length, D model width,
N the output's width (the input, then room for every new token).

``caching`` chooses how keys and values are kept: None recomputes every step, "dynamic" grows a KV
cache, "static" allocates one of fixed capacity (zoo.kv_cache) and runs each single-token step
through ``torch.compile``. The static step reads the same tensors every time (the new token, the
cache's slots, a padding mask over all of them, each row's count of padding) and no Python number that
changes, so it compiles once per model, batch size and capacity; capacities are rounded up to a
multiple of ``CAPACITY_STEP`` so that prompts of nearby lengths share a compiled step. The first step
(the prompt, of any length) runs eagerly.

Because nothing the static step reads moves, :class:`StaticStep` can capture it on CUDA as a graph and
replay it: one launch per token instead of one per kernel (a small model's decoding is bound by
launches, not by arithmetic). The runner is the same on every device; ``replays_graphs`` says where
the capture happens. The output ids (and a decoder's padding mask) are written into buffers allocated
once, with room for every new token, instead of growing by one column per step.

A static step is built once per model and shape and kept (:func:`kept_step`): its compiled function,
CUDA graph, static cache and input buffers serve every later ``generate`` call with the same batch,
capacity (and, for an encoder-decoder, source bucket); the call empties the cache and copies its own
inputs into the buffers. What is kept for a model is dropped when any of its parameters or buffers
moves, changes dtype or device (the graph reads fixed addresses); weights changed in place (training,
``load_state_dict``) are read by the next replay as they are. An encoder-decoder's static step reads
the encoder output padded to a bucket of source lengths (:func:`source_bucket`, the padding hidden by
the cross-attention mask), so it compiles once per bucket, not once per source length. A capture that
fails is one ``zoo: warning:`` line on stderr (once per process); the step then runs compiled,
without a graph. Decoding with one model from two threads at once is not supported (the buffers are shared).
"""

from __future__ import annotations

import collections
import functools
import itertools
import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from zoo.registry import Registry

if TYPE_CHECKING:
    from zoo.form import ContinuesPrompts, Form, Generates, TranslatesSources
    from zoo.kv_cache import Cache

CAPACITY_STEP = 128  # static caches hold a multiple of this many positions (or the model's limit)
GRAPH_WARMUP = 2  # compiled steps run before a CUDA graph captures the next (the first one compiles)
SOURCE_BUCKET_LEAST = 16  # an encoder-decoder's static step reads sources padded to a power of two, at least this
KEPT_STEPS = 4  # static steps kept per model (each holds its cache: batch x capacity positions per layer)


def static_capacity(model: Generates, positions: int) -> int:
    """The capacity of a static cache that must hold ``positions``: the next multiple of
    ``CAPACITY_STEP``, but no more than the model's positions can number."""
    rounded = -(-positions // CAPACITY_STEP) * CAPACITY_STEP
    limit = model.max_positions
    return rounded if limit is None else max(positions, min(rounded, limit))


def source_bucket(length: int) -> int:
    """How many source positions an encoder-decoder's static step reads for a source ``length`` tokens
    long: the next power of two, at least ``SOURCE_BUCKET_LEAST`` (the rest padding, masked)."""
    return max(SOURCE_BUCKET_LEAST, 1 << (length - 1).bit_length())


@functools.cache
def compiled(step: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``step`` through ``torch.compile`` (one compiled function per step, shared by every call)."""
    return torch.compile(step, dynamic=False)


def replays_graphs(device: torch.device) -> bool:
    """Whether a static step on ``device`` is captured once as a CUDA graph and then replayed: on CUDA
    only. Elsewhere the compiled step runs at every token (a CPU has no graphs, and launches cost it
    little)."""
    return device.type == "cuda"


class StaticStep:
    """A single-token step whose inputs and output stay where they are, so that CUDA can replay it.

    ``step(model, *args)`` returns next-token logits (B, V). ``token`` (B, 1), one of ``args``, is where
    each call writes the new token; everything else the step reaches (weights, the static cache, masks)
    is read or written in place, never replaced, and nothing in it waits for the device. ``buffers``
    holds the tensors a later ``generate`` call refills (``kept_step``). The step runs through
    ``compiled``. With ``graph`` (``replays_graphs``), the first ``GRAPH_WARMUP`` calls run the compiled
    step (compiling it and warming its kernels), the next captures it as a CUDA graph, and every later
    call, in this ``generate`` or a later one, replays that graph; the logits it returns are then the
    graph's own output, which the next call overwrites: read them first. Without ``graph`` every call
    runs the compiled step. A capture that fails is reported once (``capture_failed``) and leaves the
    compiled step to run at every token. The model is held weakly: a kept step does not keep it alive.
    """

    def __init__(
        self,
        step: Callable[..., Tensor],
        model: Generates,
        args: tuple[Any, ...],
        token: Tensor,
        *,
        graph: bool,
        buffers: dict[str, Any] | None = None,
    ) -> None:
        self.step, self.args, self.token = compiled(step), args, token
        self.model = weakref.ref(model)
        self.buffers = buffers or {}
        self.graphs = graph  # still to capture, or captured
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: Tensor | None = None  # the graph's output
        self.calls = 0

    def __call__(self, token: Tensor) -> Tensor:
        """Next-token logits (B, V) after ``token`` (B,)."""
        self.token.copy_(token[:, None])
        self.calls += 1
        if self.graph is not None:
            self.graph.replay()
            return self.logits
        if self.graphs and self.calls > GRAPH_WARMUP:
            return self._capture()
        return self._run()

    def _run(self) -> Tensor:
        return self.step(self.model(), *self.args)

    def _capture(self) -> Tensor:
        """Capture the step as a CUDA graph, then replay it for this call (a capture runs nothing)."""
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                logits = self._run()
        except RuntimeError as error:
            self.graphs = False
            capture_failed(error)
            return self._run()
        self.graph, self.logits = graph, logits
        graph.replay()
        return logits


_told_capture_failed = False


def capture_failed(error: BaseException) -> None:
    """Say once per process, in one line on stderr, that decoding runs without CUDA graphs and why.
    (The GPU tests replace this function with one that raises: there a failed capture is an error.)"""
    global _told_capture_failed
    if _told_capture_failed:
        return
    _told_capture_failed = True
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    print(
        f"zoo: warning: generate(compile=True) could not capture its step as a CUDA graph ({reason}); "
        "it runs the compiled step at every token, slower",
        file=sys.stderr,
    )


class _Kept:
    """The static steps kept for one model, most recently used last, valid while its tensors stay put."""

    def __init__(self, fingerprint: tuple[Any, ...]) -> None:
        self.fingerprint = fingerprint
        self.steps: collections.OrderedDict[tuple[Any, ...], StaticStep] = collections.OrderedDict()


_KEPT: weakref.WeakKeyDictionary[Any, _Kept] = weakref.WeakKeyDictionary()


def _fingerprint(model: Generates) -> tuple[Any, ...]:
    """Where and how every parameter and buffer of ``model`` is stored: what a CUDA graph reads."""
    tensors = itertools.chain(model.parameters(), model.buffers())
    return tuple((t.data_ptr(), t.dtype, t.device) for t in tensors)


def kept_step(model: Generates, key: tuple[Any, ...], build: Callable[[], StaticStep]) -> StaticStep:
    """The static step kept for ``model`` under ``key`` (what its shapes depend on), built by ``build``
    the first time; at most ``KEPT_STEPS`` per model, the least recently used dropped first. Every
    kept step is dropped when a parameter or buffer of the model has moved or changed dtype or device."""
    fingerprint = _fingerprint(model)
    kept = _KEPT.get(model)
    if kept is None or kept.fingerprint != fingerprint:
        kept = _KEPT[model] = _Kept(fingerprint)
    step = kept.steps.pop(key, None)
    kept.steps[key] = step = build() if step is None else step
    while len(kept.steps) > KEPT_STEPS:
        kept.steps.popitem(last=False)
    return step


def forget_steps(model: Generates) -> None:
    """Drop every static step kept for ``model`` (and the memory its caches and graphs hold)."""
    _KEPT.pop(model, None)


class Steps:
    """The decoding loop's view of a model: logits for the first step, then for each chosen token.
    ``ids`` (B, T) is the output so far, held in a buffer with room for every new token; ``reorder``
    follows the beams that beam search keeps."""

    left_pad: ClassVar[bool]  # prompts of different lengths are padded on the left (else the right)
    prompt: ClassVar[str]  # what the input is called in messages ("prompt", "source")
    holds: ClassVar[str]  # what the output holds before the new tokens, in messages

    tokens: Tensor  # (B, N): the output in its first ``length`` columns
    length: int

    def _hold(self, ids: Tensor, max_new: int) -> None:
        """Start the output with ``ids`` (B, T), with room for ``max_new`` more tokens."""
        self.tokens = ids.new_empty(ids.shape[0], ids.shape[1] + max_new)
        self.tokens[:, : ids.shape[1]] = ids
        self.length = ids.shape[1]

    @property
    def ids(self) -> Tensor:
        """The output so far, (B, T): a view of the output buffer."""
        return self.tokens[:, : self.length]

    @classmethod
    def held(cls, width: int) -> int:
        """How many tokens the output holds before the new ones, for inputs ``width`` tokens wide."""
        raise NotImplementedError

    def first(self) -> Tensor:
        """Next-token logits (B, V) after the input."""
        raise NotImplementedError

    def record(self, token: Tensor) -> None:
        """Append ``token`` (B,) to ``ids`` without a step (the last token, or one whose logits are not needed)."""
        self.tokens[:, self.length] = token
        self.length += 1

    def next(self, token: Tensor) -> Tensor:
        """Append ``token`` (B,) to ``ids``; next-token logits (B, V) after it. With a static cache on CUDA
        they are a graph's output (``StaticStep``): read them before the next call."""
        raise NotImplementedError

    def reorder(self, index: Tensor) -> None:
        """Keep the rows ``index`` (B,) of everything held per row; what a static step reads, in place."""
        raise NotImplementedError

    def history(self) -> tuple[Tensor, Tensor | None]:
        """What the repeat controls (zoo.logits) read as each row's sequence so far: ids (B, T) and a
        mask (B, T), 1 = token, 0 = padding; None when nothing is padding."""
        raise NotImplementedError

    def output(self) -> Tensor:
        return self.ids


def _decoder_logits(
    model: ContinuesPrompts,
    ids: Tensor,
    mask: Tensor | None,
    positions: Tensor | None,
    prefix_len: int | None,
    cache: Cache | None,
) -> Tensor:
    """Next-token logits (B, V) after ``ids`` (B, T)."""
    hidden = model.features(ids, mask, position_ids=positions, prefix_len=prefix_len, cache=cache)  # (B, T, D)
    return model.logits(hidden[:, -1])


def _decoder_step(
    model: ContinuesPrompts,
    token: Tensor,
    cache: Cache,
    keys_mask: Tensor | None,
    pads: Tensor | None,
    prefix_len: int | None,
) -> Tensor:
    """Next-token logits (B, V) after ``token`` (B, 1), whose position is the cache's offset less the
    row's ``pads`` (B, 1) padding tokens (None: no padding); the step compiled for a static cache."""
    positions = None if pads is None else cache.offset - pads  # (B, 1), counted over real tokens
    return _decoder_logits(model, token, keys_mask, positions, prefix_len, cache)


def _decoder_start(
    model: TranslatesSources, ids: Tensor, cache: Cache | None, memory: Tensor, src_mask: Tensor | None
) -> Tensor:
    """Next-token logits (B, V) after the target ``ids`` (B, T); the decoder's step, compiled for a
    static cache (whose cross-attention already holds the encoder's keys and values)."""
    hidden = model.decoder_features(ids, memory, src_mask, cache=cache)  # (B, T, D)
    return model.logits(hidden[:, -1])


DECODINGS: Registry[type[Steps]] = Registry("decoding")  # the strategies a form names (ZooModel.decoding)
DECODINGS.bind(Steps)


def steps_of(form: type[Form]) -> type[Steps] | None:
    """How ``form`` decodes (its ``decoding``); None for a form that does not generate."""
    return None if form.decoding is None else DECODINGS.get(form.decoding)


@DECODINGS.register("decoder")
class DecoderSteps(Steps):
    """Next-token logits for a decoder-only model, one step at a time: the output is the left-padded
    prompt and its continuation.

    An unpadded batch passes neither mask nor positions, so the stack takes its fast paths (no mask
    tensor, positions from the cache length); only the last position goes through the LM head. A
    padded batch keeps its mask in a buffer as wide as the output (a static cache's: as its capacity),
    whose columns after the prompt are 1; a static step reads all of it (the slots after the query
    count as tokens: the causal mask hides each until it is written), a growing cache the columns so far.
    """

    left_pad = True
    prompt = "prompt"
    holds = "the prompt"

    @classmethod
    def held(cls, width: int) -> int:
        return width

    def __init__(self, model: ContinuesPrompts, ids: Tensor, mask: Tensor, caching: str | None, max_new: int) -> None:
        self.model, self.caching = model, caching
        B, T = ids.shape
        self._hold(ids, max_new)
        self.padded = not bool(mask.all())
        self.prefix_len = T if model.needs_prefix_len else None  # the prompt
        self.cache: Cache | None = None
        self.static: StaticStep | None = None
        if caching == "static":  # the kept step's buffers, refilled: (B, capacity) mask, (B, 1) pads
            self.static = self._static_step(ids, mask)
            self.cache, self.masks, self.pads = (self.static.buffers[k] for k in ("cache", "masks", "pads"))
            self.cache.reset()
            self.masks.fill_(1)
        else:
            self.cache = model.new_cache(T + max_new) if caching == "dynamic" else None
            self.masks = torch.ones(B, T + max_new, dtype=mask.dtype, device=mask.device)  # (B, N)
            self.pads = ids.new_zeros(B, 1) if self.padded else None
        self.masks[:, :T] = mask
        if self.pads is not None:
            self.pads.copy_(T - mask.sum(-1, keepdim=True))  # (B, 1): each row's padding

    def _static_step(self, ids: Tensor, mask: Tensor) -> StaticStep:
        """The static step kept for this model, batch, capacity and padding (``kept_step``)."""
        model, B = self.model, ids.shape[0]
        capacity = static_capacity(model, self.tokens.shape[1])  # the prompt and every new token
        graph = replays_graphs(ids.device)

        def build() -> StaticStep:
            cache = model.new_cache(capacity, static=True)
            masks = torch.ones(B, capacity, dtype=mask.dtype, device=mask.device)  # (B, capacity)
            pads = ids.new_zeros(B, 1) if self.padded else None
            token = ids.new_zeros(B, 1)
            args = (token, cache, masks if self.padded else None, pads, self.prefix_len)
            buffers = {"cache": cache, "masks": masks, "pads": pads}
            return StaticStep(_decoder_step, model, args, token, graph=graph, buffers=buffers)

        key = ("decoder", B, capacity, self.padded, self.prefix_len, model.kv_dtype, mask.dtype, graph)
        return kept_step(model, key, build)

    @property
    def mask(self) -> Tensor:
        """(B, T) 1 = token, 0 = padding, over the output so far."""
        return self.masks[:, : self.length]

    def first(self) -> Tensor:
        keys_mask = None
        if self.padded:
            keys_mask = self.masks if self.caching == "static" else self.mask
        positions = (self.mask.cumsum(-1) - 1).clamp(min=0) if self.padded else None  # (B, T) over real tokens
        return _decoder_logits(self.model, self.ids, keys_mask, positions, self.prefix_len, self.cache)

    def next(self, token: Tensor) -> Tensor:
        self.record(token)
        if self.caching is None:
            return self.first()
        if self.static is not None:
            return self.static(token)
        keys_mask = self.mask if self.padded else None  # (B, T): what the growing cache holds, and the token
        return _decoder_step(self.model, token[:, None], self.cache, keys_mask, self.pads, self.prefix_len)

    def history(self) -> tuple[Tensor, Tensor | None]:
        return self.ids, self.mask if self.padded else None  # the prompt and its continuation, no padding

    def reorder(self, index: Tensor) -> None:
        self.tokens = self.tokens[index]
        self.masks.copy_(self.masks[index])
        if self.pads is not None:
            self.pads.copy_(self.pads[index])
        if self.cache is not None:
            self.cache.reorder(index)


@DECODINGS.register("encoder_decoder")
class EncoderDecoderSteps(Steps):
    """Next-token logits for an encoder-decoder: encode the right-padded source once, then decode
    step by step; the output is the target, from ``decoder_start_token_id``."""

    left_pad = False
    prompt = "source"
    holds = "the start token"

    @classmethod
    def held(cls, width: int) -> int:
        return 1

    def __init__(
        self, model: TranslatesSources, src: Tensor, src_mask: Tensor, caching: str | None, max_new: int
    ) -> None:
        self.model, self.caching = model, caching
        self.src_mask = None if bool(src_mask.all()) else src_mask  # None: no padding to mask at any step
        self.memory = model.encode(src, self.src_mask)  # (B, S, D)
        start = model.config.decoder_start_token_id
        self._hold(torch.full((src.shape[0], 1), start, dtype=torch.long, device=src.device), max_new)
        self.cache: Cache | None = None
        self.static: StaticStep | None = None
        if caching == "static":  # the memory padded to its bucket, (B, S'), in the kept step's buffers
            self.static = self._static_step(max_new)
            self.cache, memory, mask = (self.static.buffers[k] for k in ("cache", "memory", "src_mask"))
            self.cache.reset()
            S = src.shape[1]
            memory.zero_()[:, :S] = self.memory
            mask.zero_()[:, :S] = src_mask
            self.memory, self.src_mask = memory, mask
        elif caching == "dynamic":
            self.cache = model.new_cache(max_new + 1)

    def _static_step(self, max_new: int) -> StaticStep:
        """The static step kept for this model, batch, capacity and source bucket (``kept_step``)."""
        model, (B, S, D) = self.model, self.memory.shape
        capacity, bucket = static_capacity(model, max_new + 1), source_bucket(S)
        graph = replays_graphs(self.memory.device)

        def build() -> StaticStep:
            cache = model.new_cache(capacity, static=True)
            memory = self.memory.new_zeros(B, bucket, D)  # (B, S', D)
            mask = torch.zeros(B, bucket, dtype=torch.long, device=self.memory.device)  # (B, S')
            token = self.tokens.new_zeros(B, 1)
            buffers = {"cache": cache, "memory": memory, "src_mask": mask}
            return StaticStep(_decoder_start, model, (token, cache, memory, mask), token, graph=graph, buffers=buffers)

        key = ("encoder_decoder", B, capacity, bucket, model.kv_dtype, self.memory.dtype, graph)
        return kept_step(model, key, build)

    def first(self) -> Tensor:
        return _decoder_start(self.model, self.ids, self.cache, self.memory, self.src_mask)

    def next(self, token: Tensor) -> Tensor:
        self.record(token)
        if self.caching is None:
            return _decoder_start(self.model, self.ids, None, self.memory, self.src_mask)
        if self.static is not None:
            return self.static(token)
        return _decoder_start(self.model, token[:, None], self.cache, self.memory, self.src_mask)

    def history(self) -> tuple[Tensor, Tensor | None]:
        return self.ids[:, 1:], None  # the target after its start token (often the pad token)

    def reorder(self, index: Tensor) -> None:
        self.tokens = self.tokens[index]
        self.memory.copy_(self.memory[index])
        if self.src_mask is not None:
            self.src_mask.copy_(self.src_mask[index])
        if self.cache is not None:
            self.cache.reorder(index)
